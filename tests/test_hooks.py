"""Every hook is documented and has a test named test_hook_<name> here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import click
import pytest
import torch

import perfsdk
from perfsdk import hookspecs
from perfsdk.plugins import collect_hardware, collect_registry, get_plugin_manager
from perfsdk.testing import build_tiny_causal_lm

DOCS = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"
HOOKS = sorted(n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("perfsdk_"))


def test_every_hook_is_documented():
    text = DOCS.read_text()
    for name in HOOKS:
        assert re.search(rf"^### `{name}\(", text, re.M), f"{name} is not documented in docs/hooks.md"
        assert hookspecs.__dict__[name].__doc__, f"{name} has no docstring"


CONTRACT = ["result_of", "key_columns", "title", "summary_rows", "summary_tables", "report_section",
            "compare_metrics", "metric_samples", "metric_value", "rank_payload", "merge_ranks"]


def test_every_contract_point_is_documented():
    import perfsdk

    text = DOCS.read_text()
    for name in CONTRACT:
        assert hasattr(perfsdk.Collector, name), name
        assert re.search(rf"^### `Collector\.{name}\b", text, re.M), f"Collector.{name} is not documented in docs/hooks.md"
    assert re.search(r"^### `perfsdk\.register_plugin\(", text, re.M)


def test_every_hook_has_a_test():
    tests = {n for n in globals() if n.startswith("test_hook_")}
    missing = [h for h in HOOKS if f"test_hook_{h}" not in tests]
    assert not missing, f"hooks without a test_hook_<name> test: {missing}"


def test_hookspecs_module_docstring_states_call_order():
    doc = hookspecs.__doc__ or ""
    positions = [doc.index(h) for h in ("perfsdk_session_start", "perfsdk_load", "perfsdk_tokenize",
                                        "perfsdk_before_generate", "perfsdk_after_generate", "perfsdk_finalize")]
    assert positions == sorted(positions)


def test_typo_in_hook_name_fails_loudly():
    class Typo(perfsdk.Collector):
        name = "typo"

        @perfsdk.hookimpl
        def perfsdk_finalise(self, session: Any) -> None:  # British spelling: not a hook
            return None

    with pytest.raises(Exception, match="perfsdk_finalise"):
        perfsdk.session(store=None, collectors=[Typo])


# -- discovery hooks --------------------------------------------------------------------------

class _Plugin:
    """A module-like plugin object implementing the discovery hooks."""

    class Thing(perfsdk.Collector):
        name = "thing"

    class Tsv(perfsdk.Exporter):
        name = "tsv"
        extension = "tsv"

        def export(self, runs, stream):
            stream.write("\n".join(r.run_id for r in runs))
            return True

    @perfsdk.hookimpl
    def perfsdk_register_collectors(self, register):
        register(self.Thing)

    @perfsdk.hookimpl
    def perfsdk_register_exporters(self, register):
        register(self.Tsv)

    @perfsdk.hookimpl
    def perfsdk_register_hardware(self, register):
        register({"name": "my-accel"})

    @perfsdk.hookimpl
    def perfsdk_register_commands(self, cli):
        @cli.command("hello-plugin")
        def hello() -> None:
            click.echo("hello from a plugin")


def test_hook_perfsdk_register_collectors():
    reg = collect_registry(get_plugin_manager(extra_plugins=[_Plugin()]))
    assert reg.collectors["thing"] is _Plugin.Thing
    assert reg.collectors["latency"].__name__ == "LatencyCollector"  # built-ins use the same hook


def test_hook_perfsdk_register_collectors_rejects_duplicates_and_non_collectors():
    class Dup:
        @perfsdk.hookimpl
        def perfsdk_register_collectors(self, register):
            class Latency2(perfsdk.Collector):
                name = "latency"

            register(Latency2)

    with pytest.raises(perfsdk.plugins.PluginError, match="'latency' already registered"):
        collect_registry(get_plugin_manager(extra_plugins=[Dup()]))

    class NotOne:
        @perfsdk.hookimpl
        def perfsdk_register_collectors(self, register):
            register(object)

    with pytest.raises(perfsdk.plugins.PluginError, match="expects a perfsdk.Collector"):
        collect_registry(get_plugin_manager(extra_plugins=[NotOne()]))


def test_hook_perfsdk_register_exporters():
    reg = collect_registry(get_plugin_manager(extra_plugins=[_Plugin()]))
    assert reg.exporters["tsv"] is _Plugin.Tsv
    assert {"csv", "json", "jsonl", "markdown", "parquet"} <= set(reg.exporters)


def test_hook_perfsdk_register_backends(tmp_path):
    """A third-party backend, registered through the hook, runs the workload of a config that
    names it, and every collector sees its requests."""
    from perfsdk.backends import Backend
    from perfsdk.models.runner import run_workload

    class Echo(Backend):
        name = "echo"
        description = "answers every request with 3 tokens, 1 ms apart"
        in_process = False

        def load(self, session):
            return None, None

        def run_workload(self, session, progress=None):
            with session.measured_load():
                for n_in in (4, 6):
                    step = session.begin_request(input_tokens=n_in, scheduled_ns=session.clock.now_ns())
                    step.token_times_ns = [step.start_ns + k * 1_000_000 for k in (1, 2, 3)]
                    step.output_tokens = [3]
                    step.end_ns = step.token_times_ns[-1]
                    session.end_request(step)

    class EchoPlugin:
        @perfsdk.hookimpl
        def perfsdk_register_backends(self, register):
            register(Echo)

    reg = collect_registry(get_plugin_manager(extra_plugins=[EchoPlugin()]))
    assert reg.backends["echo"] is Echo and {"transformers", "openai"} <= set(reg.backends)
    cfg = {"model": {"backend": "echo"}, "collectors": {"utilization": False, "energy": False}}
    with perfsdk.session(cfg, store=None, plugins=[EchoPlugin()]) as s:
        run_workload(s)
    lat = s.result.collectors["latency"]
    assert lat["requests"] == 2 and lat["input_tokens"] == 10 and lat["output_tokens"] == 6
    assert lat["ttft_s"]["p50"] == 0.001 and lat["itl_s"]["count"] == 4
    from perfsdk.plugins import plugin_inventory

    rows = {r["name"]: r for r in plugin_inventory(get_plugin_manager(), include_builtin=True)}
    assert rows["perfsdk.backends.openai"]["backends"] == ["openai"]
    assert rows["perfsdk.backends.transformers"]["backends"] == ["transformers"]
    with pytest.raises(perfsdk.ConfigError, match="model.backend: unknown backend 'ecko'"):
        from perfsdk.backends import backend_for

        backend_for(perfsdk.Config(model={"backend": "ecko"}), reg)


def test_hook_perfsdk_register_hardware():
    hw = collect_hardware(get_plugin_manager(extra_plugins=[_Plugin()]))
    assert any(isinstance(p, dict) and p.get("name") == "my-accel" for _, p in hw)


def test_hook_perfsdk_register_commands():
    from click.testing import CliRunner

    group = click.Group("perfsdk-test")
    pm = get_plugin_manager(extra_plugins=[_Plugin()])
    pm.hook.perfsdk_register_commands(cli=group)
    r = CliRunner().invoke(group, ["hello-plugin"])
    assert r.output.strip() == "hello from a plugin"


# -- session plugins ----------------------------------------------------------------------------

class _SessionPlugin:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @perfsdk.hookimpl
    def perfsdk_session_configure(self, session):
        self.calls.append("configure")
        session.tags["configured_by"] = "test"

    @perfsdk.hookimpl
    def perfsdk_session_result(self, session, result):
        self.calls.append("result")
        return result.model_copy(update={"tags": {**result.tags, "seen_steps": str(len(session.steps))}})


def test_hook_perfsdk_session_configure():
    plugin = _SessionPlugin()
    with perfsdk.session(store=None, plugins=[plugin]) as s:
        assert plugin.calls == ["configure"]  # at set-up, before any model work
        s.record("x", 1)
    assert s.result is not None and s.result.tags["configured_by"] == "test"
    # the built-in distributed support is such a plugin: every session has its rank
    assert s.rank_info is not None and s.rank_info.world_size == 1


def test_hook_perfsdk_session_result():
    plugin = _SessionPlugin()
    model = build_tiny_causal_lm()
    ids = torch.tensor([[5, 6, 7]])
    with perfsdk.session(store=None, plugins=[plugin]) as s:
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2)
    assert plugin.calls == ["configure", "result"]
    assert s.result is not None and s.result.tags["seen_steps"] == "1"

    class Broken:
        @perfsdk.hookimpl
        def perfsdk_session_result(self, session, result):
            raise RuntimeError("cannot post-process")

    with perfsdk.session(store=None, plugins=[Broken()]) as s2:
        pass
    assert s2.result is not None and s2.result.status == "partial"
    assert any(e.hook == "perfsdk_session_result" and "cannot post-process" in e.message for e in s2.result.errors)


# -- lifecycle hooks --------------------------------------------------------------------------

class Recorder(perfsdk.Collector):
    """Records every lifecycle call with the arguments that matter."""

    name = "recorder"
    calls: list[tuple[Any, ...]] = []

    @perfsdk.hookimpl
    def perfsdk_session_start(self, session):
        self.calls.append(("session_start", session.run_id))

    @perfsdk.hookimpl
    def perfsdk_load(self, session, event):
        self.calls.append(("load", event.source, type(event.model).__name__, event.load_s))

    @perfsdk.hookimpl
    def perfsdk_tokenize(self, session, event):
        self.calls.append(("tokenize", tuple(event.token_counts)))

    @perfsdk.hookimpl
    def perfsdk_before_generate(self, session, step):
        self.calls.append(("before", step.kind, step.index, step.batch_size, tuple(step.input_tokens), step.end_ns))

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session, step):
        self.calls.append(("after", step.kind, step.index, tuple(step.output_tokens or ()), len(step.token_times_ns),
                           step.end_ns is not None))

    @perfsdk.hookimpl
    def perfsdk_window_open(self, session, window):
        self.calls.append(("open", window.name))

    @perfsdk.hookimpl
    def perfsdk_window_close(self, session, window):
        self.calls.append(("close", window.name, window.end_ns is not None and window.end_ns >= window.start_ns))

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session):
        self.calls.append(("finalize",))
        return None


class _Tok:
    """A minimal tokenizer: one token per whitespace-separated word."""

    pad_token = "<pad>"
    padding_side = "left"

    def __call__(self, prompts, return_tensors="pt", padding=True, padding_side="left"):
        from transformers import BatchEncoding

        lens = [len(p.split()) for p in prompts]
        width = max(lens)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, n in enumerate(lens):
            ids[i, width - n:] = torch.arange(3, 3 + n)
            mask[i, width - n:] = 1
        return BatchEncoding({"input_ids": ids, "attention_mask": mask})


@pytest.fixture(scope="module")
def lifecycle_calls():
    Recorder.calls = []
    model = build_tiny_causal_lm()
    with perfsdk.session(store=None, collectors=[Recorder]) as s:
        s.load(model=model, tokenizer=_Tok())
        batch = s.tokenize(s.tokenizer, ["a b c", "a b c d e"])
        s.generate(model, **batch, max_new_tokens=3, eos_token_id=999)
        s.forward(model, **batch)
        with s.stage("post"):
            pass
    return list(Recorder.calls), s


def test_hook_perfsdk_session_start(lifecycle_calls):
    calls, s = lifecycle_calls
    assert calls[0] == ("session_start", s.run_id)


def test_hook_perfsdk_load(lifecycle_calls):
    calls, _ = lifecycle_calls
    assert ("load", "adopted", "LlamaForCausalLM", 0.0) in calls


def test_hook_perfsdk_tokenize(lifecycle_calls):
    calls, _ = lifecycle_calls
    assert ("tokenize", (3, 5)) in calls


def test_hook_perfsdk_before_generate(lifecycle_calls):
    calls, _ = lifecycle_calls
    befores = [c for c in calls if c[0] == "before"]
    assert befores == [("before", "generate", 0, 2, (3, 5), None), ("before", "forward", 1, 2, (3, 5), None)]


def test_hook_perfsdk_after_generate(lifecycle_calls):
    calls, _ = lifecycle_calls
    afters = [c for c in calls if c[0] == "after"]
    assert afters == [("after", "generate", 0, (3, 3), 3, True), ("after", "forward", 1, (), 0, True)]


def test_hook_perfsdk_window_open(lifecycle_calls):
    calls, _ = lifecycle_calls
    opens = [c[1] for c in calls if c[0] == "open"]
    assert opens == ["session", "step:0", "prefill", "decode", "step:1", "stage:post"]


def test_hook_perfsdk_window_close(lifecycle_calls):
    calls, _ = lifecycle_calls
    closes = [c for c in calls if c[0] == "close"]
    assert [c[1] for c in closes] == ["prefill", "decode", "step:0", "step:1", "stage:post", "session"]
    assert all(c[2] for c in closes)


def test_hook_perfsdk_finalize(lifecycle_calls):
    calls, s = lifecycle_calls
    assert calls[-1] == ("finalize",)
    # order of the whole lifecycle
    kinds = [c[0] for c in calls]
    assert kinds.index("session_start") < kinds.index("load") < kinds.index("tokenize") < kinds.index("before")
    assert kinds.index("after") < kinds.index("finalize")
    assert s.result.status == "ok"


def test_latency_hooks_sit_closest_to_the_call():
    pm = get_plugin_manager()
    from perfsdk.collectors.latency import LatencyCollector

    assert LatencyCollector.perfsdk_before_generate.perfsdk_impl["trylast"] is True
    assert LatencyCollector.perfsdk_after_generate.perfsdk_impl["tryfirst"] is True
    del pm


def test_broken_discovery_hook_does_not_break_a_session():
    class Broken:
        @perfsdk.hookimpl
        def perfsdk_register_collectors(self, register):
            raise ImportError("missing optional dependency of a third-party plugin")

    with perfsdk.session(store=None, plugins=[Broken()]) as s:
        pass
    assert s.result.status == "partial"
    err = s.result.errors[0]
    assert err.hook == "discovery" and "missing optional dependency" in err.message
    assert "latency" in s.result.collectors
    with pytest.raises(ImportError):
        collect_registry(get_plugin_manager(extra_plugins=[Broken()]))

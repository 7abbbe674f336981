"""The session: token counts, timestamps, warm-up, stages, records, isolation, failures."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import perfsdk
from perfsdk.session import count_output_tokens
from perfsdk.testing import build_tiny_causal_lm


@pytest.fixture(scope="module")
def model():
    return build_tiny_causal_lm()


def _batch(lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded batch with the given real lengths (pad id 0, tokens 3..250)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(3, 250, (n,), generator=g)
        mask[i, width - n:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def test_count_output_tokens_stops_at_first_eos():
    rows = [[5, 7], [2, 8], [0, 2], [0, 0]]  # position k, request i; eos = 2
    assert count_output_tokens(rows, 2, {2}) == [2, 3]
    assert count_output_tokens(rows, 2, set()) == [4, 4]


def test_generate_timestamps_and_real_token_counts(model):
    batch = _batch([5, 9, 7])
    with perfsdk.session(store=None) as s:
        s.load(model=model)
        with s.warmup():
            s.generate(model, **batch, max_new_tokens=3, eos_token_id=999)
        s.generate(model, **batch, max_new_tokens=6, eos_token_id=999)
    steps = s.steps
    assert [st.warmup for st in steps] == [True, False]
    st = steps[1]
    assert st.input_tokens == [5, 9, 7]  # padding excluded
    assert st.output_tokens == [6, 6, 6]
    assert len(st.token_times_ns) == 6
    assert st.start_ns < st.token_times_ns[0] <= st.token_times_ns[-1] <= st.end_ns
    assert all(b >= a for a, b in zip(st.token_times_ns, st.token_times_ns[1:]))
    lat = s.result.collectors["latency"]
    assert lat["steps"] == 1 and lat["warmup_steps"] == 1
    assert lat["requests"] == 3 and lat["output_tokens"] == 18 and lat["input_tokens"] == 21
    assert lat["ttft_s"]["count"] == 3 and lat["tpot_s"]["count"] == 3
    assert lat["itl_s"]["count"] == 3 * 5  # 5 gaps per request of 6 tokens
    ttft = (st.token_times_ns[0] - st.start_ns) / 1e9
    e2e = (st.token_times_ns[5] - st.start_ns) / 1e9
    assert lat["ttft_s"]["p50"] == pytest.approx(ttft)
    assert lat["tpot_s"]["p50"] == pytest.approx((e2e - ttft) / 5)
    assert lat["output_tokens_per_s"] == pytest.approx(18 / ((st.end_ns - st.start_ns) / 1e9))


def test_generation_stops_counted_at_eos(model):
    batch = _batch([6, 6], seed=3)
    out = model.generate(**batch, max_new_tokens=8, do_sample=False, eos_token_id=999, pad_token_id=0)
    new = out[:, 6:].tolist()
    eos = new[0][3]  # request 0's fourth token becomes EOS
    expected = []
    for row in new:
        expected.append(row.index(eos) + 1 if eos in row else 8)
    with perfsdk.session(store=None) as s:
        s.load(model=model)
        s.generate(model, **batch, max_new_tokens=8, eos_token_id=eos, pad_token_id=0)
    assert s.steps[0].output_tokens == expected
    assert expected[0] <= 4
    lat = s.result.collectors["latency"]
    assert lat["output_tokens"] == sum(expected)
    assert lat["eos_stopped_requests"] == sum(1 for n in expected if n < 8)


def test_forward_on_plain_module():
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    x = torch.randn(5, 8)
    with perfsdk.session(store=None) as s:
        s.load(model=net)
        for _ in range(3):
            y = s.forward(net, x)
    assert y.shape == (5, 4)
    lat = s.result.collectors["latency"]
    assert lat["forward_s"]["count"] == 3
    assert lat["requests"] == 15
    assert s.result.model.parameters == 8 * 4 + 4
    assert s.result.model.weights_bytes == (8 * 4 + 4) * 4


def test_stages_records_and_windows(model):
    with perfsdk.session(store=None) as s:
        s.load(model=model)
        with s.stage("encode"):
            s.generate(model, **_batch([4]), max_new_tokens=2, eos_token_id=999)
        with s.stage("encode"):
            pass
        s.record("accuracy", 0.75, unit="ratio")
        s.record("label", "ok")
    names = [w.name for w in s.windows]
    assert names.count("stage:encode") == 2
    assert names[:1] == ["session"]
    assert {"step:0", "prefill", "decode"} <= set(names)
    stage = next(w for w in s.windows if w.name == "stage:encode")
    step = next(w for w in s.windows if w.name == "step:0")
    assert step.parent is stage
    assert s.result.collectors["latency"]["stages"]["encode"]["count"] == 2
    assert [(r.name, r.value, r.unit) for r in s.result.records] == [("accuracy", 0.75, "ratio"), ("label", "ok", None)]
    with pytest.raises(ValueError):
        with perfsdk.session(store=None) as s2:
            with s2.stage("bad:name"):
                pass


class Exploding(perfsdk.Collector):
    name = "exploding"

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        raise RuntimeError("boom in after_generate")

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> None:
        raise ValueError("boom in finalize")


def test_failing_collector_is_isolated(model, tmp_path):
    with perfsdk.session({"name": "iso"}, collectors=[Exploding], store=tmp_path) as s:
        s.load(model=model)
        s.generate(model, **_batch([4]), max_new_tokens=3, eos_token_id=999)
    r = s.result
    assert r.status == "partial"
    assert {(e.source, e.hook) for e in r.errors} == {("exploding", "perfsdk_after_generate"), ("exploding", "perfsdk_finalize")}
    assert r.collectors["latency"]["output_tokens"] == 3  # others intact
    assert "exploding" not in r.collectors
    assert perfsdk.Store(tmp_path).get(r.run_id).status == "partial"


class BadResult(perfsdk.Collector):
    name = "badresult"

    class Result(perfsdk.CollectorResult):
        value_s: float

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> dict[str, Any]:
        return {"value_s": "not a number"}


def test_invalid_result_recorded_not_stored(model):
    with perfsdk.session(store=None, collectors=[BadResult]) as s:
        s.load(model=model)
    assert "badresult" not in s.result.collectors
    assert s.result.errors[0].source == "badresult"
    assert "validation" in s.result.errors[0].message
    assert s.result.status == "partial"


def test_user_exception_saves_failed_run_and_reraises(model, tmp_path):
    with pytest.raises(KeyError):
        with perfsdk.session({"name": "fails"}, store=tmp_path) as s:
            s.load(model=model)
            s.generate(model, **_batch([4]), max_new_tokens=2, eos_token_id=999)
            raise KeyError("user bug")
    stored = perfsdk.Store(tmp_path).get(s.result.run_id)
    assert stored.status == "failed"
    assert stored.errors[-1].source == "user" and stored.errors[-1].type == "KeyError"
    assert "user bug" in (stored.errors[-1].traceback or "")
    assert stored.collectors["latency"]["output_tokens"] == 2  # data so far kept


def test_exception_inside_generate_still_runs_after_hooks(model):
    seen = []

    class Watcher(perfsdk.Collector):
        name = "watcher"

        @perfsdk.hookimpl
        def perfsdk_after_generate(self, session: Any, step: Any) -> None:
            seen.append(type(step.error).__name__)

    with pytest.raises((TypeError, ValueError)):
        with perfsdk.session(store=None, collectors=[Watcher]) as s:
            s.load(model=model)
            s.generate(model, **_batch([3]), max_new_tokens=2, not_a_generate_kwarg_at_all=object())
    assert seen and seen[0] in ("ValueError", "TypeError")
    assert s.result.status == "failed"


def test_session_without_config_or_model_work():
    with perfsdk.session(store=None) as s:
        pass
    assert s.result.status == "ok"
    assert s.result.collectors["latency"]["steps"] == 0
    assert s.result.environment.python


def test_unknown_collector_and_bad_collector_settings():
    with pytest.raises(perfsdk.ConfigError, match=r"collectors\.nope: unknown collector \(available: .*latency"):
        perfsdk.session({"collectors": {"nope": {}}}, store=None)
    with pytest.raises(perfsdk.ConfigError, match=r"collectors\.memory\.interval_s"):
        perfsdk.session({"collectors": {"memory": {"interval_s": -1}}}, store=None)
    with pytest.raises(perfsdk.ConfigError, match=r"collectors\.latency\.bogus: unknown key"):
        perfsdk.session({"collectors": {"latency": {"bogus": 1}}}, store=None)


def test_disable_default_collector():
    with perfsdk.session({"collectors": {"memory": False}}, store=None) as s:
        pass
    assert "memory" not in s.result.collectors
    assert "latency" in s.result.collectors


def test_memory_collector_values(model):
    with perfsdk.session(store=None) as s:
        s.load(model=model)
        s.generate(model, **_batch([5, 7]), max_new_tokens=4, eos_token_id=999)
    mem = s.result.collectors["memory"]
    info = s.result.model
    assert mem["weights_bytes"] == info.weights_bytes == sum(p.numel() * 4 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    # the cache the model built: 2 (K,V) x 2 layers x 2 KV heads x head_dim 16 x (7 padded + 4 generated
    # - 1: the last token's keys are never computed) x batch 2 x 4 bytes
    assert mem["kv_cache_bytes"] == 2 * 2 * 2 * 16 * 10 * 2 * 4
    assert mem["kv_cache_source"] == "cache tensors" and mem["kv_cache_context_tokens"] == 10
    assert mem["kv_cache_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    assert mem["rss_peak_bytes"] >= mem["rss_start_bytes"] > 0
    assert mem["cuda_status"].startswith("unavailable")


def test_sampler_thread_is_stopped(model):
    import threading

    with perfsdk.session(store=None) as s:
        assert any(t.name == "perfsdk-sampler" for t in threading.enumerate())
    assert not any(t.name == "perfsdk-sampler" for t in threading.enumerate())
    assert s.sampler.cpu_time_s >= 0


def test_rss_includes_child_processes():
    import subprocess
    import sys
    import time

    code = "import time; x = bytearray(300 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); time.sleep(4)"
    with perfsdk.session({"collectors": {"memory": {"interval_s": 0.05}}}, store=None) as s:
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(2.5)
        finally:
            pass
    child.wait(timeout=30)
    mem = s.result.collectors["memory"]
    assert mem["rss_peak_bytes"] - mem["rss_start_bytes"] >= 250 * 1024 * 1024


def test_model_used_without_load_is_described_and_tensor_kwargs_work():
    net = torch.nn.Linear(6, 3)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = net

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.inner(inputs)

    model = Wrapped()
    with perfsdk.session(store=None) as s:
        out = s.forward(model, inputs=torch.randn(4, 6))
    assert out.shape == (4, 3)
    assert s.steps[0].batch_size == 4
    assert s.result.model.parameters == 6 * 3 + 3
    assert s.result.collectors["memory"]["weights_bytes"] == (6 * 3 + 3) * 4

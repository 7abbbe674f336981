"""The ``layers`` collector: per-module times, phase split, coverage, hook removal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfsdk
from perfsdk.collectors.layers import ROOT_PATH, LayersCollector, StepSelection, coverage_paths
from perfsdk.config import ConfigError

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=256, max_position_embeddings=256)
COVERAGE = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "model.rotary_emb", "lm_head"]
#: Linear modules in the tiny Llama: 4 attention + 3 MLP projections per layer, plus the LM head.
LINEARS = 7 * 2 + 1


def tiny_llama(cls: type = LlamaForCausalLM) -> nn.Module:
    torch.manual_seed(0)
    return cls(LlamaConfig(**LLAMA)).eval()


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return tiny_llama()


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def gen(s: perfsdk.Session, model: nn.Module, batch: int, tokens: int, new: int) -> torch.Tensor:
    torch.manual_seed(1)
    ids = torch.randint(3, 256, (batch, tokens))
    return s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                      min_new_tokens=new, do_sample=False)


def rows(result: dict, phase: str, key: str = "modules") -> dict[str, dict]:
    name = "path" if key == "modules" else "module_type"
    return {r[name]: r for r in result[key] if r["phase"] == phase}


def test_phase_split_coverage_and_hook_removal(llama: nn.Module) -> None:
    # A long prompt keeps the model's own work well above generate's per-token bookkeeping.
    B, T, G = 8, 128, 3
    cfg = {"collectors": {"layers": {"steps": {"first": 1}}}}
    assert hook_count(llama) == 0
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=llama, tokenizer=None)
        out = gen(s, llama, B, T, G)
        assert hook_count(llama) == 0  # timed steps are never hooked
        gen(s, llama, B, T, G)  # same shape: the overhead baseline
    assert out.shape == (B, T + G)
    assert hook_count(llama) == 0  # removed right after the instrumented copy
    res = s.result.collectors["layers"]
    assert res["status"] == "ok"
    # hooked: a copy of the first timed step (same inputs), run after both timed steps
    assert res["steps_instrumented"] == 1 and res["step_indices"] == [2]
    assert [(st.index, st.instrumented_by, st.replay_of) for st in s.steps] == [
        (0, [], None), (1, [], None), (2, ["layers"], 0)]
    assert s.result.collectors["latency"]["steps"] == 2 and s.result.collectors["latency"]["instrumented_steps"] == 1
    phases = {p["phase"]: p for p in res["phases"]}
    assert set(phases) == {"prefill", "decode"}
    # exactly one prefill forward and G-1 decode forwards for G generated tokens
    assert phases["prefill"]["forwards"] == 1
    assert phases["decode"]["forwards"] == G - 1
    assert (phases["prefill"]["context_len_min"], phases["prefill"]["context_len_max"]) == (T, T)
    assert (phases["decode"]["context_len_min"], phases["decode"]["context_len_max"]) == (T + 1, T + G - 1)
    pre, dec = rows(res, "prefill"), rows(res, "decode")
    for layer in ("model.layers.0", "model.layers.1"):
        assert pre[layer]["calls"] == 1 and dec[layer]["calls"] == G - 1
        assert pre[layer]["module_type"] == "LlamaDecoderLayer"
        assert pre[layer]["total_s"] > 0 and dec[layer]["mean_s"] > 0
    assert pre["model.layers.0"]["input_shapes"][0] == [B, T, 64]
    assert dec["model.layers.0"]["input_shapes"][0] == [B, 1, 64]
    assert pre[ROOT_PATH]["module_type"] == "LlamaForCausalLM"
    types_pre, types_dec = rows(res, "prefill", "module_types"), rows(res, "decode", "module_types")
    assert types_pre["Linear"]["modules"] == LINEARS and types_pre["Linear"]["calls"] == LINEARS
    assert types_dec["Linear"]["calls"] == LINEARS * (G - 1)
    assert types_pre["LlamaRMSNorm"]["calls"] == 2 * 2 + 1
    # every module is timed by default: all 33 modules but the ModuleList container
    assert len(list(llama.modules())) == 33 and res["modules_timed"] == 32
    # Coverage: the top-level children (embedding, decoder layers, norm, rotary, LM head) against
    # the step (which also holds generate's own work between forwards: masks, cache, sampling) and
    # against the model's forwards. How large a share depends on the machine's load, so only the
    # arithmetic and the order are asserted: children <= forwards <= step.
    assert res["coverage_modules"] == COVERAGE
    cov = sum(r["total_s"] for r in res["modules"] if r["path"] in COVERAGE)
    root_s = sum(r["total_s"] for r in res["modules"] if r["path"] == ROOT_PATH)
    assert cov == pytest.approx(res["coverage_time_s"])
    assert 0 < cov <= root_s <= res["step_time_s"]
    assert res["coverage_pct"] == pytest.approx(cov / res["step_time_s"] * 100)
    assert res["forward_coverage_pct"] == pytest.approx(cov / root_s * 100)
    assert 0 < res["coverage_pct"] <= res["forward_coverage_pct"] <= 100.0
    # overhead against the timed steps of the same shape
    assert res["overhead_compared_steps"] == 1 and res["overhead_baseline_steps"] == 2
    assert isinstance(res["overhead_pct"], float)
    # 32 modules x 2 hooks x G forwards
    assert res["hook_calls"] == 32 * 2 * G
    assert res["hook_time_s"] > 0


class FailsOnSecondForward(LlamaForCausalLM):
    """Raises in the first decode step, i.e. inside ``generate``."""

    calls = 0

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        if type(self).calls == 2:
            raise RuntimeError("boom in decode")
        return super().forward(*args, **kwargs)


class FailsInTheCopy(LlamaForCausalLM):
    """A 4-token generate is 4 forwards; the 6th (the copy's first decode step) raises."""

    calls = 0

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        if type(self).calls == 6:
            raise RuntimeError("boom in the instrumented copy")
        return super().forward(*args, **kwargs)


def test_hooks_removed_when_step_raises() -> None:
    model = tiny_llama(FailsInTheCopy)
    assert hook_count(model) == 0
    with perfsdk.session({"collectors": {"layers": {}}}, store=None) as s:
        s.load(model=model, tokenizer=None)
        gen(s, model, 1, 8, 4)
    assert hook_count(model) == 0
    assert FailsInTheCopy.calls == 6
    res = s.result.collectors["layers"]
    assert res["status"] == "unavailable"
    assert res["steps_failed"] == 1 and res["steps_instrumented"] == 0
    assert "failed" in res["reason"]
    assert s.result.status == "partial"
    assert [(e.source, e.hook, e.message) for e in s.result.errors] == [
        ("session", "instrumented step", "boom in the instrumented copy")]
    assert s.result.collectors["latency"]["steps"] == 1  # the timed step still counts


def test_timed_step_raising_runs_no_copy() -> None:
    model = tiny_llama(FailsOnSecondForward)
    with pytest.raises(RuntimeError, match="boom in decode"):
        with perfsdk.session({"collectors": {"layers": {}}}, store=None) as s:
            s.load(model=model, tokenizer=None)
            gen(s, model, 1, 8, 4)
    assert hook_count(model) == 0 and FailsOnSecondForward.calls == 2
    res = s.result.collectors["layers"]
    assert res["status"] == "unavailable" and res["steps_instrumented"] == 0
    assert "1 instrumented step(s) not run: the session ended with an error" in s.result.validity.notes


def test_forward_on_sequential_with_event_log() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    cfg = {"collectors": {"layers": {"steps": {"first": 2}, "log_events": True}}}
    with perfsdk.session(cfg, store=None) as s:
        with s.warmup():
            s.forward(model, x)
        y = s.forward(model, x)
        s.forward(model, x)
    assert y.shape == (3, 4)
    assert hook_count(model) == 0
    res = s.result.collectors["layers"]
    assert res["step_indices"] == [3, 4]  # copies of the timed steps 1 and 2
    assert [(p["phase"], p["forwards"]) for p in res["phases"]] == [("forward", 2)]
    assert res["coverage_modules"] == ["0", "1", "2"]
    fwd = rows(res, "forward")
    assert set(fwd) == {ROOT_PATH, "0", "1", "2"}
    assert {p: r["calls"] for p, r in fwd.items()} == {ROOT_PATH: 2, "0": 2, "1": 2, "2": 2}
    assert fwd["0"]["input_shapes"] == [[3, 8]]
    assert fwd["2"]["input_shapes"] == [[3, 16]]
    assert fwd[ROOT_PATH]["module_type"] == "Sequential" and fwd["1"]["module_type"] == "ReLU"
    assert 0 < res["coverage_pct"] <= 100.0
    # both timed steps stay measured: the copies compare with them
    assert res["overhead_compared_steps"] == 2 and res["overhead_baseline_steps"] == 2
    assert res["overhead_pct"] is not None and res["overhead_reason"] is None
    events = s.series["layers_events"]
    assert res["events_series"] == "layers_events" and res["events"] == len(events) == 8
    assert [e["path"] for e in events] == [ROOT_PATH, "0", "1", "2"] * 2
    assert [e["step"] for e in events] == [3] * 4 + [4] * 4
    starts = [e["start_s"] for e in events[:4]]
    assert starts == sorted(starts)
    assert events[1]["input_shapes"] == [[3, 8]] and events[0]["phase"] == "forward"
    assert all(e["duration_s"] > 0 for e in events)


def test_module_filters(llama: nn.Module) -> None:
    cfg = {"collectors": {"layers": {"module_types": ["Linear"]}}}
    with perfsdk.session(cfg, store=None) as s:
        gen(s, llama, 1, 6, 2)
    res = s.result.collectors["layers"]
    # the top module and the six coverage modules are always timed, plus every other Linear
    assert res["modules_timed"] == 1 + len(COVERAGE) + (LINEARS - 1)
    with perfsdk.session({"collectors": {"layers": {"max_depth": 1}}}, store=None) as s:
        gen(s, llama, 1, 6, 2)
    res = s.result.collectors["layers"]
    assert sorted(r["path"] for r in res["modules"] if r["phase"] == "prefill") == sorted(
        [ROOT_PATH, "model"] + COVERAGE)
    with perfsdk.session({"collectors": {"layers": {"max_depth": 1, "top_n": 2}}}, store=None) as s:
        gen(s, llama, 1, 6, 2)
    res = s.result.collectors["layers"]
    assert [r["phase"] for r in res["modules"]] == ["prefill", "prefill", "decode", "decode"]
    assert hook_count(llama) == 0


def test_every_nth_step_and_overhead() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.ones(2, 8)
    with perfsdk.session({"collectors": {"layers": {"steps": {"every": 2}}}}, store=None) as s:
        with s.warmup():
            s.forward(model, x)
        for _ in range(4):
            s.forward(model, x)
    res = s.result.collectors["layers"]
    assert res["steps_selection"] == "every 2"
    assert res["step_indices"] == [5, 6]  # copies of timed steps 1 and 3
    assert [st.replay_of for st in s.steps[5:]] == [1, 3]
    assert res["overhead_compared_steps"] == 2 and res["overhead_baseline_steps"] == 4
    assert res["overhead_pct"] is not None and res["overhead_reason"] is None


def test_not_a_module_and_not_enabled() -> None:
    with perfsdk.session(None, store=None) as s:
        s.forward(lambda x: x + 1, torch.ones(2))
    assert "layers" not in s.result.collectors  # opt-in
    with perfsdk.session({"collectors": {"layers": {}}}, store=None) as s:
        s.forward(lambda x: x + 1, torch.ones(2))
    res = s.result.collectors["layers"]
    assert res["status"] == "unavailable" and "not a torch.nn.Module" in res["reason"]


def test_step_selection_config() -> None:
    assert StepSelection.model_validate(3).first == 3
    assert StepSelection().first == 1 and StepSelection().every is None
    sel = StepSelection(every=3)
    assert [k for k in range(10) if sel.selects(k)] == [0, 3, 6, 9]
    assert [k for k in range(5) if StepSelection(first=2).selects(k)] == [0, 1]
    with pytest.raises(ConfigError, match="collectors.layers"):
        perfsdk.session({"collectors": {"layers": {"steps": {"first": 1, "every": 2}}}}, store=None)
    with pytest.raises(ConfigError, match="unknown key"):
        perfsdk.session({"collectors": {"layers": {"depth": 2}}}, store=None)
    assert LayersCollector.default_enabled is False


def test_coverage_paths(llama: nn.Module) -> None:
    assert coverage_paths(llama) == COVERAGE
    assert coverage_paths(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == ["0", "1"]
    assert coverage_paths(nn.Linear(2, 2)) == [""]
    nested = nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]), nn.ReLU())
    assert coverage_paths(nested) == ["0.0", "0.1", "1"]


def test_per_function_accounting_through_capture(llama: nn.Module) -> None:
    B, T, G = 1, 6, 3
    cfg = {"collectors": {"layers": {"per_function": True, "max_depth": 3}}}
    with perfsdk.session(cfg, store=None) as s:
        gen(s, llama, B, T, G)
    assert hook_count(llama) == 0  # the capture's hooks are gone too
    res = s.result.collectors["layers"]
    assert res["per_function_status"] == "ok"
    totals = {(r["phase"], r["category"]): r for r in res["per_function_totals"]}
    assert {c for _, c in totals} <= {"matmul", "attention", "softmax", "activation", "norm"}
    # one SiLU per decoder layer and forward pass, each timed
    silu = {r["phase"]: r for r in res["per_function_ops"] if r["op"] == "aten.silu"}
    assert silu["prefill"]["calls"] == 2 and silu["decode"]["calls"] == 2 * (G - 1)
    assert silu["prefill"]["category"] == "activation" and silu["prefill"]["time_s"] > 0
    assert totals[("prefill", "activation")]["ops"] == 2
    for t in totals.values():
        assert t["time_s"] > 0 and t["share_pct"] == pytest.approx(t["time_s"] / res["step_time_s"] * 100)
    assert sum(t["time_s"] for t in totals.values()) < res["step_time_s"]
    # 7 projections per layer x 2 layers + LM head: one matmul each per forward
    mm_pre = [r for r in res["per_function"] if r["phase"] == "prefill" and r["category"] == "matmul"]
    assert sorted({r["path"] for r in mm_pre})[:2] == ["lm_head", "model.layers.0.mlp.down_proj"]
    assert len({r["path"] for r in mm_pre}) == LINEARS
    # q_proj: 2 * tokens * in * out FLOPs (hidden 64 -> 4 heads x 16)
    q = next(r for r in mm_pre if r["path"] == "model.layers.0.self_attn.q_proj")
    assert q["flops"] == 2 * B * T * 64 * 64
    lm = next(r for r in res["per_function"] if r["path"] == "lm_head" and r["phase"] == "decode"
              and r["category"] == "matmul")
    assert lm["flops"] == 2 * B * 1 * 64 * 256 * (G - 1)
    assert totals[("prefill", "attention")]["flops"] > 0 and totals[("prefill", "norm")]["ops"] > 0


def test_steps_also_profiled_left_out_of_overhead() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.ones(2, 8)
    cfg = {"collectors": {"layers": {"steps": {"first": 2}}, "torch_profiler": {"save_traces": False}}}
    with perfsdk.session(cfg, store=None) as s:
        for _ in range(4):
            s.forward(model, x)
    res = s.result.collectors["layers"]
    # each instrumenting collector gets copies of its own: 4 and 6 for layers, 5 for the profiler
    assert [(st.index, st.instrumented_by, st.replay_of) for st in s.steps[4:]] == [
        (4, ["layers"], 0), (5, ["torch_profiler"], 0), (6, ["layers"], 1)]
    assert s.result.collectors["torch_profiler"]["step_indices"] == [5]
    assert res["step_indices"] == [4, 6] and res["steps_also_profiled"] == []
    assert res["overhead_compared_steps"] == 2 and res["overhead_baseline_steps"] == 4
    # asked to share, the profiler and the hooks instrument one copy together
    cfg["instrumentation"] = {"share_steps": True}
    with perfsdk.session(cfg, store=None) as s:
        for _ in range(4):
            s.forward(model, x)
    res = s.result.collectors["layers"]
    assert [(st.index, st.instrumented_by) for st in s.steps[4:]] == [(4, ["layers", "torch_profiler"]), (5, ["layers"])]
    assert s.result.collectors["torch_profiler"]["step_indices"] == [4]
    assert res["step_indices"] == [4, 5] and res["steps_also_profiled"] == [4]
    # the shared copy is left out; copy 5 is compared with the four timed steps
    assert res["overhead_compared_steps"] == 1 and res["overhead_baseline_steps"] == 4

"""The simulation collector inside a session: predictions per target, predicted vs measured."""

from __future__ import annotations

import pytest
import torch

import perfsdk
from perfsdk.plugins import collect_registry, get_plugin_manager


@pytest.fixture()
def tiny_model():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                        max_position_embeddings=256)).eval()


def test_registered_and_opt_in() -> None:
    reg = collect_registry(get_plugin_manager(load_entry_points=False))
    assert "simulation" in reg.collectors and not reg.collectors["simulation"].default_enabled


def test_collector_predicts_targets_and_compares(tiny_model) -> None:  # type: ignore[no-untyped-def]
    cfg = {"collectors": {"simulation": {"targets": ["h100-sxm", "pim-ai-dimm"], "dtype": "bfloat16", "top_n": 2,
                                         "mapping": {"devices": {"pim0": "pim-ai-chip"},
                                                     "layers": [{"match": "model.layers.*.mlp.*", "device": "pim0",
                                                                 "transfer": "t"}]}}}}
    ids = torch.randint(4, 256, (2, 12))
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=tiny_model)
        with s.warmup():
            s.generate(tiny_model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, pad_token_id=0)
        s.generate(tiny_model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                   min_new_tokens=5, pad_token_id=0)
    res = s.result.collectors["simulation"]
    assert res["status"] == "ok", res
    assert res["captured_step"] == 1  # the first measured step, not the warm-up
    assert res["batch_size"] == 2 and res["input_tokens"] == 12 and res["output_tokens"] == 5
    assert set(res["predictions"]) == {"h100-sxm", "pim-ai-dimm", "host-cpu"}
    h100 = res["predictions"]["h100-sxm"]
    assert h100["ttft_s"] > 0 and h100["tpot_s"] > 0 and h100["fits_in_memory"]
    assert len(h100["top_layers"]) == 4
    assert set(res["comparison"]) == {"prefill", "decode", "tpot"}
    step = [st for st in s.steps if not st.warmup][0]
    measured_ttft = (step.token_times_ns[0] - step.start_ns) / 1e9
    assert res["comparison"]["prefill"]["measured_s"] == pytest.approx(measured_ttft)
    pre = res["comparison"]["prefill"]
    assert pre["error_pct"] == pytest.approx(100 * (pre["predicted_s"] - pre["measured_s"]) / pre["measured_s"])
    assert "simulation.json" in s.artifacts
    # the collector's own summary tables, from its typed result
    from rich.console import Console

    from perfsdk.collectors.simulation import SimulationCollector

    typed = SimulationCollector.result_of(s.result)
    assert typed is not None and typed.predictions["h100-sxm"].ttft_s == h100["ttft_s"]
    tables = SimulationCollector.summary_tables(typed)
    assert len(tables) == 2
    con = Console(record=True, width=250)
    for t in tables:
        con.print(t)
    text = con.export_text()
    assert "host-cpu (measured here)" in text and "pim-ai-dimm" in text
    assert f"{pre['error_pct']:+.1f}%" in text


def test_comparison_takes_the_median_of_the_steps_of_the_captured_shape(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import statistics

    ids = torch.randint(4, 256, (1, 10))
    other = torch.randint(4, 256, (1, 6))
    kw = dict(max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    with perfsdk.session({"collectors": {"simulation": {}}}, store=None) as s:
        s.load(model=tiny_model)
        for x in (ids, other, ids, ids):  # three steps of the captured shape, one of another
            s.generate(tiny_model, input_ids=x, attention_mask=torch.ones_like(x), **kw)
    res = s.result.collectors["simulation"]
    assert res["status"] == "ok", res
    assert res["captured_step"] == 0 and res["compared_steps"] == 3
    same = [st for st in s.steps if st.input_tokens == [10]]
    assert len(same) == 3
    ttft = statistics.median((st.token_times_ns[0] - st.start_ns) / 1e9 for st in same)
    decode = statistics.median((st.token_times_ns[-1] - st.token_times_ns[0]) / 1e9 for st in same)
    assert res["comparison"]["prefill"]["measured_s"] == pytest.approx(ttft)
    assert res["comparison"]["decode"]["measured_s"] == pytest.approx(decode)
    assert res["comparison"]["tpot"]["measured_s"] == pytest.approx(decode / 3)
    from rich.console import Console

    from perfsdk.collectors.simulation import SimulationCollector

    con = Console(record=True, width=200)
    for t in SimulationCollector.summary_tables(SimulationCollector.result_of(s.result)):
        con.print(t)
    # the caption wraps to the table's width
    assert "measured: median of the run's 3 steps of this shape" in " ".join(con.export_text().split())


def test_comparison_leaves_out_the_instrumented_copies_of_a_step(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """The FLOPs collector replays a timed step under capture (far slower): the measured side of
    the comparison is the timed steps alone, as the latency figures are."""
    import statistics

    ids = torch.randint(4, 256, (1, 10))
    kw = dict(max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    with perfsdk.session({"collectors": {"simulation": {}, "flops": {}}}, store=None) as s:
        s.load(model=tiny_model)
        for _ in range(2):
            s.generate(tiny_model, input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    res = s.result.collectors["simulation"]
    assert res["status"] == "ok", res
    copies = [st for st in s.steps if st.instrumented_by]
    timed = [st for st in s.steps if not st.instrumented_by and not st.warmup]
    assert len(copies) >= 1 and len(timed) == 2
    assert res["compared_steps"] == 2
    ttft = statistics.median((st.token_times_ns[0] - st.start_ns) / 1e9 for st in timed)
    assert res["comparison"]["prefill"]["measured_s"] == pytest.approx(ttft)


def test_a_prediction_far_from_the_measurement_says_how_to_calibrate(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a user file describing an impossibly fast CPU: every phase is predicted near 0 s
    fast = tmp_path / "fast.yaml"
    fast.write_text("name: fast-cpu\nkind: cpu\nvariant: test\nsource: test\nmemory_bandwidth_gbs: 1.0e+9\n"
                    "memory_pj_per_bit: 0\nmemory_capacity_gb: 64\npeak_tflops: {fp32: 1.0e+9}\n"
                    "compute_pj_per_flop: 0\n", encoding="utf-8")
    ids = torch.randint(4, 256, (1, 8))
    with perfsdk.session({"collectors": {"simulation": {"host": str(fast)}}}, store=None) as s:
        s.load(model=tiny_model)
        s.generate(tiny_model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                   min_new_tokens=4, pad_token_id=0)
    res = s.result.collectors["simulation"]
    worst = min(res["comparison"].items(), key=lambda kv: kv[1]["error_pct"])
    assert worst[1]["error_pct"] < -99
    assert (f"the fast-cpu profile (user file) misses this measurement by {worst[1]['error_pct']:+.0f} % "
            f"({worst[0]}): it prices the device's operations") in " ".join(res["notes"])
    assert any("perfsdk calibrate --from-store STORE --run ID -o host.yaml" in n for n in res["notes"])


def test_collector_simulates_a_forward_step_without_generate(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with perfsdk.session({"collectors": {"simulation": {"targets": ["h100-sxm"]}}}, store=None) as s:
        s.load(model=tiny_model)
        s.forward(tiny_model, input_ids=torch.randint(4, 256, (1, 4)))
    res = s.result.collectors["simulation"]
    assert res["status"] == "ok" and res["step_kind"] == "forward"
    h100 = res["predictions"]["h100-sxm"]
    assert h100["forward_s"] > 0 and h100["ttft_s"] is None and h100["prefill_time_s"] is None
    assert {l["phase"] for l in h100["top_layers"]} == {"forward"}
    assert set(res["comparison"]) == {"forward"}


def test_collector_kv_heads_and_window_overrides(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import json

    cfg = {"collectors": {"simulation": {"targets": ["h100-sxm"], "num_key_value_heads": 1, "sliding_window": 4}}}
    ids = torch.randint(4, 256, (2, 12))
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=tiny_model)
        s.generate(tiny_model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                   min_new_tokens=5, pad_token_id=0)
    res = s.result.collectors["simulation"]
    assert res["status"] == "ok" and res["overrides"] == {"num_key_value_heads": 1, "sliding_window": 4}
    assert res["predictions"]["h100-sxm"]["op_source"] == "analytic"
    assert res["predictions"]["host-cpu"]["op_source"] == "captured"  # the measured device: as run
    full = json.loads(s.artifacts["simulation.json"])
    # 2 (K, V) x 2 layers x 1 KV head x head dim 16 x 4 bytes x batch 2 x window 4
    assert full["h100-sxm"]["devices"][0]["kv_cache_bytes"] == 2 * 2 * 1 * 16 * 4 * 2 * 4
    with perfsdk.session({"collectors": {"simulation": {"targets": ["h100-sxm"], "num_key_value_heads": 3}}},
                         store=None) as s:
        s.load(model=tiny_model)
        s.generate(tiny_model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, pad_token_id=0)
    res = s.result.collectors["simulation"]
    assert "must divide the model's 4 attention heads" in res["errors"]["overrides"]
    assert set(res["predictions"]) == {"host-cpu"}

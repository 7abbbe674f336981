"""Cost model and predictor: hand-computed expectations."""

from __future__ import annotations

import pytest

from perfsdk.hardware import HardwareProfile, builtin_profiles
from perfsdk.capture.ops import OpRecord
from perfsdk.simulation.analytic import _Emitter, expected_active_experts, forward_ops, generation_ops
from perfsdk.simulation.costmodel import cost_op
from perfsdk.simulation.predictor import Simulator, rescale_ops, simulate_model
from perfsdk.models.arch import architecture_from_config
from perfsdk.models.resolve import resolve_architecture
from perfsdk.models.tiny import tiny_llama_config

PROFILE = HardwareProfile.model_validate({
    "name": "testdev", "kind": "gpu", "variant": "v", "source": "s",
    "host_to_device_gbs": 10, "host_to_device_pj_per_bit": 100,
    "device_to_host_gbs": 20, "device_to_host_pj_per_bit": 50,
    "memory_bandwidth_gbs": 100, "memory_pj_per_bit": 10, "memory_capacity_gb": 1,
    "peak_tflops": {"fp32": 1, "bf16": 1}, "compute_pj_per_flop": 2,
    "static_power_w": 10, "compute_efficiency": 0.5, "memory_efficiency": 0.5, "op_overhead_s": 1e-6,
})


def linear_op(dtype: str = "float32") -> OpRecord:
    e = _Emitter(dtype, "prefill", 0, 1)
    e.linear("model.layers.0.mlp.up_proj", batch=4, tokens=1, k=1024, n=1024)
    return e.ops[0]


def test_linear_op_record() -> None:
    op = linear_op()
    assert op.flops == 2 * 4 * 1024 * 1024 == 8_388_608
    assert op.weight_bytes == 1024 * 1024 * 4 == 4_194_304
    assert op.bytes_read == 4_194_304 + 4 * 1024 * 4 == 4_210_688
    assert op.bytes_written == 16_384


def test_single_linear_cost() -> None:
    c = cost_op(linear_op(), PROFILE)
    # 8,388,608 FLOPs at 1e12 * 0.5; 4,227,072 bytes at 100e9 * 0.5
    assert c.compute_s == pytest.approx(8_388_608 / 5e11)
    assert c.memory_s == pytest.approx(4_227_072 / 5e10)
    assert c.bound == "memory"
    assert c.time_s == pytest.approx(8.454144e-5 + 1e-6)
    dynamic = 8_388_608 * 2e-12 + 4_227_072 * 8 * 10e-12
    assert c.dynamic_energy_j == pytest.approx(dynamic)
    assert c.energy_j == pytest.approx(dynamic + 10 * 8.554144e-5)


def test_attention_at_known_context() -> None:
    from transformers import LlamaConfig, MistralConfig

    dims = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=256)
    m = architecture_from_config(LlamaConfig(**dims))
    e = _Emitter("bfloat16", "decode", 1, 100)
    e.attention("model.layers.0.self_attn.attn", batch=1, tokens=1, keys=m.keys_attended(0, 99, 1), m=m)
    op = e.ops[0]
    # 4 query heads x 100 keys; QK^T and PV: 4 FLOPs per score per head-dim element
    assert op.elements == 400
    assert op.flops == 4 * 400 * 16 == 25_600
    assert op.kv_bytes == 2 * 2 * 100 * 16 * 2 == 12_800
    assert op.bytes_read == 12_800 + 4 * 16 * 2
    assert op.bytes_written == 128 + 2 * 2 * 16 * 2
    c = cost_op(op, PROFILE)
    assert c.memory_s == pytest.approx((12_928 + 256) / 5e10)
    assert c.compute_s == pytest.approx(25_600 / 5e11)
    assert c.bound == "memory"
    # a sliding window of 64 caps the keys read
    w = architecture_from_config(MistralConfig(**dims, sliding_window=64))
    e2 = _Emitter("bfloat16", "decode", 1, 100)
    e2.attention("a", batch=1, tokens=1, keys=w.keys_attended(0, 99, 1), m=w)
    assert e2.ops[0].kv_bytes == 2 * 2 * 64 * 16 * 2


def test_kv_traffic_grows_with_context_and_gqa() -> None:
    m = resolve_architecture("llama-3-8b")  # 8 KV heads of 32
    ops = generation_ops(m, 1, 100, 3, "bfloat16")
    kv = {o.step: o.kv_bytes for o in ops if o.category == "attention" and o.module_path.startswith("model.layers.0.")}
    per_token = 2 * 8 * 128 * 2
    assert kv == {0: 100 * per_token, 1: 101 * per_token, 2: 102 * per_token}


def test_per_element_rates_replace_flops() -> None:
    pim = builtin_profiles()["pim-ai-dimm"]
    e = _Emitter("bfloat16", "prefill", 0, 8)
    e.pointwise("act", "silu", "activation", (1, 8, 1000), inputs=1)
    c = cost_op(e.ops[0], pim)
    assert c.compute_s == pytest.approx(8000 * 9.375e-3 * 1e-9)


def test_moe_active_experts() -> None:
    assert expected_active_experts(8, 2, 1) == 2
    assert expected_active_experts(8, 2, 100) == 8
    m = resolve_architecture("mixtral-8x7b")
    decode = forward_ops(m, 1, 1, 10, "bfloat16", "decode", 1)
    experts = {o.module_path.split(".experts.")[1].split(".")[0] for o in decode if ".experts." in o.module_path
               and o.module_path.startswith("model.layers.0.")}
    assert experts == {"0", "1"}  # one token reaches its top-2 experts only


def test_7b_decode_on_h100_is_memory_bound() -> None:
    shape = resolve_architecture("llama-2-7b")
    h100 = builtin_profiles()["h100-sxm"]
    res = simulate_model(shape, h100, batch_size=1, input_tokens=128, output_tokens=32, dtype="bfloat16")
    weights = shape.param_count() * 2
    assert res.phases["decode"].bound == "memory"
    assert res.tpot_s is not None and res.tpot_s >= weights / (h100.memory_bandwidth_gbs * 1e9)
    assert res.fits_in_memory
    assert set(res.phases) == {"prefill", "decode"}
    assert res.phases["decode"].steps == 31
    assert all(l.bound in ("compute", "memory", "transfer") for l in res.layers)
    assert res.output_tokens_per_s == pytest.approx(32 / (res.ttft_s + res.phases["decode"].time_s))
    assert res.energy_j_per_output_token == pytest.approx(res.energy_j / 32)


def test_70b_does_not_fit_on_one_l4() -> None:
    res = simulate_model(resolve_architecture("llama-2-70b"), builtin_profiles()["l4"], batch_size=1,
                         input_tokens=16, output_tokens=2, dtype="bfloat16")
    assert not res.fits_in_memory and res.memory_required_bytes > 24e9


def test_sampled_decode_steps_match_full() -> None:
    shape = resolve_architecture("builtin:tiny-llama")
    h100 = builtin_profiles()["h100-sxm"]
    full = simulate_model(shape, h100, output_tokens=200, max_decode_steps=1000)
    sampled = simulate_model(shape, h100, output_tokens=200, max_decode_steps=16)
    assert sampled.phases["decode"].steps == pytest.approx(199)
    assert sampled.tpot_s == pytest.approx(full.tpot_s, rel=1e-3)


def test_single_device_energy_is_sum_of_op_energies() -> None:
    from dataclasses import replace

    ops = [linear_op(), replace(linear_op(), module_path="model.layers.0.mlp.down_proj")]
    res = Simulator(PROFILE).predict(ops, batch_size=4)
    c = cost_op(ops[0], PROFILE)
    assert res.ttft_s == pytest.approx(2 * c.time_s)
    assert res.phases["prefill"].energy_j == pytest.approx(2 * c.energy_j)
    assert res.phases["prefill"].avg_power_w == pytest.approx(c.energy_j / c.time_s)
    assert res.tpot_s is None


def test_rescale_ops_halves_bytes() -> None:
    [op] = rescale_ops([linear_op("float32")], "bfloat16")
    assert op.dtype == "bfloat16" and op.weight_bytes == 2_097_152 and op.bytes_written == 8192


def test_captured_calls_of_one_module_are_costed_as_one_module_call() -> None:
    from dataclasses import replace

    from perfsdk.simulation.predictor import as_module_calls

    prof = PROFILE.model_copy(update={"op_overhead_s": 5e-6, "launch_overhead_s": 1e-6})
    up = linear_op()
    norm = replace(up, module_path="model.layers.0.input_layernorm", category="norm", flops=0, op="aten.mul")
    view = replace(norm, op="aten.view", bytes_read=0, bytes_written=0, weight_bytes=0)
    ops = [norm, norm, view, norm, up, norm]
    grouped = as_module_calls(ops)
    # three calls of the norm (the view between them costs nothing) are one module call; the
    # linear layer is its own; the norm after it starts a new call
    assert [o.launches for o in grouped] == [3, 0, 1, 0, 1, 1]
    res = Simulator(prof).predict(ops, batch_size=4)
    assert res.phases["prefill"].overhead_s == pytest.approx(3 * 5e-6 + 2 * 1e-6)
    # analytic ops are costed as written
    res = Simulator(prof).predict(ops, batch_size=4, op_source="analytic")
    assert res.phases["prefill"].overhead_s == pytest.approx(5 * 5e-6)


def test_an_embedding_keeps_resident_only_the_rows_it_gathers() -> None:
    from dataclasses import replace

    from perfsdk.simulation.costmodel import resident_bytes

    # the analytic generator states the whole table as the lookup's weights, a capture only the
    # rows it gathered: both read (and keep in cache) the rows alone
    arch = architecture_from_config(tiny_llama_config("tiny-llama-medium"))
    ops = forward_ops(arch, 2, 1, 31, "float32", "decode", 1)
    emb = next(o for o in ops if o.category == "embedding")
    assert emb.weight_bytes == 4096 * 512 * 4
    assert resident_bytes(emb) == emb.bytes_read == 2 * (512 * 4 + 8)
    captured = replace(emb, weight_bytes=2 * 512 * 4)
    assert resident_bytes(captured) == 2 * 512 * 4
    lin = linear_op()
    assert resident_bytes(replace(lin, kv_bytes=1000)) == lin.weight_bytes + 1000


def test_captured_and_analytic_ops_of_one_model_cost_alike() -> None:
    """The same Llama, costed from the architecture description and from its own code captured
    on the meta device, on a profile with a cache its weights straddle."""
    from perfsdk.simulation.predictor import simulate_captured

    cfg = tiny_llama_config("tiny-llama-medium")
    cfg.num_hidden_layers = 2  # 2 x 11.8 MB of layers + an 8.4 MB output projection
    prof = builtin_profiles()["host-cpu"].model_copy(update={
        "cache_mb": 32.0, "cache_bandwidth_gbs": 40.0, "memory_bandwidth_gbs": 10.0, "op_overhead_s": 1.1e-5,
        "launch_overhead_s": 9e-7, "step_overhead_s": 4e-4, "compute_efficiency": 1.0, "memory_efficiency": 1.0})
    for batch in (1, 4):
        kw = dict(batch_size=batch, input_tokens=32, output_tokens=8, dtype="float32")
        analytic = simulate_model(cfg, prof, **kw)
        captured = simulate_captured(cfg, prof, **kw)
        assert analytic.op_source == "analytic" and captured.op_source == "meta-device capture"
        # (counting the embedding table as resident on one side only put them 24 % apart)
        assert captured.tpot_s == pytest.approx(analytic.tpot_s, rel=0.06)
        assert captured.ttft_s == pytest.approx(analytic.ttft_s, rel=0.06)


def test_small_m_slowdown_applies_from_four_repacking_blocks() -> None:
    from perfsdk.simulation.calibration import Observation
    from perfsdk.simulation.costmodel import compute_time_s, small_m_applies

    base = PROFILE.model_copy(update={"matmul_half_rows": 8.0})
    staircase = base.model_copy(update={"matmul_pack_rows": 4.0, "matmul_pack_gbs": 50.0})
    peak = 1e12 * 0.5
    for rows in (1, 3, 4, 15, 16, 64):
        e = _Emitter("float32", "prefill", 0, rows)
        e.linear("model.layers.0.mlp.up_proj", batch=1, tokens=rows, k=512, n=1408)
        op = e.ops[0]
        plain = 2 * rows * 512 * 1408 / peak
        # without a repacking size the slowdown is everywhere; with P = 4, from 16 rows only
        assert compute_time_s(op, base) == pytest.approx(plain * (rows + 8) / rows)
        slowed = (rows + 8) / rows if rows >= 16 else 1.0
        assert compute_time_s(op, staircase) == pytest.approx(plain * slowed)
        assert small_m_applies(rows, 4.0) == (rows >= 16)
        # the calibration's feature for the fitted slowdown follows the same rule
        ob = Observation.from_ops("o", "prefill", 1.0, [op])
        assert ob.row_flops(4.0)[0] == (2 * 512 * 1408 if rows >= 16 else 0.0)
        assert ob.row_flops()[0] == 2 * 512 * 1408

"""Kernel calls per analytic operation: fused projections, eager norms, expert routing, and the
per-call overhead the cost model and the calibration attach to them."""

from __future__ import annotations

import numpy as np
import pytest

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.profile import HardwareProfile
from perfsdk.models.arch import architecture_from_config
from perfsdk.simulation.analytic import forward_ops
from perfsdk.simulation.calibration import Observation, build_random_model
from perfsdk.simulation.costmodel import cost_op

transformers = pytest.importorskip("transformers")


def _ops(cfg: object) -> dict[str, OpRecord]:
    arch = architecture_from_config(cfg)
    return {o.module_path: o for o in forward_ops(arch, 1, 1, 7, "float32", "decode", 1)}


def test_fused_qkv_and_layernorm_of_gpt2() -> None:
    ops = _ops(transformers.GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=128))
    p = "transformer.h.0" if "transformer.h.0.self_attn.q_proj" in ops else "model.layers.0"
    assert ops[f"{p}.self_attn.q_proj"].launches == 1
    assert ops[f"{p}.self_attn.k_proj"].launches == 0  # computed by the same call (c_attn)
    assert ops[f"{p}.self_attn.v_proj"].launches == 0
    norms = [o for o in ops.values() if o.category == "norm"]
    assert norms and all(o.launches == 1 for o in norms)  # LayerNorm: one kernel
    act = next(o for o in ops.values() if o.category == "activation")
    assert (act.op, act.launches) == ("gelu_new", 8)  # the tanh approximation, written out


def test_phi3_fuses_qkv_and_gate_up_llama_does_not() -> None:
    phi = _ops(transformers.Phi3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                       num_attention_heads=2, vocab_size=128, pad_token_id=0))
    assert phi["model.layers.0.mlp.gate_proj"].launches == 1
    assert phi["model.layers.0.mlp.up_proj"].launches == 0
    assert phi["model.layers.0.self_attn.v_proj"].launches == 0
    assert phi["model.layers.0.input_layernorm"].launches == 6  # RMSNorm: pow, mean, add, rsqrt, mul, mul
    assert phi["model.layers.0.self_attn.rotary"].launches == 10
    assert phi["model.layers.0.self_attn.kv_cache"].launches == 2
    llama = _ops(transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                          num_attention_heads=2, vocab_size=128))
    assert llama["model.layers.0.mlp.up_proj"].launches == 1
    assert llama["model.layers.0.self_attn.v_proj"].launches == 1


def test_mixtral_routing_gather_and_scatter() -> None:
    ops = _ops(transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                          num_experts_per_tok=2, vocab_size=128))
    p = "model.layers.0.mlp"
    assert ops[f"{p}.router_softmax"].launches == 4
    assert ops[f"{p}.dispatch"].launches == 5
    # one token, two experts reached: each gathers its one row of 64 floats and scatters it back
    for j in (0, 1):
        g, s = ops[f"{p}.experts.{j}.gather"], ops[f"{p}.experts.{j}.scatter"]
        assert (g.launches, g.bytes_read, g.bytes_written) == (4, 64 * 4, 64 * 4)
        assert (s.launches, s.bytes_read, s.bytes_written) == (3, 2 * 64 * 4, 64 * 4)
        assert ops[f"{p}.experts.{j}.up_proj"].launches == 0  # gate and up in one 3-D weight
    assert f"{p}.experts.2.gather" not in ops


def test_overhead_counts_further_calls() -> None:
    prof = HardwareProfile(name="t", kind="cpu", variant="test", source="test", memory_bandwidth_gbs=1.0,
                           memory_pj_per_bit=1.0, compute_pj_per_flop=1.0, peak_tflops={"fp32": 1.0},
                           op_overhead_s=5e-6, launch_overhead_s=1e-6)
    base = dict(module_path="m", op="rms_norm", category="norm", phase="decode", bytes_read=8, bytes_written=8)
    assert cost_op(OpRecord(**base, launches=6), prof).overhead_s == pytest.approx(5e-6 + 5 * 1e-6)
    assert cost_op(OpRecord(**base), prof).overhead_s == pytest.approx(5e-6)
    assert cost_op(OpRecord(**base, launches=0), prof).overhead_s == 0.0
    obs = Observation.from_ops("x", "decode", 1.0, [OpRecord(**base, launches=6), OpRecord(**base, launches=0),
                                                    OpRecord(**base, step=2, launches=2)], {1: 1.0, 2: 3.0})
    assert obs.op_count == 1.0 + 3.0  # the fused op makes no call of its own
    assert obs.extra_launches == 5.0 + 3.0 * 1
    feats = obs.features(1e-12, 1e-12)
    assert feats[2] == 4.0 and feats[7] == 8.0
    assert np.isfinite(feats).all()


def test_random_model_width_and_depth_overrides() -> None:
    m = build_random_model("builtin:tiny-llama-medium@hidden=64@layers=2")
    assert (m.config.hidden_size, m.config.intermediate_size, m.config.num_hidden_layers) == (64, 176, 2)
    with pytest.raises(ValueError, match="only @layers=N and @hidden=N"):
        build_random_model("builtin:tiny-llama-medium@width=64")
    with pytest.raises(ValueError, match="multiple of the 8 heads"):
        build_random_model("builtin:tiny-llama-medium@hidden=60")

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


def test_mixtral_routing_and_grouped_experts() -> None:
    ops = _ops(transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                          num_experts_per_tok=2, vocab_size=128))
    p = "model.layers.0.mlp"
    # the router: softmax, sum and division chained (one op, three calls), top-k an op of its own
    assert ops[f"{p}.router_softmax"].launches == 3
    assert ops[f"{p}.router.topk"].launches == 1
    # one token, top-2: its two routed rows of 64 floats sorted, gathered, and after the experts
    # weighted, reordered and summed; the sort, the gather of the weights, histc and cumsum
    # (dispatch), arange and index_put_ (combine) are kernels of their own, each an op
    d, c = ops[f"{p}.dispatch"], ops[f"{p}.combine"]
    assert (d.launches, d.bytes_read, d.bytes_written) == (3, 2 * 64 * 4, 2 * 64 * 4)
    assert (c.launches, c.bytes_read, c.bytes_written) == (4, 3 * 2 * 64 * 4, 3 * 2 * 64 * 4)
    for name in ("dispatch.sort", "dispatch.index_weights", "dispatch.histc", "dispatch.cumsum", "combine.arange",
                 "combine.index_put_"):
        assert ops[f"{p}.{name}"].launches == 1 and ops[f"{p}.{name}"].category == "other"
    routing = [o for path, o in ops.items() if path.startswith((f"{p}.router", f"{p}.dispatch", f"{p}.combine"))]
    assert sum(o.launches for o in routing) == 4 + 7 + 6 and len(routing) == 2 + 5 + 3
    # two experts reached, one row each; one grouped call for every gate/up, one for every down
    for j, calls in ((0, 1), (1, 0)):
        assert ops[f"{p}.experts.{j}.gate_proj"].launches == calls
        assert ops[f"{p}.experts.{j}.up_proj"].launches == 0  # gate and up in one 3-D weight
        assert ops[f"{p}.experts.{j}.down_proj"].launches == calls
        assert ops[f"{p}.experts.{j}.gate_proj"].flops == 2 * 1 * 64 * 96
    assert f"{p}.experts.2.gate_proj" not in ops


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


def test_random_model_width_depth_and_vocabulary_overrides() -> None:
    m = build_random_model("builtin:tiny-llama-medium@hidden=64@layers=2")
    assert (m.config.hidden_size, m.config.intermediate_size, m.config.num_hidden_layers) == (64, 176, 2)
    m = build_random_model("builtin:tiny-llama-medium@hidden=64@layers=1@vocab=1000")
    assert (m.config.vocab_size, m.lm_head.weight.shape, m.config.num_hidden_layers) == (1000, (1000, 64), 1)
    with pytest.raises(ValueError, match="only @layers=N, @hidden=N and @vocab=N"):
        build_random_model("builtin:tiny-llama-medium@width=64")
    with pytest.raises(ValueError, match="multiple of the 8 heads"):
        build_random_model("builtin:tiny-llama-medium@hidden=60")


_VIEWS = {"detach", "alias", "_unsafe_view", "view", "expand", "t", "transpose", "unsqueeze", "squeeze", "slice",
          "select", "permute", "as_strided", "reshape", "split", "chunk", "unbind", "narrow", "view_as", "expand_as",
          "contiguous", "flatten", "unflatten", "split_with_sizes", "movedim"}


def _family_configs(layers: int) -> dict[str, object]:
    t = transformers
    h = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
             vocab_size=256, max_position_embeddings=128)
    moe = dict(num_key_value_heads=2, num_experts_per_tok=2, **h)
    return {
        "llama": t.LlamaConfig(num_key_value_heads=2, **h),
        "mistral": t.MistralConfig(num_key_value_heads=2, sliding_window=8, **h),
        "qwen2": t.Qwen2Config(num_key_value_heads=2, **h),
        "qwen3": t.Qwen3Config(num_key_value_heads=2, head_dim=16, **h),
        "phi3": t.Phi3Config(pad_token_id=0, **h),
        "gemma": t.GemmaConfig(num_key_value_heads=1, head_dim=16, **h),
        "gemma2": t.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=8, **h),
        "gemma3_text": t.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, sliding_window=8, **h),
        "olmo": t.OlmoConfig(pad_token_id=0, **h),
        "olmo2": t.Olmo2Config(pad_token_id=0, **h),
        "granite": t.GraniteConfig(**h),
        "gpt2": t.GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=256, n_positions=128),
        "gpt_bigcode": t.GPTBigCodeConfig(n_embd=64, n_layer=layers, n_head=4, vocab_size=256, n_positions=128),
        "gpt_neox": t.GPTNeoXConfig(**h),
        "starcoder2": t.Starcoder2Config(num_key_value_heads=2, **h),
        "phi": t.PhiConfig(**h),
        "mixtral": t.MixtralConfig(num_local_experts=4, **moe),
        "qwen2_moe": t.Qwen2MoeConfig(num_experts=4, moe_intermediate_size=64, shared_expert_intermediate_size=128,
                                      **moe),
        "qwen3_moe": t.Qwen3MoeConfig(num_experts=4, moe_intermediate_size=64, head_dim=16, **moe),
        "deepseek_v3": t.DeepseekV3Config(n_routed_experts=4, moe_intermediate_size=32, n_shared_experts=1,
                                          first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=32,
                                          qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1,
                                          topk_group=1, **moe),
    }


def _real_kernel_calls(cfg: object, batch: int) -> int:
    """Non-view ATen calls of one decode forward of a random model built from ``cfg``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if not (func.is_view or func.overloadpacket.__name__ in _VIEWS):
                Count.n += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = torch.randint(4, 200, (batch, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        past = model(input_ids=ids, use_cache=True).past_key_values
        with Count():
            model(input_ids=ids[:, -1:], past_key_values=past, use_cache=True,
                  attention_mask=torch.ones(batch, 13, dtype=torch.long))
    return Count.n


def _analytic_kernel_calls(cfg: object, batch: int) -> int:
    ops = forward_ops(architecture_from_config(cfg), batch, 1, 12, "float32", "decode", 1)
    return sum(o.launches for o in ops if o.launches > 0 and (o.flops or o.bytes_read + o.bytes_written))


@pytest.mark.parametrize("family", sorted(_family_configs(1)))
def test_analytic_kernel_calls_per_layer_match_the_real_model(family: str) -> None:
    """Per layer, the kernel calls the analytic ops stand for are within 10 % of the ATen calls
    the family's own ``transformers`` code makes in a decode step (counted with a dispatch mode
    on a random 64-wide model, at 2 layers minus 1 layer, batch 1 and 4)."""
    one, two = _family_configs(1)[family], _family_configs(2)[family]
    for batch in (1, 4):
        real = _real_kernel_calls(two, batch) - _real_kernel_calls(one, batch)
        analytic = _analytic_kernel_calls(two, batch) - _analytic_kernel_calls(one, batch)
        assert 0.9 <= analytic / real <= 1.1, (family, batch, real, analytic)

"""The FLOPs counter's analytic model and the simulation's op lists agree to the FLOP.

Both read one :class:`~perfsdk.models.arch.Architecture`; these tests hold them to exact integer
equality per phase, for every bundled config and for a small config of each decoder family
``transformers`` ships that the reader supports, and check both against the meta-device count of
the real ``transformers`` modules and against hand formulas.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import transformers as tf
from click.testing import CliRunner

from perfsdk.flops.analytic import analytic_generate
from perfsdk.flops.meta import count_meta_generate, meta_model
from perfsdk.cli.flops import flops_command
from perfsdk.models.arch import Architecture, architecture_from_config
from perfsdk.models.resolve import bundled_config, bundled_names
from perfsdk.simulation.analytic import generation_ops
from perfsdk.cli.simulate import simulate_command

H, L, NH, KV, INTER, V = 64, 2, 4, 2, 128, 256
BASE = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=KV, intermediate_size=INTER,
            vocab_size=V, max_position_embeddings=128)

#: One small config per decoder family (GQA, MQA, sliding windows per layer, MoE with shared
#: experts and dense layers, latent attention, biases, tied embeddings, head_dim overrides).
FAMILIES: dict[str, Callable[[], Any]] = {
    "gpt2": lambda: tf.GPT2Config(n_embd=H, n_layer=L, n_head=NH, vocab_size=V, n_positions=128),
    "gpt_bigcode": lambda: tf.GPTBigCodeConfig(n_embd=H, n_layer=L, n_head=NH, vocab_size=V, n_positions=128,
                                               multi_query=True),
    "llama": lambda: tf.LlamaConfig(**BASE),
    "llama-biases-tied": lambda: tf.LlamaConfig(**BASE, attention_bias=True, mlp_bias=True, head_dim=32,
                                                tie_word_embeddings=True),
    "mistral": lambda: tf.MistralConfig(**BASE, sliding_window=4),
    "qwen2": lambda: tf.Qwen2Config(**{**BASE, "num_hidden_layers": 3}, use_sliding_window=True, sliding_window=4,
                                    max_window_layers=1),
    "mixtral": lambda: tf.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2),
    "phi3": lambda: tf.Phi3Config(**BASE, pad_token_id=0),
    "gemma": lambda: tf.GemmaConfig(**BASE, head_dim=32),
    "gemma2": lambda: tf.Gemma2Config(**BASE, head_dim=16, sliding_window=4),
    "gemma3_text": lambda: tf.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 3}, head_dim=16, sliding_window=4,
                                               sliding_window_pattern=2),
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(**{**BASE, "num_hidden_layers": 3}, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32, shared_expert_intermediate_size=96,
                                           mlp_only_layers=[1]),
    "qwen3": lambda: tf.Qwen3Config(**BASE, head_dim=16),
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(**BASE, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32, decoder_sparse_step=2),
    "olmo": lambda: tf.OlmoConfig(**BASE, pad_token_id=0),
    "olmo2": lambda: tf.Olmo2Config(**BASE, pad_token_id=0),
    "granite": lambda: tf.GraniteConfig(**BASE),
    "smollm3": lambda: tf.SmolLM3Config(**BASE, pad_token_id=0),
    "starcoder2": lambda: tf.Starcoder2Config(**BASE, sliding_window=4),
    "gpt_neox": lambda: tf.GPTNeoXConfig(**{k: v for k, v in BASE.items() if k != "num_key_value_heads"}),
    "phi": lambda: tf.PhiConfig(**BASE),
    "deepseek_v3": lambda: tf.DeepseekV3Config(
        **{**BASE, "num_hidden_layers": 3, "num_key_value_heads": NH}, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1),
}


def sim_flops(arch: Architecture, b: int, t: int, g: int) -> dict[str, int]:
    out = {"encode": 0, "prefill": 0, "decode": 0}
    for op in generation_ops(arch, b, t, g, "bfloat16"):
        out[op.phase] += op.flops
    return out


def flops_by_phase(arch: Architecture, b: int, t: int, g: int) -> dict[str, int]:
    a = analytic_generate(arch, b, t, g)
    assert a.flops_total == a.flops_encode + a.flops_prefill + a.flops_decode
    return {"encode": a.flops_encode, "prefill": a.flops_prefill, "decode": a.flops_decode}


@pytest.mark.parametrize("name", bundled_names())
def test_bundled_configs_agree(name: str) -> None:
    arch = architecture_from_config(bundled_config(name))
    for b, t, g in ((1, 9, 4), (3, 5, 2)):
        assert sim_flops(arch, b, t, g) == flops_by_phase(arch, b, t, g)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decoder_families_agree_with_each_other_and_the_meta_count(family: str) -> None:
    cfg = FAMILIES[family]()
    arch = architecture_from_config(cfg)
    b, t, g = 2, 6, 4  # decode reaches past the 4-position windows
    expected = flops_by_phase(arch, b, t, g)
    assert sim_flops(arch, b, t, g) == expected
    # the real transformers modules on the meta device count the same
    attn = "eager" if family == "gemma2" else "sdpa"  # Gemma2 has no SDPA path
    model = meta_model(cfg, attn_implementation=attn)
    meta = count_meta_generate(model, b, t, g, exact=True)
    assert {"encode": meta.flops_encode, "prefill": meta.flops_prefill, "decode": meta.flops_decode} == expected
    # and the architecture's weights are the module's parameters, every one (biases, norms, experts)
    assert arch.param_count() == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_hand_formula_llama_2_7b_and_mixtral() -> None:
    # Llama-2-7B, batch 1, 16 input, 3 output tokens
    d, i, layers, vocab = 4096, 11008, 32, 32000
    per_token = layers * (4 * d * d + 3 * d * i)
    prefill = 16 * per_token + layers * 32 * 16 * 16 * (128 + 128) + d * vocab
    decode = sum(per_token + layers * 32 * (16 + k) * (128 + 128) + d * vocab for k in (1, 2))
    a = analytic_generate(bundled_config("llama-2-7b"), 1, 16, 3)
    assert (a.macs_prefill, a.macs_decode) == (prefill, decode)
    # Mixtral 8x7B: 8 KV heads, top-2 of 8 experts and the router, per token
    m = architecture_from_config(bundled_config("mixtral-8x7b"))
    assert m.layer_linear_macs(0) == 2 * d * d + 2 * d * 8 * 128 + 2 * 3 * d * 14336 + d * 8


def test_tiny_llava_vision_tower_hand_formula() -> None:
    b, t, g = 2, 8, 3
    a = analytic_generate(bundled_config("tiny-llava"), b, t, g)
    # per image: a 8x8x3 -> 64 patch convolution over (32/8)^2 = 16 patches; 2 CLIP layers over
    # 17 positions (patches + class token): q, k, v, o (64x64) and fc1, fc2 (64x128); attention
    # 4 heads x 17 x 17 x (16 + 16); the projector (64x64, 64x64) over the 16 image tokens kept
    conv = 16 * (3 * 8 * 8) * 64
    layer = 17 * (4 * 64 * 64 + 2 * 64 * 128) + 4 * 17 * 17 * (16 + 16)
    projector = 16 * (64 * 64 + 64 * 64)
    per_image = conv + 2 * layer + projector
    assert per_image == 1_515_776
    assert a.macs_encode == b * per_image and a.flops_encode == 2 * b * per_image == 6_063_104
    # the text model's prompt: 8 text tokens + 16 image tokens
    assert (a.images, a.image_tokens, a.prompt_tokens) == (1, 16, 24)
    text = architecture_from_config(bundled_config("tiny-llava"))
    per_token = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)
    assert text.linear_macs_per_token() == per_token
    assert a.macs_prefill == b * (24 * per_token + 2 * 4 * 24 * 24 * 32 + 64 * 4096)
    assert a.flops_total == a.flops_encode + a.flops_prefill + a.flops_decode
    # two images per sequence: twice the vision work, 16 more prompt positions
    two = analytic_generate(bundled_config("tiny-llava"), b, t, g, images=2)
    assert two.macs_encode == 2 * b * per_image and two.prompt_tokens == 40


def test_tiny_t5_encoder_in_encode_and_cross_attention() -> None:
    b, t, g = 2, 7, 4
    a = analytic_generate(bundled_config("tiny-t5"), b, t, g)
    # encoder: 2 layers over 7 positions: q, k, v, o (64x64) and gated-gelu wi_0, wi_1, wo (64x128);
    # bidirectional attention 4 heads x 7 x 7 x (16 + 16)
    enc_layer = t * (4 * 64 * 64 + 3 * 64 * 128) + 4 * t * t * 32
    assert a.macs_encode == b * 2 * enc_layer == 2 * 2 * 292_992
    assert a.encoder_tokens == t and a.prompt_tokens == 1
    # first decoder forward: one position, self-attention over 1 key, cross-attention keys and
    # values of the 7 encoder positions projected once, cross-attention over 7 keys, lm_head
    dec_token = 4 * 64 * 64 + 2 * 64 * 64 + 3 * 64 * 128  # self q,k,v,o + cross q,o + MLP
    prefill = 2 * (dec_token + 4 * 1 * 32 + 2 * t * 64 * 64 + 4 * t * 32) + 64 * 4096
    assert a.macs_prefill == b * prefill
    decode = sum(2 * (dec_token + 4 * (1 + k) * 32 + 4 * t * 32) + 64 * 4096 for k in range(1, g))
    assert a.macs_decode == b * decode
    assert a.flops_total == a.flops_encode + a.flops_prefill + a.flops_decode


@pytest.mark.parametrize("model", ["tiny-llava", "tiny-t5", "builtin:tiny-llava"])
def test_flops_and_simulate_commands_report_encode(model: str) -> None:
    r = CliRunner().invoke(flops_command, [model, "-t", "8", "-g", "4", "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.output)
    a = analytic_generate(bundled_config(model.removeprefix("builtin:")), 1, 8, 4)
    # the meta-device count of the real modules equals the analytic model, phase by phase
    assert (f["flops_encode"], f["flops_prefill"], f["flops_decode"]) == (a.flops_encode, a.flops_prefill,
                                                                       a.flops_decode)
    assert f["flops_total"] == f["flops_encode"] + f["flops_prefill"] + f["flops_decode"]
    assert f["method"] == "meta-device capture" and f["deviation_pct"] == 0.0
    r = CliRunner().invoke(simulate_command, ["--model", model, "--input-tokens", "8", "--output-tokens", "4",
                                              "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert list(s["phases"]) == ["encode", "prefill", "decode"]
    assert s["phases"]["encode"]["flops"] == a.flops_encode and s["phases"]["prefill"]["flops"] == a.flops_prefill
    assert s["ttft_s"] == pytest.approx(s["phases"]["encode"]["time_s"] + s["phases"]["prefill"]["time_s"])
    assert any(layer["phase"] == "encode" for layer in s["layers"])


def test_collector_analytic_value_of_a_vlm_step_counts_its_images() -> None:
    import torch

    import perfsdk

    cfg = tf.LlavaConfig(**{k: v for k, v in bundled_config("tiny-llava").items()
                            if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = tf.LlavaForConditionalGeneration(cfg).eval()
    # the processor's input_ids: 16 image tokens (id 4095) then 5 text tokens, one image each
    ids = torch.cat([torch.full((2, 16), 4095), torch.randint(5, 100, (2, 5))], 1)
    with perfsdk.session({"collectors": {"flops": {}, "utilization": False, "energy": False}}, store=None) as s:
        s.load(model=model)
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=torch.randn(2, 3, 32, 32),
                   max_new_tokens=3, min_new_tokens=3, do_sample=False)
    f = s.result.collectors["flops"]
    expected = analytic_generate(cfg, 2, 5, 3, images=1).flops_total
    assert f["analytic_flops_total"] == expected == f["flops_total"] and f["deviation_pct"] == 0.0
    assert s.result.model is not None and (s.result.model.model_type, s.result.model.num_layers) == ("llava", 2)


@pytest.mark.parametrize("model", ["gpt2", "tiny-llava", "tiny-t5"])
def test_plain_forward_on_the_meta_device(model: str) -> None:
    from perfsdk.flops.meta import count_config
    from perfsdk.models.resolve import resolve_config

    cfg, _ = resolve_config(model)
    c = count_config(cfg, 2, 6, 0)
    a = analytic_generate(cfg, 2, 6, 0)  # one forward, logits for every position
    assert c.method == "meta-device capture"
    assert (c.flops_encode, c.flops_forward) == (a.flops_encode, a.flops_prefill) and c.flops_total == a.flops_total

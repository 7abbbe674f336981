"""ptflops / fvcore / analytic backends, meta-device configs and quantized models."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from perfsdk.flops.analytic import analytic_generate
from perfsdk.flops.counter import count_analytic, count_generate, count_third_party, is_quantized
from perfsdk.flops.meta import (
    UnknownModel,
    bundled_names,
    count_config,
    count_meta_generate,
    meta_copy,
    meta_model,
    resolve_config,
)
from perfsdk.models.arch import architecture_from_config


def tiny(attn: str = "sdpa") -> LlamaForCausalLM:
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=256, attn_implementation=attn)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("backend", ["ptflops", "fvcore"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_third_party_converted_and_labeled(backend: str, attn: str) -> None:
    b, t, g = 2, 5, 3
    model = tiny(attn)
    c = count_third_party(backend, model, b, t, g)
    assert c.backend == backend and "MACs x 2" in c.method
    assert c.flops_total == 2 * c.macs_total
    assert any("multiply-adds" in n for n in c.notes)
    # nothing silently dropped: the decode steps' attention fill is always reported
    assert any("attention over the KV cache" in n for n in c.notes)
    # their linear counts are exact for Llama, so with the fills the total is the analytic value
    assert c.flops_total == analytic_generate(model.config, b, t, g).flops_total


def test_fvcore_misses_fused_sdpa_and_says_so() -> None:
    c = count_third_party("fvcore", tiny("sdpa"), 1, 4, 1)
    assert any("did not count the (fused SDPA) attention" in n for n in c.notes)
    eager = count_third_party("fvcore", tiny("eager"), 1, 4, 1)
    assert not any("did not count" in n for n in eager.notes)


def test_analytic_backend() -> None:
    cfg = tiny().config
    c = count_analytic(cfg, 1, 4, 3)
    a = analytic_generate(cfg, 1, 4, 3)
    assert (c.backend, c.method) == ("analytic", "analytic")
    assert (c.flops_prefill, c.flops_decode, c.macs_total) == (a.flops_prefill, a.flops_decode, a.macs_total)
    assert a.decode_forwards == 2


def test_bundled_configs_have_published_values() -> None:
    assert set(bundled_names()) >= {"gpt2", "llama-2-7b", "llama-3-8b", "llama-3-70b", "mistral-7b", "mixtral-8x7b",
                                    "qwen2-7b"}
    expect = {
        "llama-2-7b": (4096, 32, 32, 32, 11008, 32000),
        "llama-3-8b": (4096, 32, 32, 8, 14336, 128256),
        "llama-3-70b": (8192, 80, 64, 8, 28672, 128256),
        "mistral-7b": (4096, 32, 32, 8, 14336, 32000),
        "mixtral-8x7b": (4096, 32, 32, 8, 14336, 32000),
        "qwen2-7b": (3584, 28, 28, 4, 18944, 152064),
        "gpt2": (768, 12, 12, 12, 3072, 50257),
    }
    for name, dims in expect.items():
        cfg, source = resolve_config(name)
        s = architecture_from_config(cfg)
        assert source == f"bundled:{name}"
        assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.intermediate_size, s.vocab_size) == dims
    assert architecture_from_config(resolve_config("mixtral-8x7b")[0]).experts_per_token == 2
    assert architecture_from_config(resolve_config("mistral-7b")[0]).sliding_windows[0] == 4096
    assert architecture_from_config(resolve_config("qwen2-7b")[0]).sliding_windows == ()
    assert architecture_from_config(resolve_config("gpt2")[0]).tie_word_embeddings


def test_resolve_folder_file_builtin_and_unknown(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tiny().config
    cfg.save_pretrained(tmp_path)
    from_dir, src = resolve_config(str(tmp_path))
    assert src.startswith("file:") and from_dir.hidden_size == 64
    assert resolve_config(str(tmp_path / "config.json"))[0].num_key_value_heads == 2
    with pytest.raises(UnknownModel, match="bundled configs"):
        resolve_config("no-such-model")
    tiny_cfg, src = resolve_config("builtin:tiny-llama")
    assert src == "builtin" and tiny_cfg.model_type == "llama"


def test_meta_count_of_a_7b_config_is_exact_and_weightless() -> None:
    cfg, _ = resolve_config("llama-2-7b")
    model = meta_model(cfg)
    assert all(p.device.type == "meta" for p in model.parameters())
    c = count_meta_generate(model, 1, 16, 8)
    a = analytic_generate(cfg, 1, 16, 8)
    assert c.flops_total == a.flops_total
    # 2 x non-embedding matmul params per token + attention + lm_head, for the prefill
    params = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert c.macs_prefill == 16 * params + 32 * 16 * 16 * 2 * 4096 + 4096 * 32000


def test_gpt2_meta_count_matches_analytic() -> None:
    cfg, _ = resolve_config("gpt2")
    c = count_config(cfg, 1, 8, 3)
    assert c.method == "meta-device capture"
    assert c.flops_total == analytic_generate(cfg, 1, 8, 3).flops_total


def test_quantized_dynamic_int8_counted_from_unquantized_shapes() -> None:
    import warnings

    model = tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    assert is_quantized(q) == "dynamic-int8" and is_quantized(model) is None
    ids = torch.randint(1, 256, (2, 5))
    _, real = count_generate(tiny(), input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                             min_new_tokens=3, do_sample=False, pad_token_id=0)
    meta = count_meta_generate(meta_copy(q), 2, 5, 3)
    assert meta.flops_total == real.flops_total and meta.flops_total > 0
    json.dumps(meta.top_modules())


def test_layer_replication_equals_full_depth() -> None:
    cfg, _ = resolve_config("gpt2")
    fast = count_config(cfg, 2, 9, 5)
    full = count_config(cfg, 2, 9, 5, full_depth=True)
    assert any("replicated" in n for n in fast.notes)
    assert (fast.flops_prefill, fast.flops_decode, fast.macs_total) == (full.flops_prefill, full.flops_decode,
                                                                          full.macs_total)
    assert fast.modules == full.modules and fast.categories == full.categories and fast.forwards == full.forwards
    assert len([m for m in fast.modules if m.startswith("transformer.h.")]) == 12 * 5  # attention, c_attn, attn c_proj, c_fc, mlp c_proj

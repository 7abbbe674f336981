"""Exact-integer FLOPs: counted prefill/decode/total equal hand-computed values (torch backend)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM

from perfsdk.flops.analytic import analytic_forward, analytic_generate
from perfsdk.flops.counter import count_forward, count_generate, deviation_pct
from perfsdk.flops.meta import count_meta_generate, meta_copy
from perfsdk.models.arch import architecture_from_config

HID, LAYERS, HEADS, INTER, VOCAB = 64, 2, 4, 128, 256
HEAD_DIM = HID // HEADS


def llama(attn: str, kv_heads: int = 2, tie: bool = False) -> LlamaForCausalLM:
    cfg = LlamaConfig(hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=kv_heads, intermediate_size=INTER, vocab_size=VOCAB,
                      max_position_embeddings=256, tie_word_embeddings=tie, attn_implementation=attn)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def hand_macs(b: int, new: int, ctx: int, logits: int, kv_heads: int) -> int:
    """Multiply-adds of one forward, written out layer by layer."""
    q = HID * HEADS * HEAD_DIM
    k = HID * kv_heads * HEAD_DIM
    v = HID * kv_heads * HEAD_DIM
    o = HEADS * HEAD_DIM * HID
    mlp = 3 * HID * INTER  # gate, up, down
    per_layer_linear = b * new * (q + k + v + o + mlp)
    qk = b * HEADS * new * ctx * HEAD_DIM  # full product, no causal halving
    pv = b * HEADS * new * ctx * HEAD_DIM
    lm_head = b * logits * HID * VOCAB
    return LAYERS * (per_layer_linear + qk + pv) + lm_head


def gen_kwargs(b: int, t: int, g: int) -> dict:
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (b, t))
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=g, min_new_tokens=g,
                do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_generate_prefill_decode_total_exact(attn: str) -> None:
    b, t, g = 2, 5, 4
    _, c = count_generate(llama(attn), **gen_kwargs(b, t, g))
    prefill = hand_macs(b, t, t, 1, 2)  # generate keeps the last position's logits only
    decode = sum(hand_macs(b, 1, t + k, 1, 2) for k in range(1, g))  # G - 1 decode forwards
    # written-out integers for this configuration
    assert prefill == 782_848 and decode == 551_424
    assert c.macs_prefill == prefill
    assert c.macs_decode == decode
    assert c.flops_prefill == 2 * prefill and c.flops_decode == 2 * decode
    assert c.flops_total == 2 * (prefill + decode) == 2 * c.macs_total
    assert c.decode_forwards == g - 1
    assert [f["context_len"] for f in c.forwards] == [t, t + 1, t + 2, t + 3]
    assert c.categories["attention"] == 2 * LAYERS * (2 * b * HEADS * t * t * HEAD_DIM) + 2 * sum(
        LAYERS * 2 * b * HEADS * (t + k) * HEAD_DIM for k in range(1, g))
    a = analytic_generate(llama(attn).config, b, t, g)
    assert a.flops_total == c.flops_total and deviation_pct(c.flops_total, a.flops_total) == 0.0


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_plain_forward_exact(attn: str) -> None:
    b, t = 3, 7
    c = count_forward(llama(attn), input_ids=torch.randint(0, VOCAB, (b, t)))
    assert c.macs_forward == hand_macs(b, t, t, t, 2)  # a plain forward computes every position's logits
    assert c.flops_forward == 2 * c.macs_forward
    assert analytic_forward(llama(attn).config, b, t).flops_total == c.flops_total


def test_gqa_kv_projections_sized_by_kv_heads() -> None:
    b, t = 1, 4
    mha = count_forward(llama("sdpa", kv_heads=4), input_ids=torch.zeros((b, t), dtype=torch.long))
    gqa = count_forward(llama("sdpa", kv_heads=1), input_ids=torch.zeros((b, t), dtype=torch.long))
    assert mha.macs_total == hand_macs(b, t, t, t, 4)
    assert gqa.macs_total == hand_macs(b, t, t, t, 1)
    # k and v projections shrink from 4 to 1 head; attention keeps the 4 query heads
    assert mha.macs_total - gqa.macs_total == LAYERS * b * t * 2 * HID * 3 * HEAD_DIM
    arch = architecture_from_config(llama("sdpa", kv_heads=1).config)
    assert arch.num_kv_heads == 1
    assert sum(l.macs for l in arch.attention_linears()) == HID * HID * 2 + 2 * HID * HEAD_DIM


def test_tied_embeddings_still_count_lm_head() -> None:
    b, t, g = 1, 3, 2
    tied = llama("sdpa", tie=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    _, c = count_generate(tied, **gen_kwargs(b, t, g))
    assert c.macs_total == hand_macs(b, t, t, 1, 2) + hand_macs(b, 1, t + 1, 1, 2)
    assert c.modules["lm_head"] == 2 * 2 * b * HID * VOCAB
    assert analytic_generate(tied.config, b, t, g).flops_total == c.flops_total


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_meta_equals_real(attn: str) -> None:
    b, t, g = 2, 5, 4
    model = llama(attn)
    _, real = count_generate(model, **gen_kwargs(b, t, g))
    meta = count_meta_generate(meta_copy(model), b, t, g)
    assert (meta.flops_prefill, meta.flops_decode, meta.macs_total) == (real.flops_prefill, real.flops_decode,
                                                                          real.macs_total)
    assert meta.modules == real.modules
    # long generations: decode summed in closed form equals every step counted
    fast = count_meta_generate(meta_copy(model), b, t, 20)
    slow = count_meta_generate(meta_copy(model), b, t, 20, exact=True)
    assert fast.flops_decode == slow.flops_decode and fast.modules == slow.modules
    assert fast.flops_total == analytic_generate(model.config, b, t, 20).flops_total


def test_sliding_window_caps_decode_context() -> None:
    b, t, g, w = 2, 6, 6, 4
    cfg = MistralConfig(hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                        intermediate_size=INTER, vocab_size=VOCAB, sliding_window=w, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).eval()
    _, c = count_generate(model, **gen_kwargs(b, t, g))
    assert c.macs_prefill == hand_macs(b, t, t, 1, 2)  # prefill computes the full (masked) product
    assert c.macs_decode == (g - 1) * hand_macs(b, 1, w, 1, 2)  # decode attends the window only
    assert analytic_generate(cfg, b, t, g).flops_total == c.flops_total
    assert count_meta_generate(meta_copy(model), b, t, g).flops_total == c.flops_total


def test_moe_counts_active_experts_and_router() -> None:
    b, t, g, experts, k, inter = 2, 5, 3, 4, 2, 96
    cfg = MixtralConfig(hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                        intermediate_size=inter, vocab_size=VOCAB, num_local_experts=experts, num_experts_per_tok=k)
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg).eval()
    _, c = count_generate(model, **gen_kwargs(b, t, g))

    def fwd(new: int, ctx: int) -> int:
        attn_proj = HID * HID * 2 + 2 * HID * 2 * HEAD_DIM
        moe = k * 3 * HID * inter + HID * experts  # active experts + router
        return LAYERS * (b * new * (attn_proj + moe) + 2 * b * HEADS * new * ctx * HEAD_DIM) + b * HID * VOCAB

    assert c.macs_prefill == fwd(t, t)
    assert c.macs_decode == fwd(1, t + 1) + fwd(1, t + 2)
    assert analytic_generate(cfg, b, t, g).flops_total == c.flops_total

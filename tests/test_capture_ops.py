"""Operation capture: module paths, categories, exact FLOPs, phases, hooks removed."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from perfsdk.capture import (
    OperationCapture,
    attention_macs,
    attention_scores,
    broadcast_attention_extra,
    capture_generate,
    forwards_summary,
    matmul_macs,
    totals_by_category,
    totals_by_module,
    totals_by_module_type,
    totals_by_phase,
)

H, L, NH, NKV, I, V = 64, 2, 4, 2, 128, 256
D = H // NH


def tiny(attn: str = "sdpa", device: str = "cpu") -> LlamaForCausalLM:
    cfg = LlamaConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV,
                      intermediate_size=I, vocab_size=V, max_position_embeddings=256, attn_implementation=attn)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.eval()


def test_shape_helpers() -> None:
    assert matmul_macs((2, 3), (3, 5)) == 30
    assert matmul_macs((4, 2, 3), (3, 5)) == 120
    assert matmul_macs((3,), (3,)) == 3
    assert attention_macs((2, 4, 7, 16), (2, 2, 9, 16), (2, 2, 9, 16)) == 2 * 4 * 7 * 9 * 32
    assert attention_scores((2, 4, 7, 16), (2, 2, 9, 16)) == 2 * 4 * 7 * 9


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("grad_mode", ["inference", "no_grad"])
def test_forward_records(attn: str, grad_mode: str) -> None:
    model = tiny(attn)
    b, t = 2, 7
    ids = torch.randint(0, V, (b, t))
    ctx = torch.inference_mode() if grad_mode == "inference" else torch.no_grad()
    with ctx, OperationCapture(model) as cap:
        model(input_ids=ids)
    q = [r for r in cap.records if r.module_path == "model.layers.0.self_attn.q_proj" and r.flops]
    assert len(q) == 1
    assert q[0].category == "matmul" and q[0].module_type == "Linear" and q[0].phase == "forward"
    assert q[0].macs == b * t * H * H and q[0].flops == 2 * q[0].macs
    assert q[0].weight_bytes == H * H * 4
    att = [r for r in cap.records if r.category == "attention" and r.module_path == "model.layers.1.self_attn"]
    assert sum(r.flops for r in att) == 2 * 2 * b * NH * t * t * D
    assert all(r.kv_bytes > 0 for r in att)
    # the softmax over the scores: inside the fused kernel (its score elements), or its own op
    scores = b * NH * t * t
    if attn == "sdpa":
        assert [r.elements for r in att] == [scores]
    else:
        assert all(r.elements == 0 for r in att)
        soft = [r for r in cap.records if r.category == "softmax" and r.module_path == "model.layers.1.self_attn"]
        assert [r.elements for r in soft] == [scores]
    emb = [r for r in cap.records if r.category == "embedding"]
    assert len(emb) == 1 and emb[0].weight_bytes == b * t * H * 4 and emb[0].elements == b * t * H
    assert any(r.category == "norm" and r.module_type == "LlamaRMSNorm" for r in cap.records)
    assert any(r.category == "activation" for r in cap.records)
    # every record: FLOPs are twice the MACs
    assert all(r.flops == 2 * r.macs for r in cap.records)
    lin = (H * H * 2 + 2 * H * NKV * D + 3 * H * I) * L + H * V
    assert cap.flops == 2 * b * t * lin + L * 2 * 2 * b * NH * t * t * D
    # hooks are gone afterwards
    assert not model._forward_pre_hooks and not model.model.layers[0]._forward_hooks


def test_meta_equals_real() -> None:
    ids = torch.randint(0, V, (1, 5))
    with torch.inference_mode(), OperationCapture(tiny("sdpa")) as real:
        real.model(input_ids=ids)  # type: ignore[misc]
    meta_model = tiny("sdpa", "meta")
    with torch.no_grad(), OperationCapture(meta_model) as meta:
        meta_model(input_ids=ids.to("meta"))
    assert meta.flops == real.flops and meta.macs == real.macs
    assert totals_by_category(meta.records)["attention"]["flops"] == totals_by_category(real.records)["attention"]["flops"]


def test_generate_phases_and_context() -> None:
    model = tiny("sdpa")
    b, t, g = 2, 6, 4
    ids = torch.randint(0, V, (b, t))
    _, cap = capture_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=g,
                              min_new_tokens=g, do_sample=False, pad_token_id=0)
    rows = forwards_summary(cap.records)
    assert [(r["phase"], r["step"], r["context_len"]) for r in rows] == [
        ("prefill", 0, t), ("decode", 1, t + 1), ("decode", 2, t + 2), ("decode", 3, t + 3)]
    lin = (H * H * 2 + 2 * H * NKV * D + 3 * H * I) * L
    head = H * V  # generate keeps the logits of the last position only
    assert rows[0]["macs"] == b * t * lin + b * head + L * b * NH * t * t * 2 * D
    for r in rows[1:]:
        assert r["macs"] == b * lin + b * head + L * b * NH * r["context_len"] * 2 * D
    phases = totals_by_phase(cap.records)
    assert phases["total"]["flops"] == phases["prefill"]["flops"] + phases["decode"]["flops"]
    assert len(cap.forwards) == g


def test_set_phase_and_aggregations() -> None:
    model = tiny("eager")
    ids = torch.randint(0, V, (1, 3))
    with torch.inference_mode(), OperationCapture(model) as cap:
        cap.set_phase("decode", step=3, context_len=130)
        model(input_ids=ids)
    assert {(r.phase, r.step, r.context_len) for r in cap.records} == {("decode", 3, 130)}
    top = totals_by_module(cap.records, top=1)
    assert top[0][0] == "lm_head"
    by_type = totals_by_module_type(cap.records)
    assert by_type["Linear"]["flops"] == 2 * 3 * ((H * H * 2 + 2 * H * NKV * D + 3 * H * I) * L + H * V)
    per_layer = dict(totals_by_module(cap.records, depth=3))
    assert per_layer["model.layers.0"]["flops"] == per_layer["model.layers.1"]["flops"] > 0


def test_hooks_removed_on_error() -> None:
    model = tiny("sdpa")
    with pytest.raises(RuntimeError):
        with torch.inference_mode(), OperationCapture(model):
            model(input_ids=torch.randint(0, V, (1, 3)))
            raise RuntimeError("boom")
    assert not model._forward_pre_hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    # a failing forward inside the block also leaves no hooks behind
    with pytest.raises(Exception):
        with OperationCapture(model):
            model(input_ids=torch.full((1, 3), V + 5))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_nested_captures_both_record_everything() -> None:
    model = tiny("sdpa")
    ids = torch.randint(0, V, (1, 5))
    with torch.inference_mode(), OperationCapture(model) as outer, OperationCapture(model) as inner:
        model(input_ids=ids)
    with torch.inference_mode(), OperationCapture(model) as alone:
        model(input_ids=ids)
    assert outer.flops == inner.flops == alone.flops > 0
    assert len(outer.records) == len(inner.records) == len(alone.records)


class _MultiQueryAttention(torch.nn.Module):
    """Multi-query attention written against SDPA directly: one key/value head broadcast to the
    query heads, with or without ``enable_gqa`` (as Falcon's own code calls it: without)."""

    def __init__(self, gqa: bool, masked: bool) -> None:
        super().__init__()
        self.gqa, self.masked = gqa, masked

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(q.shape[0], 1, q.shape[2], k.shape[2]) if self.masked else None
        kw = {"enable_gqa": True} if self.gqa else {}
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_broadcast_key_value_heads_are_priced_as_the_unfused_path(batch: int, masked: bool) -> None:
    hq, lq, s, d = 4, 1, 24, 16
    q, k, v = torch.randn(batch, hq, lq, d), torch.randn(batch, 1, s, d), torch.randn(batch, 1, s, d)
    records = {}
    for gqa in (True, False):
        mod = _MultiQueryAttention(gqa, masked)
        with torch.inference_mode(), OperationCapture(mod) as cap:
            mod(q, k, v)
        (records[gqa],) = [r for r in cap.records if r.category == "attention"]
    fused, unfused = records[True], records[False]
    nq, nk, nv, scores, nm = batch * hq * lq * d, batch * s * d, batch * s * d, batch * hq * lq * s, batch * lq * s
    # the fused kernel (enable_gqa): Q, K, V and the mask read, the output written, one call
    assert fused.bytes_read == 4 * (nq + nk + nv + (nm if masked else 0))
    assert fused.bytes_written == 4 * nq
    assert fused.launches == 1
    # the same FLOPs and KV bytes either way
    assert unfused.flops == fused.flops == 2 * scores * 2 * d
    assert unfused.kv_bytes == fused.kv_bytes == 4 * (nk + nv)
    # the math path: Q and K scaled, the scores written and read three times each, and with more
    # than one sequence K and V copied out to the four query heads, the products reading the copies
    copies_read = (nk + nv) * hq if batch > 1 else 0
    copies_written = (nk + nv) * hq if batch > 1 else 0
    assert unfused.bytes_read == fused.bytes_read + 4 * (nq + nk + 3 * scores + copies_read)
    assert unfused.bytes_written == fused.bytes_written + 4 * (nq + nk + 3 * scores + copies_written)
    # scale Q, scale K, QK^T, (mask), softmax, PV, and (batch > 1) the two copies
    assert unfused.launches == 5 + int(masked) + (2 if batch > 1 else 0)
    assert broadcast_attention_extra((batch, hq, lq, d), (batch, 1, s, d), (batch, 1, s, d), masked)[2] \
        == unfused.launches - 1

"""Analytic operation lists: the ops a decoder-only transformer executes, without running it.

The fast path of ``perfsdk simulate``: from a :class:`ModelShape`, a batch size and token
counts it emits one :class:`~perfsdk.ops.OpRecord` per operation of the prefill (step 0) and of
every decode step (steps 1..G-1, each generating one token per sequence), with the same
conventions as operation capture: ``flops`` = 2 per multiply-add, ``bytes_read`` includes weights
and KV cache, ``kv_bytes`` is the KV-cache part. Module paths follow the Llama layout of
``transformers`` (``model.layers.N.self_attn.q_proj`` ...).

Conventions follow :mod:`perfsdk.capture`: attention counts the full QK^T and PV products over
every (query, key) pair handed to the kernel (no causal halving; GQA counted with the query
heads), and normalization, activation, softmax and other elementwise ops carry no FLOPs, only
``elements`` (output elements) and bytes.

Modelled: GQA (KV heads), sliding-window attention (the KV cache, and so the keys read, is capped
at the window), MoE (router, then only the experts
the batch's tokens reach, ``E * (1 - (1 - k/E)^tokens)`` of them in expectation), and the language
model head on the last position only (as ``generate`` does). The KV cache grows by
concatenation, as ``transformers``' ``DynamicCache`` does (each decode step reads and rewrites
the cache); ``ModelShape.kv_concat=False`` models a preallocated cache written in place.
"""

from __future__ import annotations

import math

from perfsdk.hardware.profile import DTYPE_BYTES, DTYPE_KEYS
from perfsdk.ops import OpRecord, Phase
from perfsdk.simulation.shape import ModelShape


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a torch dtype name (``bfloat16`` -> 2)."""
    key = DTYPE_KEYS.get(dtype.removeprefix("torch.").lower())
    if key is None:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[key]


def expected_active_experts(num_experts: int, top_k: int, tokens: int) -> int:
    """Distinct experts reached when ``tokens`` tokens each pick ``top_k`` of ``num_experts``."""
    if num_experts <= 0 or tokens <= 0:
        return 0
    p_untouched = (1.0 - top_k / num_experts) ** tokens
    return max(min(top_k, num_experts), min(num_experts, math.ceil(num_experts * (1.0 - p_untouched) - 1e-9)))


class _Emitter:
    def __init__(self, dtype: str, phase: Phase, step: int, context_len: int) -> None:
        self.dtype = dtype
        self.s = dtype_bytes(dtype)
        self.phase = phase
        self.step = step
        self.context_len = context_len
        self.ops: list[OpRecord] = []

    def _add(self, **kw: object) -> None:
        self.ops.append(OpRecord(phase=self.phase, step=self.step, dtype=self.dtype,
                                 context_len=self.context_len, **kw))  # type: ignore[arg-type]

    def linear(self, path: str, batch: int, tokens: int, k: int, n: int, rows: float | None = None) -> None:
        """``[rows, k] @ [k, n]``; ``rows`` defaults to batch * tokens (MoE passes a fraction)."""
        m = batch * tokens if rows is None else rows
        s = self.s
        w = int(k * n * s)
        self._add(module_path=path, op="linear", category="matmul", module_type="Linear",
                  input_shapes=[(batch, tokens, k)], output_shape=(batch, tokens, n),
                  flops=int(2 * m * k * n), macs=int(m * k * n), weight_bytes=w,
                  bytes_read=w + int(m * k * s), bytes_written=int(m * n * s), elements=int(m * n))

    def norm(self, path: str, batch: int, tokens: int, h: int, kind: str) -> None:
        e = batch * tokens * h
        s = self.s
        w = int(h * s * (2 if kind == "layer" else 1))
        self._add(module_path=path, op="rms_norm" if kind == "rms" else "layer_norm", category="norm",
                  module_type="RMSNorm" if kind == "rms" else "LayerNorm",
                  input_shapes=[(batch, tokens, h)], output_shape=(batch, tokens, h),
                  weight_bytes=w, bytes_read=int(e * s) + w, bytes_written=int(e * s), elements=e)

    def pointwise(self, path: str, op: str, category: str, shape: tuple[int, ...], inputs: int,
                  elements: int | None = None) -> None:
        e = elements if elements is not None else math.prod(shape)
        s = self.s
        self._add(module_path=path, op=op, category=category, input_shapes=[shape] * inputs, output_shape=shape,
                  bytes_read=int(inputs * e * s), bytes_written=int(e * s), elements=e)

    def attention(self, path: str, batch: int, tokens: int, past: int, m: ModelShape) -> None:
        """Scaled-dot-product attention of ``tokens`` new queries over ``past + tokens`` keys."""
        s = self.s
        hd, nh, nkv = m.head_dim, m.num_heads, m.num_kv_heads
        w = m.sliding_window
        kv_len = min(past + tokens, w) if w else past + tokens  # keys handed to the kernel
        score_elems = batch * nh * tokens * kv_len
        kv = int(2 * batch * nkv * kv_len * hd * s)
        q_bytes = int(batch * nh * tokens * hd * s)
        self._add(module_path=path, op="scaled_dot_product_attention", category="attention",
                  module_type="Attention",
                  input_shapes=[(batch, nh, tokens, hd), (batch, nkv, kv_len, hd), (batch, nkv, kv_len, hd)],
                  output_shape=(batch, nh, tokens, hd),
                  flops=4 * score_elems * hd, macs=2 * score_elems * hd,
                  bytes_read=q_bytes + kv, kv_bytes=kv,
                  bytes_written=q_bytes + int(2 * batch * nkv * tokens * hd * s), elements=score_elems)


def _layer(e: _Emitter, m: ModelShape, li: int, batch: int, tokens: int, past: int) -> None:
    h = m.hidden_size
    p = f"model.layers.{li}"
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    e.norm(f"{p}.input_layernorm", batch, tokens, h, m.norm)
    e.linear(f"{p}.self_attn.q_proj", batch, tokens, h, q_out)
    e.linear(f"{p}.self_attn.k_proj", batch, tokens, h, kv_out)
    e.linear(f"{p}.self_attn.v_proj", batch, tokens, h, kv_out)
    e.pointwise(f"{p}.self_attn.rotary", "rotary_embedding", "elementwise",
                (batch, tokens, q_out + kv_out), inputs=2)
    if past and m.kv_concat:
        # transformers' DynamicCache appends by concatenation: the cached K and V are read and
        # rewritten with the new entries on every step
        old = min(past, m.sliding_window) if m.sliding_window else past
        new_len = min(past + tokens, m.sliding_window) if m.sliding_window else past + tokens
        kv_old = int(2 * batch * m.num_kv_heads * old * m.head_dim * e.s)
        kv_in = int(2 * batch * m.num_kv_heads * tokens * m.head_dim * e.s)
        kv_new = int(2 * batch * m.num_kv_heads * new_len * m.head_dim * e.s)
        e._add(module_path=f"{p}.self_attn.kv_cache", op="cat", category="other",
               input_shapes=[(batch, m.num_kv_heads, old, m.head_dim)],
               output_shape=(batch, m.num_kv_heads, new_len, m.head_dim),
               bytes_read=kv_old + kv_in, bytes_written=kv_new, kv_bytes=kv_old,
               elements=int(kv_new / e.s))
    e.attention(f"{p}.self_attn.attn", batch, tokens, past, m)
    e.linear(f"{p}.self_attn.o_proj", batch, tokens, q_out, h)
    e.pointwise(f"{p}.residual_attn", "add", "elementwise", (batch, tokens, h), inputs=2)
    e.norm(f"{p}.post_attention_layernorm", batch, tokens, h, m.norm)
    if m.num_experts:
        _moe(e, m, p, batch, tokens)
    else:
        _mlp(e, m, f"{p}.mlp", batch, tokens, None)
    e.pointwise(f"{p}.residual_mlp", "add", "elementwise", (batch, tokens, h), inputs=2)


def _mlp(e: _Emitter, m: ModelShape, p: str, batch: int, tokens: int, rows: float | None) -> None:
    h, i = m.hidden_size, m.intermediate_size
    n = batch * tokens if rows is None else rows
    act_shape = (batch, tokens, i)
    act_elems = int(round(n * i))
    if m.gated_mlp:
        e.linear(f"{p}.gate_proj", batch, tokens, h, i, rows)
        e.linear(f"{p}.up_proj", batch, tokens, h, i, rows)
        e.pointwise(f"{p}.act_fn", "silu", "activation", act_shape, inputs=1, elements=act_elems)
        e.pointwise(f"{p}.gate_mul", "mul", "elementwise", act_shape, inputs=2, elements=act_elems)
        e.linear(f"{p}.down_proj", batch, tokens, i, h, rows)
    else:
        e.linear(f"{p}.fc1", batch, tokens, h, i, rows)
        e.pointwise(f"{p}.act_fn", "gelu", "activation", act_shape, inputs=1, elements=act_elems)
        e.linear(f"{p}.fc2", batch, tokens, i, h, rows)


def _moe(e: _Emitter, m: ModelShape, p: str, batch: int, tokens: int) -> None:
    n_tok = batch * tokens
    e.linear(f"{p}.mlp.gate", batch, tokens, m.hidden_size, m.num_experts)
    e.pointwise(f"{p}.mlp.router_softmax", "softmax", "softmax", (batch, tokens, m.num_experts), inputs=1)
    active = expected_active_experts(m.num_experts, m.experts_per_token, n_tok)
    rows = n_tok * m.experts_per_token / active
    for j in range(active):
        _mlp(e, m, f"{p}.mlp.experts.{j}", batch, tokens, rows)


def forward_ops(m: ModelShape, batch: int, tokens: int, past: int, dtype: str, phase: Phase, step: int,
                logits_tokens: int = 1) -> list[OpRecord]:
    """The ops of one forward pass: ``tokens`` new tokens per sequence after ``past`` cached ones."""
    e = _Emitter(dtype, phase, step, past + tokens)
    h = m.hidden_size
    s = e.s
    emb_w = int(m.vocab_size * h * s)
    e._add(module_path="model.embed_tokens", op="embedding", category="embedding", module_type="Embedding",
           input_shapes=[(batch, tokens)], output_shape=(batch, tokens, h), weight_bytes=emb_w,
           bytes_read=int(batch * tokens * (h * s + 8)), bytes_written=int(batch * tokens * h * s),
           elements=batch * tokens * h)
    for li in range(m.num_layers):
        _layer(e, m, li, batch, tokens, past)
    e.norm("model.norm", batch, logits_tokens, h, m.norm)
    e.linear("lm_head", batch, logits_tokens, h, m.vocab_size)
    return e.ops


def generation_ops(m: ModelShape, batch_size: int, input_tokens: int, output_tokens: int, dtype: str = "bfloat16",
                   decode_steps: list[int] | None = None) -> list[OpRecord]:
    """Ops of ``generate``: prefill (step 0) and decode steps 1..output_tokens-1.

    ``decode_steps`` limits the decode steps emitted (the predictor weights a sample of steps to
    stand for all of them on long generations).
    """
    if batch_size < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("batch size, input tokens and output tokens must be at least 1")
    ops = forward_ops(m, batch_size, input_tokens, 0, dtype, "prefill", 0)
    steps = range(1, output_tokens) if decode_steps is None else decode_steps
    for k in steps:
        ops.extend(forward_ops(m, batch_size, 1, input_tokens + k - 1, dtype, "decode", k))
    return ops


def sampled_decode_steps(output_tokens: int, max_steps: int = 64) -> tuple[list[int], dict[int, float]]:
    """Evenly spaced decode steps and the weight each carries so that they sum to all steps."""
    n = output_tokens - 1
    if n <= max_steps:
        steps = list(range(1, output_tokens))
        return steps, {k: 1.0 for k in steps}
    # midpoints of equal strata, so the linear growth of KV traffic averages out exactly
    width = n / max_steps
    steps = sorted({1 + int(width * (j + 0.5)) for j in range(max_steps)})
    w = n / len(steps)
    return steps, {k: w for k in steps}

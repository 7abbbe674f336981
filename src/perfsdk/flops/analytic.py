"""The analytic transformer FLOPs model, read from a ``transformers`` config.

Per forward pass over ``n`` new positions of a batch of ``B`` with ``c`` attended positions:

- dense matrix products: ``B * n * M`` multiply-adds, where ``M`` is the multiply-adds per token
  of every non-embedding weight matrix (attention projections sized by the KV heads for GQA,
  the MLP — only the ``top_k`` active experts plus the router for mixture-of-experts);
- attention (QKᵀ and PV): ``B * Hq * n * c * (D + D)`` multiply-adds per layer, full products
  with no causal halving (the convention of :mod:`perfsdk.capture`); a sliding-window layer
  attends ``min(c, window)`` positions once the window is full (during decode);
- ``lm_head``: ``B * k * hidden * vocab``, with ``k = 1`` inside ``generate`` (transformers passes
  ``logits_to_keep=1``, so the prefill pass computes the logits of the last position only) and
  ``k = n`` for a plain forward. A tied ``lm_head`` costs the same as an untied one.

``generate`` with ``G`` output tokens runs one prefill forward (which yields the first token)
and ``G - 1`` decode forwards; decode step ``k`` (1-based) sees ``c = T + k`` positions.
FLOPs are ``2 * MACs`` throughout; biases, norms, activations and softmax are not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from perfsdk.capture import CONVENTION

GATED_MLP_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                   "phi3", "olmo", "olmo2", "granite", "cohere", "starcoder2_gated", "deepseek_v3", "smollm3"}


class UnsupportedConfig(ValueError):
    """The config lacks the fields the analytic model needs."""


@dataclass(frozen=True)
class ArchSpec:
    """The dimensions that determine a decoder's FLOPs."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    sliding_windows: tuple[int | None, ...] = ()
    tie_word_embeddings: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def window(self, layer: int) -> int | None:
        return self.sliding_windows[layer] if self.sliding_windows else None

    def attention_proj_macs(self) -> int:
        """q, k, v, o projections per token and layer (k/v sized by the KV heads)."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    def mlp_macs(self) -> int:
        """MLP per token and layer: active experts and router for MoE."""
        mats = 3 if self.gated_mlp else 2
        if not self.is_moe:
            return mats * self.hidden_size * self.intermediate_size
        inter = self.expert_intermediate_size or self.intermediate_size
        macs = self.experts_per_token * mats * self.hidden_size * inter
        macs += self.hidden_size * self.num_experts  # router
        if self.shared_expert_intermediate_size:
            macs += mats * self.hidden_size * self.shared_expert_intermediate_size + self.hidden_size  # + its gate
        return macs

    def layer_macs_per_token(self) -> int:
        return self.attention_proj_macs() + self.mlp_macs()

    def nonembedding_macs_per_token(self) -> int:
        """All non-embedding, non-lm_head matrix products per token."""
        return self.num_layers * self.layer_macs_per_token()

    def lm_head_macs_per_token(self) -> int:
        return self.hidden_size * self.vocab_size


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None) if not isinstance(cfg, dict) else cfg.get(n)
        if v is not None:
            return v
    return default


def arch_from_config(cfg: Any) -> ArchSpec:
    """Read an :class:`ArchSpec` from a ``transformers`` config (object or dict)."""
    text = _get(cfg, "text_config")
    if text is not None and _get(cfg, "hidden_size", "n_embd") is None:
        cfg = text
    model_type = str(_get(cfg, "model_type", default="unknown"))
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model")
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    if None in (hidden, layers, heads, vocab):
        raise UnsupportedConfig(f"config of type {model_type!r} lacks hidden size, layers, heads or vocab size")
    hidden, layers, heads, vocab = int(hidden), int(layers), int(heads), int(vocab)
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    gated = model_type in GATED_MLP_TYPES or model_type.startswith(("llama", "mistral", "qwen"))
    if model_type == "gpt2":
        gated = False
    inter = _get(cfg, "intermediate_size", "n_inner", "ffn_dim")
    if inter is None:
        inter = 4 * hidden
    num_experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    topk = int(_get(cfg, "num_experts_per_tok", "moe_top_k", default=0) or 0)
    expert_inter = int(_get(cfg, "moe_intermediate_size", default=0) or 0)
    shared_inter = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
    windows: tuple[int | None, ...] = ()
    sw = _get(cfg, "sliding_window")
    use_sw = _get(cfg, "use_sliding_window", default=True)
    layer_types = _get(cfg, "layer_types")
    if sw and use_sw:
        if layer_types:
            windows = tuple(int(sw) if t == "sliding_attention" else None for t in layer_types)
        else:
            windows = tuple(int(sw) for _ in range(layers))
    elif layer_types and sw and any(t == "sliding_attention" for t in layer_types):
        windows = tuple(int(sw) if t == "sliding_attention" else None for t in layer_types)
    if windows and all(w is None for w in windows):
        windows = ()
    return ArchSpec(
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(inter),
        vocab_size=vocab,
        gated_mlp=gated,
        num_experts=num_experts if topk else 0,
        experts_per_token=topk,
        expert_intermediate_size=expert_inter,
        shared_expert_intermediate_size=shared_inter,
        sliding_windows=windows,
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
    )


@dataclass
class ForwardMacs:
    """Multiply-adds of one forward pass, by part."""

    linear: int = 0
    attention: int = 0
    lm_head: int = 0

    @property
    def total(self) -> int:
        return self.linear + self.attention + self.lm_head


def forward_macs(spec: ArchSpec, batch_size: int, new_tokens: int, context_len: int, logits_positions: int,
                 *, decode: bool = False) -> ForwardMacs:
    """MACs of one forward over ``new_tokens`` positions attending ``context_len`` positions.

    ``decode`` applies sliding windows (the cache keeps ``window - 1`` past positions).
    """
    b, n = batch_size, new_tokens
    linear = b * n * spec.nonembedding_macs_per_token()
    attn = 0
    for layer in range(spec.num_layers):
        c = context_len
        w = spec.window(layer)
        if decode and w is not None:
            c = min(c, w)
        attn += b * spec.num_heads * n * c * 2 * spec.head_dim
    head = b * logits_positions * spec.lm_head_macs_per_token()
    return ForwardMacs(linear=linear, attention=attn, lm_head=head)


@dataclass
class AnalyticFlops:
    """Analytic FLOPs and MACs of a forward or a ``generate`` call."""

    flops_total: int
    flops_prefill: int
    flops_decode: int
    macs_total: int
    macs_prefill: int
    macs_decode: int
    decode_forwards: int
    parts_macs: dict[str, int] = field(default_factory=dict)
    params_nonembedding: int = 0
    convention: str = CONVENTION

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def nonembedding_matmul_params(spec: ArchSpec, active_only: bool = True) -> int:
    """Weights of the non-embedding matrix products (active experts only by default)."""
    if active_only or not spec.is_moe:
        return spec.nonembedding_macs_per_token()
    mats = 3 if spec.gated_mlp else 2
    inter = spec.expert_intermediate_size or spec.intermediate_size
    all_experts = spec.num_experts * mats * spec.hidden_size * inter
    active = spec.experts_per_token * mats * spec.hidden_size * inter
    return spec.nonembedding_macs_per_token() + spec.num_layers * (all_experts - active)


def analytic_generate(cfg: Any, batch_size: int, input_tokens: int, output_tokens: int) -> AnalyticFlops:
    """FLOPs of ``model.generate`` producing ``output_tokens`` tokens from ``input_tokens`` each.

    One prefill forward (logits of the last position only) and ``output_tokens - 1`` decode
    forwards, decode step ``k`` attending ``input_tokens + k`` positions.
    """
    spec = cfg if isinstance(cfg, ArchSpec) else arch_from_config(cfg)
    if output_tokens < 1:
        pre = forward_macs(spec, batch_size, input_tokens, input_tokens, input_tokens)
        return _result(spec, pre, [], 0)
    pre = forward_macs(spec, batch_size, input_tokens, input_tokens, 1)
    dec = [forward_macs(spec, batch_size, 1, input_tokens + k, 1, decode=True) for k in range(1, output_tokens)]
    return _result(spec, pre, dec, output_tokens - 1)


def analytic_forward(cfg: Any, batch_size: int, tokens: int, logits_positions: int | None = None) -> AnalyticFlops:
    """FLOPs of one plain forward over ``tokens`` positions (logits for all of them by default)."""
    spec = cfg if isinstance(cfg, ArchSpec) else arch_from_config(cfg)
    k = tokens if logits_positions is None else logits_positions
    pre = forward_macs(spec, batch_size, tokens, tokens, k)
    res = _result(spec, pre, [], 0)
    return res


def _result(spec: ArchSpec, pre: ForwardMacs, dec: list[ForwardMacs], n_dec: int) -> AnalyticFlops:
    dec_total = sum(d.total for d in dec)
    parts = {
        "linear": pre.linear + sum(d.linear for d in dec),
        "attention": pre.attention + sum(d.attention for d in dec),
        "lm_head": pre.lm_head + sum(d.lm_head for d in dec),
    }
    total = pre.total + dec_total
    return AnalyticFlops(
        flops_total=2 * total,
        flops_prefill=2 * pre.total,
        flops_decode=2 * dec_total,
        macs_total=total,
        macs_prefill=pre.total,
        macs_decode=dec_total,
        decode_forwards=n_dec,
        parts_macs=parts,
        params_nonembedding=nonembedding_matmul_params(spec, active_only=False),
    )


__all__ = [
    "AnalyticFlops",
    "ArchSpec",
    "ForwardMacs",
    "UnsupportedConfig",
    "analytic_forward",
    "analytic_generate",
    "arch_from_config",
    "forward_macs",
    "nonembedding_matmul_params",
]

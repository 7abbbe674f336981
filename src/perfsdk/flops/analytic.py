"""The analytic transformer FLOPs model, from an :class:`~perfsdk.models.arch.Architecture`.

Per forward pass over ``n`` new positions of a batch of ``B`` after ``p`` cached positions:

- weight matrices: ``B * n * M``, where ``M`` is the multiply-adds per position of every layer's
  weight matrices (attention projections sized by the KV heads for GQA/MQA, low-rank for
  latent attention; the MLP — for mixture-of-experts the ``top_k`` routed experts, the router
  and the shared experts). Latent attention (DeepSeek-V3) caches the compressed latent and
  expands it (``kv_b_proj``) over every attended key at each forward: ``B * k * r * H * (Dn + Dv)``;
- attention (QKᵀ and PV): ``B * Hq * n * k * (D + Dv)`` per layer, where ``k`` is the number of
  keys the kernel gets — ``p + n``, or for a sliding-window layer ``min(p, window - 1) + n``
  once a cache exists (the first forward gets every key, masked). Full products, no causal
  halving (the convention of :mod:`perfsdk.capture`);
- ``lm_head``: ``B * k * hidden * vocab``, with ``k = 1`` inside ``generate`` (transformers passes
  ``logits_to_keep=1``) and ``k = n`` for a plain forward. A tied ``lm_head`` costs the same.

``generate`` with ``G`` output tokens runs one prefill forward (which yields the first token)
and ``G - 1`` decode forwards; decode step ``k`` (1-based) sees ``T + k`` positions.

Phase ``encode`` holds what runs before the decoder's first forward:

- encoder-decoder (T5): the encoder over the ``T`` input tokens (bidirectional self-attention
  over ``T`` keys). The decoder then starts from one position (the decoder start token); its
  first forward also projects the encoder output to cross-attention keys and values
  (``2 * T * hidden * inner`` per layer, cached), and every decoder forward's cross-attention
  attends the ``T`` encoder positions;
- vision-language (LLaVA): per image, the patch convolution (``patches * channels * patch² *
  hidden``), the vision tower's layers over ``patches + 1`` positions (the class token), and the
  projector over the image tokens handed to the text model (``patches``; ``patches + 1`` with
  ``vision_feature_select_strategy: full``). The text model's prompt is the text tokens plus
  those image tokens.

FLOPs are ``2 * MACs`` throughout; biases, norms, activations, softmax and the relative position
bias are not counted. ``flops_total = flops_encode + flops_prefill + flops_decode`` exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from perfsdk.capture import CONVENTION
from perfsdk.models.arch import (
    Architecture,
    GenerateShape,
    architecture_from_config,
    generate_shape,
)


@dataclass
class ForwardMacs:
    """Multiply-adds of one forward pass (or of the encode phase), by part."""

    linear: int = 0
    attention: int = 0
    lm_head: int = 0
    patch_embedding: int = 0
    projector: int = 0

    @property
    def total(self) -> int:
        return self.linear + self.attention + self.lm_head + self.patch_embedding + self.projector

    def __add__(self, other: ForwardMacs) -> ForwardMacs:
        return ForwardMacs(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values(), strict=True)))


def attention_macs(arch: Architecture, batch_size: int, new_tokens: int, past: int) -> int:
    """Self-attention products of every layer for ``new_tokens`` positions after ``past`` cached ones."""
    per_key = arch.num_heads * (arch.head_dim + arch.v_head_dim)
    return sum(batch_size * new_tokens * arch.keys_attended(layer, past, new_tokens) * per_key
               for layer in range(arch.num_layers))


def forward_macs(arch: Architecture, batch_size: int, new_tokens: int, past: int, logits_positions: int,
                 *, encoder_tokens: int = 0) -> ForwardMacs:
    """MACs of one decoder forward over ``new_tokens`` positions after ``past`` cached positions.

    ``encoder_tokens``: the encoder positions an encoder-decoder's cross-attention attends (their
    key/value projections run in the first forward, ``past == 0``).
    """
    b, n = batch_size, new_tokens
    linear = b * n * arch.linear_macs_per_token()
    key_macs = sum(l.macs for l in arch.key_linears())
    if key_macs:
        linear += sum(b * arch.keys_attended(layer, past, n) * key_macs for layer in range(arch.num_layers))
    attn = attention_macs(arch, b, n, past)
    if arch.cross_attention:
        if past == 0:
            _, kv = arch.cross_attention_linears()
            linear += arch.num_layers * b * encoder_tokens * sum(l.macs for l in kv)
        attn += arch.num_layers * b * n * encoder_tokens * arch.num_heads * (arch.head_dim + arch.v_head_dim)
    head = b * logits_positions * arch.lm_head_macs_per_token()
    return ForwardMacs(linear=linear, attention=attn, lm_head=head)


def encode_macs(arch: Architecture, batch_size: int, encoder_tokens: int = 0, images: int = 0) -> ForwardMacs:
    """MACs of the encode phase: the encoder over ``encoder_tokens`` input positions, or the vision
    tower and projector over ``images`` images per sequence."""
    enc = arch.encoder
    if enc is None:
        return ForwardMacs()
    if enc.role == "vision":
        n_img = batch_size * images
        t = enc.tokens_per_image
        return ForwardMacs(
            linear=n_img * t * enc.linear_macs_per_token(),
            attention=attention_macs(enc, n_img, t, 0),
            patch_embedding=n_img * enc.patch_embedding_macs(),
            projector=n_img * arch.image_tokens_per_image * sum(l.macs for l in arch.projector),
        )
    return ForwardMacs(linear=batch_size * encoder_tokens * enc.linear_macs_per_token(),
                       attention=attention_macs(enc, batch_size, encoder_tokens, 0))


@dataclass
class AnalyticFlops:
    """Analytic FLOPs and MACs of a forward or a ``generate`` call."""

    flops_total: int
    flops_encode: int
    flops_prefill: int
    flops_decode: int
    macs_total: int
    macs_encode: int
    macs_prefill: int
    macs_decode: int
    decode_forwards: int
    parts_macs: dict[str, int] = field(default_factory=dict)
    params_nonembedding: int = 0
    images: int = 0
    image_tokens: int = 0
    encoder_tokens: int = 0
    prompt_tokens: int = 0
    convention: str = CONVENTION

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def nonembedding_matmul_params(arch: Architecture, active_only: bool = True) -> int:
    """Weights of the decoder's layer matrices (``active_only``: the experts one token reaches)."""
    if active_only:
        return arch.linear_macs_per_token()
    return sum(lin.macs * k for layer in range(arch.num_layers) for lin, k in arch.layer_matrices(layer))


def _arch(cfg: Any) -> Architecture:
    return cfg if isinstance(cfg, Architecture) else architecture_from_config(cfg)


def analytic_generate(cfg: Any, batch_size: int, input_tokens: int, output_tokens: int, *,
                      images: int | None = None) -> AnalyticFlops:
    """FLOPs of ``model.generate`` producing ``output_tokens`` tokens from ``input_tokens`` each.

    Encode (encoder or vision tower, when the model has one), one prefill forward (logits of the
    last position only) and ``output_tokens - 1`` decode forwards, decode step ``k`` attending
    ``prompt + k`` positions. ``output_tokens < 1`` counts one plain forward instead (logits for
    every position). ``images``: images per sequence of a vision-language model (default 1).
    """
    arch = _arch(cfg)
    shape = generate_shape(arch, batch_size, input_tokens, output_tokens, images)
    b, p, enc_t = batch_size, shape.prompt_tokens, shape.encoder_tokens
    encode = encode_macs(arch, b, enc_t, shape.images)
    if output_tokens < 1:
        pre = forward_macs(arch, b, p, 0, p, encoder_tokens=enc_t)
        return _result(arch, shape, encode, pre, [])
    pre = forward_macs(arch, b, p, 0, 1, encoder_tokens=enc_t)
    dec = [forward_macs(arch, b, 1, p + k - 1, 1, encoder_tokens=enc_t) for k in range(1, output_tokens)]
    return _result(arch, shape, encode, pre, dec)


def analytic_forward(cfg: Any, batch_size: int, tokens: int, logits_positions: int | None = None, *,
                     images: int | None = None, decoder_tokens: int = 1) -> AnalyticFlops:
    """FLOPs of one plain forward over ``tokens`` positions (logits for all of them by default).

    For an encoder-decoder, ``tokens`` feed the encoder and the decoder runs over
    ``decoder_tokens`` positions.
    """
    arch = _arch(cfg)
    shape = generate_shape(arch, batch_size, tokens, 0, images, decoder_tokens)
    p = shape.prompt_tokens
    k = p if logits_positions is None else logits_positions
    encode = encode_macs(arch, batch_size, shape.encoder_tokens, shape.images)
    pre = forward_macs(arch, batch_size, p, 0, k, encoder_tokens=shape.encoder_tokens)
    return _result(arch, shape, encode, pre, [])


def _result(arch: Architecture, shape: GenerateShape, encode: ForwardMacs, pre: ForwardMacs,
            dec: list[ForwardMacs]) -> AnalyticFlops:
    dec_sum = sum(dec, ForwardMacs())
    all_parts = encode + pre + dec_sum
    parts = {k: v for k, v in asdict(all_parts).items() if v or k in ("linear", "attention", "lm_head")}
    total = encode.total + pre.total + dec_sum.total
    return AnalyticFlops(
        flops_total=2 * total,
        flops_encode=2 * encode.total,
        flops_prefill=2 * pre.total,
        flops_decode=2 * dec_sum.total,
        macs_total=total,
        macs_encode=encode.total,
        macs_prefill=pre.total,
        macs_decode=dec_sum.total,
        decode_forwards=len(dec),
        parts_macs=parts,
        params_nonembedding=nonembedding_matmul_params(arch, active_only=False),
        images=shape.images,
        image_tokens=shape.image_tokens,
        encoder_tokens=shape.encoder_tokens,
        prompt_tokens=shape.prompt_tokens,
    )


__all__ = [
    "AnalyticFlops",
    "ForwardMacs",
    "GenerateShape",
    "analytic_forward",
    "analytic_generate",
    "attention_macs",
    "encode_macs",
    "forward_macs",
    "generate_shape",
    "nonembedding_matmul_params",
]

"""Count a model configuration by name without loading weights (what ``perfsdk flops`` prints)."""

from __future__ import annotations

from typing import Any

from perfsdk.collectors.flops import result_fields


def count_model(model: str, *, batch_size: int = 1, input_tokens: int = 128, output_tokens: int = 32,
                backend: str = "torch", attn_implementation: str = "auto", exact: bool = False,
                top_n: int = 10, full_depth: bool = False, images: int | None = None) -> dict[str, Any]:
    """Count ``model`` (folder, config file, ``builtin:<name>`` or bundled name) without weights.

    ``input_tokens`` are the prompt's text tokens (an encoder-decoder's encoder input); a
    vision-language model's prompt also holds ``images`` (default 1 per sequence) times its image
    tokens. Returns the same fields as the collector's result plus ``model``, ``source``, the
    shape (``architecture``, ``images``, ``image_tokens``, ``encoder_tokens``, ``prompt_tokens``)
    and ``forwards``. Raises :class:`~perfsdk.models.resolve.UnknownModel`,
    :class:`~perfsdk.models.arch.UnsupportedArchitecture` or ``ValueError``.
    """
    from perfsdk.collectors.flops import analytic_unavailable
    from perfsdk.flops.analytic import analytic_generate
    from perfsdk.flops.counter import BACKENDS, count_analytic, count_third_party
    from perfsdk.flops.meta import _architecture_or_none, count_config, meta_model, replay_shape
    from perfsdk.models.arch import UnsupportedArchitecture
    from perfsdk.models.resolve import resolve_config

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (available: {', '.join(BACKENDS)})")
    cfg, source = resolve_config(model)
    arch = _architecture_or_none(cfg)
    if arch is None:
        why = analytic_unavailable(cfg)
        if backend == "analytic":
            raise UnsupportedArchitecture(f"--backend analytic: {why}; the torch backend counts it by capture")
        shape = replay_shape(cfg, batch_size, input_tokens, output_tokens, images)
        count = count_config(cfg, batch_size, input_tokens, output_tokens, attn_implementation=attn_implementation,
                             exact=exact, full_depth=full_depth, images=images)
        if backend != "torch":
            m = meta_model(cfg, attn_implementation=attn_implementation)
            count = count_third_party(backend, m, batch_size, input_tokens, output_tokens)
            count.method += " on the meta device"
        count.notes.append(why)
        out_tokens = batch_size * output_tokens if output_tokens > 0 else None
        fields = result_fields(count, None, output_tokens=out_tokens, top_n=top_n,
                               decode_tokens=batch_size * (output_tokens - 1) if output_tokens > 1 else None)
        return {"model": model, "source": source, "architecture": _kind(cfg, shape.images),
                "batch_size": batch_size, "input_tokens": input_tokens, "output_tokens": output_tokens,
                "images": shape.images, "image_tokens": shape.image_tokens, "encoder_tokens": shape.encoder_tokens,
                "prompt_tokens": shape.prompt_tokens, **fields, "forwards": count.forwards}
    analytic = analytic_generate(arch, batch_size, input_tokens, output_tokens, images=images)
    if backend == "analytic":
        count = count_analytic(arch, batch_size, input_tokens, output_tokens, images=images)
    elif backend == "torch":
        count = count_config(cfg, batch_size, input_tokens, output_tokens, attn_implementation=attn_implementation,
                             exact=exact, full_depth=full_depth, images=images)
    else:
        m = meta_model(cfg, attn_implementation=attn_implementation)
        count = count_third_party(backend, m, batch_size, input_tokens, output_tokens)
        count.method += " on the meta device"
    out_tokens = batch_size * output_tokens if output_tokens > 0 else None
    fields = result_fields(count, analytic.flops_total, output_tokens=out_tokens, top_n=top_n,
                           decode_tokens=batch_size * (output_tokens - 1) if output_tokens > 1 else None)
    return {"model": model, "source": source, "architecture": arch.kind, "batch_size": batch_size,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "images": analytic.images,
            "image_tokens": analytic.image_tokens, "encoder_tokens": analytic.encoder_tokens,
            "prompt_tokens": analytic.prompt_tokens, **fields, "forwards": count.forwards}


def _kind(config: Any, images: int) -> str:
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if getattr(config, "vision_config", None) is not None:
        return "vision-language"
    return "decoder"

"""Describe a loaded model: class, parameter count, weight bytes, dtype, architecture fields."""

from __future__ import annotations

from typing import Any

from perfsdk.schemas import ModelInfo


def model_device(model: Any) -> Any:
    """The device of the model's first parameter or buffer, or ``None``."""
    try:
        for p in model.parameters():
            return p.device
        for b in model.buffers():
            return b.device
    except Exception:
        return None
    return None


def weight_bytes(model: Any) -> int:
    """Bytes held by parameters and buffers, including packed quantized weights."""
    import torch

    total = 0
    seen: set[int] = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    for mod in model.modules():
        packed = getattr(mod, "_packed_params", None)
        if packed is not None:
            try:
                w, b = packed._weight_bias()
                total += w.numel() * w.element_size()
                if b is not None:
                    total += b.numel() * b.element_size()
            except Exception:
                pass
    del torch
    return total


def parameter_count(model: Any) -> int:
    """Parameters, counting tied weights once and quantized packed weights by their shape."""
    n = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n += p.numel()
    for mod in model.modules():
        packed = getattr(mod, "_packed_params", None)
        if packed is not None:
            try:
                w, b = packed._weight_bias()
                n += w.numel() + (b.numel() if b is not None else 0)
            except Exception:
                pass
    return n


def _dtype_of(model: Any) -> str | None:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return None


def arch_fields(config: Any) -> dict[str, Any]:
    """Architecture fields from a ``transformers`` config (None where absent).

    For a vision-language model the layer, size and vocabulary fields are the language model's
    (its text config); the architecture name is the whole model's.
    """
    if config is None:
        return {}
    top = config
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):  # a vision-language model: the language model's shape
        try:
            config = get_text(decoder=True) or config
        except TypeError:
            config = get_text() or config
        except Exception:
            config = top
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)  # noqa: E731
    heads = get("num_attention_heads", "n_head")
    hidden = get("hidden_size", "n_embd", "d_model")
    head_dim = get("head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    return {
        "architecture": (getattr(top, "architectures", None) or [None])[0] or getattr(top, "model_type", None),
        "num_layers": get("num_hidden_layers", "n_layer", "num_layers"),
        "hidden_size": hidden,
        "intermediate_size": get("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("num_key_value_heads") or heads,
        "head_dim": head_dim,
        "vocab_size": get("vocab_size"),
        "max_position_embeddings": get("max_position_embeddings", "n_positions"),
        "attn_implementation": getattr(top, "_attn_implementation", None),
    }


def describe_model(model: Any, model_id: str | None = None, load_s: float | None = None,
                   quantization: str = "none") -> ModelInfo:
    """A :class:`ModelInfo` for any ``nn.Module`` (architecture fields for transformers models)."""
    dev = model_device(model)
    fields = arch_fields(getattr(model, "config", None))
    if quantization == "none" and any(getattr(m, "_packed_params", None) is not None for m in model.modules()):
        quantization = "dynamic-int8"
    return ModelInfo(
        model_id=model_id,
        model_class=type(model).__name__,
        parameters=parameter_count(model),
        weights_bytes=weight_bytes(model),
        dtype=_dtype_of(model),
        device=str(dev) if dev is not None else None,
        quantization=quantization,
        load_s=load_s,
        **fields,
    )


def kv_cache_bytes(info: ModelInfo, batch_size: int, context_len: int, dtype_bytes: int | None = None) -> int | None:
    """KV-cache bytes for ``batch_size`` sequences of ``context_len`` tokens:
    2 (K and V) × layers × KV heads × head dim × context × batch × bytes per element."""
    if not (info.num_layers and info.num_key_value_heads and info.head_dim):
        return None
    if dtype_bytes is None:
        dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(info.dtype or "float32", 4)
    return 2 * info.num_layers * info.num_key_value_heads * info.head_dim * context_len * batch_size * dtype_bytes

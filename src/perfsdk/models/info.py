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
    """The ``model`` section's architecture fields, from the model's :class:`~perfsdk.models.arch.Architecture`.

    For a vision-language model they describe its text decoder. A config of a family the
    architecture reader does not describe leaves them unset (the model type is still recorded).
    """
    if config is None:
        return {}
    from perfsdk.models.arch import UnsupportedArchitecture, architecture_from_config

    name = (getattr(config, "architectures", None) or [None])[0] or getattr(config, "model_type", None)
    base = {"architecture": name, "model_type": getattr(config, "model_type", None),
            "attn_implementation": getattr(config, "_attn_implementation", None)}
    try:
        arch = architecture_from_config(config)
    except (UnsupportedArchitecture, TypeError, ValueError):
        return base
    return {
        **base,
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_position_embeddings,
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

"""Describe a loaded model: class, parameter count, weight bytes, dtype, architecture fields."""

from __future__ import annotations

import math
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


def _logical_numel(p: Any) -> int:
    """Elements of a parameter as the model uses it: a bitsandbytes 4-bit parameter packs two
    values a byte (its ``quant_state`` keeps the unpacked shape)."""
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    try:
        return math.prod(int(d) for d in shape) if shape is not None else int(p.numel())
    except (TypeError, ValueError):
        return int(p.numel())


def parameter_count(model: Any) -> int:
    """Parameters, counting tied weights once and quantized weights by their unquantized shape
    (dynamic-int8 packed weights, bitsandbytes 4-bit, float8 weight buffers)."""
    n = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n += _logical_numel(p)
    for mod in model.modules():
        fp8 = getattr(mod, "weight_fp8", None)  # perfsdk's float8 linear keeps its weight as a buffer
        if fp8 is not None and hasattr(fp8, "numel"):
            n += int(fp8.numel())
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


def _as_dict(qc: Any) -> dict[str, Any]:
    if qc is None:
        return {}
    if isinstance(qc, dict):
        return qc
    to_dict = getattr(qc, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(qc))


def _dtype_name(v: Any) -> str | None:
    return None if v is None else str(v).replace("torch.", "")


def detect_quantization(model: Any) -> dict[str, Any]:
    """How a model is really quantized, from what it holds (not from what a config asked for).

    Returns ``quantization`` (``none``, ``dynamic-int8``, ``bnb-8bit``, ``bnb-4bit``,
    ``float8-e4m3fn`` or another library's ``quant_method``), ``quant_type`` (``nf4``/``fp4``
    for 4-bit bitsandbytes, ``qint8``, ``e4m3fn``), ``quant_compute_dtype`` and
    ``quantized_modules`` (layers found quantized). Looked at: torch dynamic-quantized linears
    (packed parameters), bitsandbytes ``Linear8bitLt``/``Linear4bit`` modules (by class name, so
    bitsandbytes need not be importable), perfsdk's float8 linears, and
    ``model.config.quantization_config``.
    """
    counts: dict[str, int] = {}
    quant_type = compute = None
    for m in model.modules():
        name = type(m).__name__
        if name == "Linear8bitLt":
            counts["bnb-8bit"] = counts.get("bnb-8bit", 0) + 1
        elif name == "Linear4bit":
            counts["bnb-4bit"] = counts.get("bnb-4bit", 0) + 1
            w = getattr(m, "weight", None)
            state = getattr(w, "quant_state", None)
            quant_type = getattr(w, "quant_type", None) or getattr(state, "quant_type", None) or quant_type
            compute = _dtype_name(getattr(m, "compute_dtype", None)) or compute
        elif name == "Float8Linear":
            counts["float8-e4m3fn"] = counts.get("float8-e4m3fn", 0) + 1
            quant_type = "e4m3fn"
        elif getattr(m, "_packed_params", None) is not None and not name.endswith("PackedParams"):
            counts["dynamic-int8"] = counts.get("dynamic-int8", 0) + 1
            quant_type = "qint8"
    qc = _as_dict(getattr(getattr(model, "config", None), "quantization_config", None))
    kind = max(counts, key=lambda k: counts[k]) if counts else "none"
    if qc:
        raw = qc.get("quant_method", "")
        method = str(getattr(raw, "value", raw)).lower()  # an enum in transformers' own configs
        if "bitsandbytes" in method or qc.get("load_in_4bit") or qc.get("load_in_8bit"):
            if kind == "none":
                kind = "bnb-4bit" if qc.get("load_in_4bit") else "bnb-8bit"
            if kind == "bnb-4bit":
                quant_type = quant_type or qc.get("bnb_4bit_quant_type")
                compute = compute or _dtype_name(qc.get("bnb_4bit_compute_dtype"))
        elif method and kind == "none":
            kind = method
    return {"quantization": kind, "quant_type": quant_type, "quant_compute_dtype": compute,
            "quantized_modules": sum(counts.values()) or None}


def describe_model(model: Any, model_id: str | None = None, load_s: float | None = None,
                   quantization: str = "none") -> ModelInfo:
    """A :class:`ModelInfo` for any ``nn.Module`` (architecture fields for transformers models).

    The quantization is what :func:`detect_quantization` finds in the model; ``quantization``
    (what the config asked for) is used only when nothing is found.
    """
    dev = model_device(model)
    fields = arch_fields(getattr(model, "config", None))
    quant = detect_quantization(model)
    if quant["quantization"] == "none":
        quant["quantization"] = quantization
    return ModelInfo(
        model_id=model_id,
        model_class=type(model).__name__,
        parameters=parameter_count(model),
        weights_bytes=weight_bytes(model),
        dtype=_dtype_of(model),
        device=str(dev) if dev is not None else None,
        load_s=load_s,
        **quant,
        **fields,
    )

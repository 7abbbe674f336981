"""Count FLOPs without weights: the architecture instantiated on the meta device.

A model is named by a local folder holding ``config.json`` (or the file itself), a built-in
name (``builtin:tiny-llama``), or a bundled config of a well-known architecture (see
:func:`bundled_names`). The architecture is built with ``AutoModelForCausalLM.from_config`` under
``torch.device("meta")``: shapes only, no memory for weights, so a 70B configuration counts
on a small machine.

``generate`` with ``G`` output tokens is replayed as transformers runs it: one prefill forward
over the ``T`` input positions with a KV cache and last-position logits (it yields the first
token), then ``G - 1`` decode forwards of one position each, decode step ``k`` attending
``T + k`` positions. Long generations are not replayed step by step: a decode step's FLOPs are
affine in its context length (per module), so steps 1, 2 and 3 are counted and the rest summed
in closed form once step 3 confirms the straight line. Where the line can bend — a sliding
window that fills during decode — every step is counted.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import structlog
import torch

from perfsdk.capture import OperationCapture
from perfsdk.flops.analytic import arch_from_config
from perfsdk.flops.counter import FlopsCount, count_analytic, count_from_records

log = structlog.get_logger("perfsdk.flops.meta")


class UnknownModel(ValueError):
    """The model name is not a folder, a config file, a built-in or a bundled config."""


def bundled_names() -> list[str]:
    """Names of the bundled architecture configs (``gpt2``, ``llama-3-8b``, …)."""
    root = resources.files("perfsdk.flops") / "configs"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def _bundled_dict(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((resources.files("perfsdk.flops") / "configs" / f"{name}.json").read_text())
    return data


def _config_from_dict(data: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    data = dict(data)
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise UnknownModel("config has no model_type")
    for k in ("_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype"):
        data.pop(k, None)
    return AutoConfig.for_model(model_type, **data)


def resolve_config(model: str) -> tuple[Any, str]:
    """The ``transformers`` config named by ``model`` and where it came from."""
    if model.startswith("builtin:"):
        name = model.split(":", 1)[1]
        try:
            from perfsdk.models.tiny import tiny_llama_config
        except ImportError as exc:
            raise UnknownModel(f"{model}: the embedded models are not available ({exc})") from exc
        try:
            return tiny_llama_config(name), "builtin"
        except KeyError as exc:
            raise UnknownModel(str(exc.args[0]) if exc.args else str(exc)) from exc
    path = Path(os.path.expanduser(model))
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UnknownModel(f"{model}: cannot read config ({exc})") from exc
        return _config_from_dict(data), f"file:{path}"
    key = model.lower().replace("_", "-")
    if key in bundled_names():
        return _config_from_dict(_bundled_dict(key)), f"bundled:{key}"
    raise UnknownModel(
        f"unknown model {model!r}: not a folder with config.json, a config file, builtin:<name>, or one of the "
        f"bundled configs ({', '.join(bundled_names())})"
    )


def meta_model(config: Any, attn_implementation: str = "sdpa", dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Instantiate the causal-LM architecture of ``config`` on the meta device (no weights).

    Mixture-of-experts models are built in bfloat16 by default: PyTorch's meta kernel of the
    grouped GEMM their experts run accepts only bfloat16 (FLOPs do not depend on the dtype).
    """
    from transformers import AutoModelForCausalLM

    if dtype is None and arch_from_config(config).is_moe:
        dtype = torch.bfloat16
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with _quiet(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model.eval()


def _quiet() -> Any:
    try:
        from perfsdk.models.tiny import quiet_transformers
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return quiet_transformers()


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A weightless copy of a (possibly quantized) ``transformers`` model's architecture."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise TypeError(f"{type(model).__name__} has no transformers config: cannot rebuild it on the meta device")
    import copy

    cfg = copy.deepcopy(cfg)
    for attr in ("quantization_config",):
        if hasattr(cfg, attr):
            try:
                delattr(cfg, attr)
            except AttributeError:
                pass
    impl = getattr(cfg, "_attn_implementation", None) or "sdpa"
    return meta_model(cfg, attn_implementation=impl if impl in ("eager", "sdpa") else "sdpa")


def _new_cache(config: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def _forward(model: torch.nn.Module, cap: OperationCapture | None, ids: torch.Tensor, cache: Any,
             phase: str, step: int, context_len: int) -> None:
    if cap is not None:
        cap.set_phase(phase, step=step, context_len=context_len)  # type: ignore[arg-type]
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)


def count_meta_generate(model: torch.nn.Module, batch_size: int, input_tokens: int, output_tokens: int,
                        *, exact: bool = False) -> FlopsCount:
    """Count ``generate`` (``output_tokens`` tokens from ``input_tokens``) on a meta-device model."""
    cfg = getattr(model, "config", None)
    dev = torch.device("meta")
    if output_tokens < 1:
        ids = torch.zeros((batch_size, input_tokens), dtype=torch.long, device=dev)
        with torch.inference_mode(), OperationCapture(model, phase="forward", context_len=input_tokens) as cap:
            model(input_ids=ids, use_cache=False)
        res = count_from_records(cap.records, "torch", "meta-device capture")
        return res
    n_dec = output_tokens - 1
    spec = arch_from_config(cfg) if cfg is not None else None
    windows = [w for w in (spec.sliding_windows if spec else ()) if w is not None]
    bends = bool(windows) and input_tokens + n_dec > min(windows)
    run_all = exact or bends or n_dec <= 3
    counted = n_dec if run_all else 3
    one = torch.zeros((batch_size, 1), dtype=torch.long, device=dev)
    with torch.inference_mode(), OperationCapture(model) as cap:
        cache = _new_cache(cfg)
        ids = torch.zeros((batch_size, input_tokens), dtype=torch.long, device=dev)
        _forward(model, cap, ids, cache, "prefill", 0, input_tokens)
        for k in range(1, counted + 1):
            _forward(model, cap, one, cache, "decode", k, input_tokens + k)
    result = count_from_records(cap.records, "torch", "meta-device capture")
    if run_all:
        return result
    # closed-form sum over decode steps 1..n_dec from steps 1, 2 (checked against step 3)
    per_step: dict[int, dict[str, int]] = {1: {}, 2: {}, 3: {}}
    per_step_macs = {1: 0, 2: 0, 3: 0}
    types_step: dict[int, dict[str, int]] = {1: {}, 2: {}, 3: {}}
    cats_step: dict[int, dict[str, int]] = {1: {}, 2: {}, 3: {}}
    for r in cap.records:
        if r.phase != "decode" or not r.flops:
            continue
        per_step[r.step][r.module_path] = per_step[r.step].get(r.module_path, 0) + r.flops
        types_step[r.step][r.module_type or "?"] = types_step[r.step].get(r.module_type or "?", 0) + r.flops
        cats_step[r.step][r.category] = cats_step[r.step].get(r.category, 0) + r.flops
    for r in cap.records:
        if r.phase == "decode":
            per_step_macs[r.step] += r.macs

    def affine(d: dict[int, dict[str, int]]) -> dict[str, int] | None:
        out: dict[str, int] = {}
        for key in set(d[1]) | set(d[2]) | set(d[3]):
            a, b, c = d[1].get(key, 0), d[2].get(key, 0), d[3].get(key, 0)
            if c - b != b - a:
                return None
            slope = b - a
            out[key] = n_dec * a + slope * n_dec * (n_dec - 1) // 2
        return out

    mods, types, cats = affine(per_step), affine(types_step), affine(cats_step)
    m1, m2, m3 = per_step_macs[1], per_step_macs[2], per_step_macs[3]
    if mods is None or types is None or cats is None or m3 - m2 != m2 - m1:
        log.info("decode FLOPs not affine in the context length; counting every step")
        return count_meta_generate(model, batch_size, input_tokens, output_tokens, exact=True)
    dec_macs = n_dec * m1 + (m2 - m1) * n_dec * (n_dec - 1) // 2
    pre = [r for r in cap.records if r.phase == "prefill"]
    res = count_from_records(pre, "torch", "meta-device capture")
    res.flops_decode = sum(mods.values())
    res.macs_decode = dec_macs
    for src, dst in ((mods, res.modules), (types, res.module_types), (cats, res.categories)):
        for name, v in src.items():
            dst[name] = dst.get(name, 0) + v
    res.decode_forwards = n_dec
    res.forwards = result.forwards  # the steps actually counted
    res.notes.append(f"decode steps 4..{n_dec} summed in closed form: per-module FLOPs are affine in the context "
                     f"length (checked on steps 1-3)")
    return res


_LAYER_RE = re.compile(r"^(?P<pre>.*?)\.(?P<idx>\d+)(?P<post>\..*)?$")


def _layers_attr(config: Any) -> str | None:
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(getattr(config, attr, None), int):
            return attr
    return None


def _shallow_config(config: Any, layers: int) -> Any | None:
    """A copy of ``config`` with ``layers`` decoder layers, or None if its layers differ."""
    import copy

    attr = _layers_attr(config)
    if attr is None:
        return None
    types = getattr(config, "layer_types", None)
    if types and len(set(types)) > 1:
        return None  # heterogeneous layers (e.g. interleaved sliding windows): count every one
    cfg = copy.deepcopy(config)
    setattr(cfg, attr, layers)
    if types:
        cfg.layer_types = list(types[:layers])
    if hasattr(cfg, "max_window_layers") and isinstance(cfg.max_window_layers, int):
        cfg.max_window_layers = min(cfg.max_window_layers, layers)
    return cfg


def _replicate_layers(one: FlopsCount, two: FlopsCount, full: int) -> FlopsCount | None:
    """Extend a count of a 2-layer model to ``full`` identical layers (None if layers differ)."""
    by_suffix: dict[tuple[str, str], dict[int, int]] = {}
    rest: dict[str, int] = {}
    for path, v in two.modules.items():
        m = _LAYER_RE.match(path)
        if m is None:
            rest[path] = v
            continue
        by_suffix.setdefault((m["pre"], m["post"] or ""), {})[int(m["idx"])] = v
    modules = dict(rest)
    for (pre, post), per_idx in by_suffix.items():
        if set(per_idx) != {0, 1} or per_idx[0] != per_idx[1]:
            return None
        for i in range(full):
            modules[f"{pre}.{i}{post}"] = per_idx[0]
    n = full - 1

    def ext(a: int, b: int) -> int:
        return a + n * (b - a)

    out = FlopsCount(backend="torch", method="meta-device capture", decode_forwards=two.decode_forwards)
    out.flops_prefill = ext(one.flops_prefill, two.flops_prefill)
    out.flops_decode = ext(one.flops_decode, two.flops_decode)
    out.macs_prefill = ext(one.macs_prefill, two.macs_prefill)
    out.macs_decode = ext(one.macs_decode, two.macs_decode)
    out.flops_forward = ext(one.flops_forward, two.flops_forward)
    out.macs_forward = ext(one.macs_forward, two.macs_forward)
    for dst, a, b in ((out.module_types, one.module_types, two.module_types),
                      (out.categories, one.categories, two.categories)):
        for k in set(a) | set(b):
            dst[k] = ext(a.get(k, 0), b.get(k, 0))
    out.modules = modules
    if sum(modules.values()) != out.flops_total:
        return None
    out.notes = list(two.notes) + [
        f"decoder layers are identical: 1- and 2-layer copies counted on the meta device and the per-layer "
        f"difference replicated over all {full} layers (full_depth counts every layer)"]
    return out


def count_config(config: Any, batch_size: int, input_tokens: int, output_tokens: int, *,
                 attn_implementation: str = "sdpa", exact: bool = False, full_depth: bool = False) -> FlopsCount:
    """Count a config on the meta device (falls back to the analytic model, labeled, on failure).

    By default a model whose decoder layers are identical is counted on 1- and 2-layer copies and
    the per-layer difference replicated (exact, and independent of depth: a 70B model counts as
    fast as a 1B one); ``full_depth=True`` instantiates and runs every layer.

    Mixture-of-experts routing sends each token to ``top_k`` experts; on the meta device the
    grouped expert GEMM still has the routed shapes (tokens x top_k rows), so the count is exact.
    """
    try:
        attr = _layers_attr(config)
        full = int(getattr(config, attr)) if attr else 0
        if not full_depth and full > 2:
            c1, c2 = _shallow_config(config, 1), _shallow_config(config, 2)
            if c1 is not None and c2 is not None:
                one = count_meta_generate(meta_model(c1, attn_implementation=attn_implementation), batch_size,
                                          input_tokens, output_tokens, exact=exact)
                two = count_meta_generate(meta_model(c2, attn_implementation=attn_implementation), batch_size,
                                          input_tokens, output_tokens, exact=exact)
                rep = _replicate_layers(one, two, full)
                if rep is not None:
                    firsts = {(f["phase"], f["step"]): f for f in one.forwards}
                    rep.forwards = [
                        dict(f, flops=firsts[k]["flops"] + (full - 1) * (f["flops"] - firsts[k]["flops"]),
                             macs=firsts[k]["macs"] + (full - 1) * (f["macs"] - firsts[k]["macs"]))
                        for f in two.forwards if (k := (f["phase"], f["step"])) in firsts]
                    return rep
                log.info("layers differ; counting the full-depth model")
        model = meta_model(config, attn_implementation=attn_implementation)
        return count_meta_generate(model, batch_size, input_tokens, output_tokens, exact=exact)
    except Exception as exc:  # an architecture whose forward needs real values
        log.warning("meta-device count failed; using the analytic model", error=repr(exc))
        c = count_analytic(config, batch_size, input_tokens, output_tokens)
        c.backend = "torch"
        c.method = "analytic (the meta-device forward failed)"
        c.notes.append(f"meta-device forward failed ({type(exc).__name__}: {exc}); counted analytically")
        return c


__all__ = [
    "UnknownModel",
    "bundled_names",
    "count_config",
    "count_meta_generate",
    "meta_copy",
    "meta_model",
    "resolve_config",
]

"""FLOPs counting backends and the common :class:`FlopsCount` they return.

Backends
--------
``torch`` (default)
    perfsdk's dispatch-level counter (:class:`perfsdk.capture.OperationCapture`): every ATen
    operation that runs, with its module path and phase; attention counted for eager and every
    SDPA kernel. Exact for a real run and for the meta device.
``ptflops`` / ``fvcore``
    The third-party counters. Both count multiply-adds; perfsdk converts them (FLOPs = 2 × MACs)
    and labels the result. Both miss fused SDPA attention and only count single forwards: the
    missing attention and the decode steps' attention over the KV cache are filled from the
    analytic attention term, and every such fill is listed in ``notes``.
``analytic``
    :mod:`perfsdk.flops.analytic` from the model config alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from perfsdk.capture import CONVENTION, PHASE_ORDER, OperationCapture
from perfsdk.flops.analytic import ForwardMacs, analytic_generate, forward_macs
from perfsdk.models.arch import Architecture, architecture_from_config
from perfsdk.capture.ops import OpRecord

log = structlog.get_logger("perfsdk.flops")

BACKENDS = ("torch", "ptflops", "fvcore", "analytic")
FLAG_THRESHOLD_PCT = 1.0


class BackendUnavailable(RuntimeError):
    """The requested counting backend cannot run here (missing package, unsupported model)."""


@dataclass
class FlopsCount:
    """FLOPs and MACs of one forward or ``generate`` call, by phase and module.

    Phases: ``encode`` (encoder, vision tower and projector), ``prefill``, ``decode``, and
    ``forward`` for a plain forward; the total is their sum.
    """

    backend: str
    method: str
    flops_encode: int = 0
    macs_encode: int = 0
    flops_prefill: int = 0
    flops_decode: int = 0
    macs_prefill: int = 0
    macs_decode: int = 0
    flops_forward: int = 0
    macs_forward: int = 0
    decode_forwards: int = 0
    modules: dict[str, int] = field(default_factory=dict)  # module path -> FLOPs
    module_types: dict[str, int] = field(default_factory=dict)  # class name -> FLOPs
    categories: dict[str, int] = field(default_factory=dict)  # op category -> FLOPs
    forwards: list[dict[str, Any]] = field(default_factory=list)  # phase, step, context_len, flops, macs
    notes: list[str] = field(default_factory=list)
    convention: str = CONVENTION

    @property
    def flops_total(self) -> int:
        return self.flops_encode + self.flops_prefill + self.flops_decode + self.flops_forward

    @property
    def macs_total(self) -> int:
        return self.macs_encode + self.macs_prefill + self.macs_decode + self.macs_forward

    def top_modules(self, n: int = 10) -> list[dict[str, Any]]:
        """The ``n`` modules with the most FLOPs: name, flops, share_pct."""
        total = self.flops_total
        items = sorted(((k or "(root)", v) for k, v in self.modules.items() if v), key=lambda kv: (-kv[1], kv[0]))
        return [{"name": k, "flops": v, "share_pct": round(100.0 * v / total, 3) if total else 0.0}
                for k, v in items[:n]]

    def shares(self, which: str = "module_types") -> list[dict[str, Any]]:
        """FLOPs by module type (``module_types``) or op category (``categories``), largest first."""
        data: dict[str, int] = getattr(self, which)
        total = self.flops_total
        items = sorted(((k, v) for k, v in data.items() if v), key=lambda kv: (-kv[1], kv[0]))
        return [{"name": k, "flops": v, "share_pct": round(100.0 * v / total, 3) if total else 0.0} for k, v in items]

    def add(self, other: FlopsCount) -> None:
        """Accumulate another count (e.g. the next measured step) into this one."""
        self.flops_encode += other.flops_encode
        self.macs_encode += other.macs_encode
        self.flops_prefill += other.flops_prefill
        self.flops_decode += other.flops_decode
        self.macs_prefill += other.macs_prefill
        self.macs_decode += other.macs_decode
        self.flops_forward += other.flops_forward
        self.macs_forward += other.macs_forward
        self.decode_forwards += other.decode_forwards
        for mine, theirs in ((self.modules, other.modules), (self.module_types, other.module_types),
                             (self.categories, other.categories)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.forwards.extend(other.forwards)
        for n in other.notes:
            if n not in self.notes:
                self.notes.append(n)


def count_from_records(records: list[OpRecord], backend: str = "torch", method: str = "capture") -> FlopsCount:
    """Aggregate captured operations into a :class:`FlopsCount`."""
    c = FlopsCount(backend=backend, method=method)
    modules: dict[str, int] = defaultdict(int)
    types: dict[str, int] = defaultdict(int)
    cats: dict[str, int] = defaultdict(int)
    fwd: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        if r.phase == "encode":
            c.flops_encode += r.flops
            c.macs_encode += r.macs
        elif r.phase == "prefill":
            c.flops_prefill += r.flops
            c.macs_prefill += r.macs
        elif r.phase == "decode":
            c.flops_decode += r.flops
            c.macs_decode += r.macs
        else:
            c.flops_forward += r.flops
            c.macs_forward += r.macs
        if r.flops:
            modules[r.module_path] += r.flops
            types[r.module_type or "?"] += r.flops
            cats[r.category] += r.flops
        row = fwd.setdefault((r.phase, r.step), {"phase": r.phase, "step": r.step, "context_len": r.context_len,
                                                 "flops": 0, "macs": 0})
        row["flops"] += r.flops
        row["macs"] += r.macs
    c.modules, c.module_types, c.categories = dict(modules), dict(types), dict(cats)
    c.forwards = sorted(fwd.values(), key=lambda x: (PHASE_ORDER.get(x["phase"], len(PHASE_ORDER)), x["step"]))
    c.decode_forwards = sum(1 for f in c.forwards if f["phase"] == "decode")
    return c


# -- torch backend (real weights) ---------------------------------------------------------------


def count_forward(model: torch.nn.Module, *args: Any, **kwargs: Any) -> FlopsCount:
    """Count one forward call ``model(*args, **kwargs)`` with the dispatch-level counter."""
    with torch.inference_mode(), OperationCapture(model) as cap:
        model(*args, **kwargs)
    return count_from_records(cap.records, "torch", "capture")


def count_generate(model: torch.nn.Module, **generate_kwargs: Any) -> tuple[Any, FlopsCount]:
    """Run and count ``model.generate(**kwargs)``; every operation attributed to encode/prefill/decode."""
    with torch.inference_mode(), OperationCapture(model, auto_phase=True) as cap:
        out = model.generate(**generate_kwargs)  # type: ignore[operator]
    return out, count_from_records(cap.records, "torch", "capture")


# -- analytic ----------------------------------------------------------------------------------


def count_analytic(cfg: Any, batch_size: int, input_tokens: int, output_tokens: int, *,
                   images: int | None = None) -> FlopsCount:
    """The analytic model as a :class:`FlopsCount` (per part instead of per module)."""
    arch = cfg if isinstance(cfg, Architecture) else architecture_from_config(cfg)
    a = analytic_generate(arch, batch_size, input_tokens, output_tokens, images=images)
    c = FlopsCount(backend="analytic", method="analytic")
    c.flops_encode, c.macs_encode = a.flops_encode, a.macs_encode
    if output_tokens < 1:
        c.flops_forward, c.macs_forward = a.flops_prefill, a.macs_prefill
    else:
        c.flops_prefill, c.flops_decode = a.flops_prefill, a.flops_decode
        c.macs_prefill, c.macs_decode = a.macs_prefill, a.macs_decode
    c.decode_forwards = a.decode_forwards
    p = a.parts_macs
    c.categories = {k: v for k, v in {
        "matmul": 2 * (p["linear"] + p["lm_head"] + p.get("projector", 0) + p.get("patch_embedding", 0)),
        "attention": 2 * p["attention"]}.items() if v}
    c.modules = {"layers (linear)": 2 * p["linear"], "layers (attention)": 2 * p["attention"],
                 "lm_head": 2 * p["lm_head"]}
    if p.get("patch_embedding"):
        c.modules["patch embedding"] = 2 * p["patch_embedding"]
    if p.get("projector"):
        c.modules["projector"] = 2 * p["projector"]
    return c


# -- ptflops / fvcore --------------------------------------------------------------------------


def _attn_impl(model: Any) -> str:
    cfg = getattr(model, "config", None)
    return str(getattr(cfg, "_attn_implementation", None) or "sdpa")


def _ptflops_macs(model: torch.nn.Module, ids: torch.Tensor) -> int:
    try:
        from ptflops import get_model_complexity_info
    except ImportError as exc:
        raise BackendUnavailable("ptflops is not installed (pip install ptflops)") from exc
    import contextlib
    import io

    def inputs(_shape: Any) -> dict[str, Any]:
        # a fresh KV cache: without one, transformers inspects position ids by value (fails on meta)
        from perfsdk.models.internals import cache_kwargs, new_cache

        cache = new_cache(getattr(model, "config", None))
        return {"input_ids": ids, "use_cache": True, "logits_to_keep": 1, **cache_kwargs(model, cache)}

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        macs, _params = get_model_complexity_info(
            model, tuple(ids.shape), input_constructor=inputs,
            as_strings=False, print_per_layer_stat=False, backend="aten", verbose=False)
    if macs is None:
        raise BackendUnavailable("ptflops could not count this model")
    return int(macs)


class _LogitsOnly(torch.nn.Module):
    """fvcore traces positional tensors only: wrap the keyword call of a causal LM."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits  # type: ignore[no-any-return]


def _fvcore_macs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, set[str]]:
    try:
        from fvcore.nn import FlopCountAnalysis
    except ImportError as exc:
        raise BackendUnavailable("fvcore is not installed (pip install fvcore)") from exc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fa = FlopCountAnalysis(_LogitsOnly(model), (ids,))
        fa.unsupported_ops_warnings(False)
        fa.uncalled_modules_warnings(False)
        total = int(fa.total())
        unsupported = set(fa.unsupported_ops())
    return total, unsupported


def count_third_party(backend: str, model: torch.nn.Module, batch_size: int, input_tokens: int,
                      output_tokens: int) -> FlopsCount:
    """Count with ptflops or fvcore on a real-weight model, converted to FLOPs and labeled.

    The backend counts the prefill forward (``input_tokens`` positions, last-position logits) and
    a one-position forward that stands for each decode step's matrix products. Attention the
    backend cannot see (fused SDPA) and the decode steps' attention over the KV cache come from
    the analytic attention term; ``notes`` lists each fill.
    """
    if backend not in ("ptflops", "fvcore"):
        raise ValueError(f"unknown third-party backend {backend!r}")
    spec = architecture_from_config(model.config)  # type: ignore[union-attr]
    if spec.encoder is not None:
        raise BackendUnavailable(f"{backend} counts single decoder forwards; the {spec.kind} architecture "
                                 f"{spec.model_type!r} is counted with the torch or analytic backend")
    dev = next(model.parameters()).device
    ids_pre = torch.zeros((batch_size, input_tokens), dtype=torch.long, device=dev)
    ids_dec = torch.zeros((batch_size, 1), dtype=torch.long, device=dev)
    notes = [f"{backend} counts multiply-adds (MACs); FLOPs = 2 x MACs"]

    def run(ids: torch.Tensor) -> int:
        if backend == "ptflops":
            return _ptflops_macs(model, ids)
        return _fvcore_macs(model, ids)[0]

    def sees_attention(counted: int, expected: ForwardMacs) -> bool:
        # Whether the backend saw the attention products depends on the kernel path it was
        # given (fused SDPA is invisible, the math path is not): decide from which analytic
        # total, with or without attention, the backend's count is nearer.
        without = expected.linear + expected.lm_head
        return abs(counted - (without + expected.attention)) < abs(counted - without)

    with torch.no_grad():
        pre_macs = run(ids_pre)
        dec_macs = 0
        n_dec = max(output_tokens - 1, 0)
        if n_dec:
            one_macs = run(ids_dec)
    pre_expected = forward_macs(spec, batch_size, input_tokens, 0, 1)
    pre_attn = pre_expected.attention
    if not sees_attention(pre_macs, pre_expected):
        pre_macs += pre_attn
        notes.append(f"{backend} did not count the (fused SDPA) attention: prefill attention "
                     f"({2 * pre_attn} FLOPs) filled from the analytic term")
    if n_dec:
        one_expected = forward_macs(spec, batch_size, 1, 0, 1)
        linear_per_step = one_macs - (one_expected.attention if sees_attention(one_macs, one_expected) else 0)
        dec_attn = sum(forward_macs(spec, batch_size, 1, input_tokens + k - 1, 1).attention
                       for k in range(1, output_tokens))
        dec_macs = n_dec * linear_per_step + dec_attn
        notes.append(f"{backend} counts single forwards, not generate: each of the {n_dec} decode steps' "
                     f"matrix products counted on a 1-position forward; attention over the KV cache "
                     f"({2 * dec_attn} FLOPs) filled from the analytic term")
    c = FlopsCount(backend=backend, method=f"{backend} (MACs x 2) + analytic attention fill",
                   flops_prefill=2 * pre_macs, macs_prefill=pre_macs,
                   flops_decode=2 * dec_macs, macs_decode=dec_macs, decode_forwards=n_dec, notes=notes)
    return c


# -- comparison with the analytic model --------------------------------------------------------


def deviation_pct(counted: int, analytic: int) -> float | None:
    """Signed deviation of a count from the analytic value, in percent."""
    if not analytic:
        return None
    return round(100.0 * (counted - analytic) / analytic, 6)


def is_quantized(model: Any) -> str | None:
    """How ``model`` is quantized (``dynamic-int8``, ``bnb-8bit``, ``bnb-4bit``, …) or None."""
    for m in model.modules():
        mod = type(m).__module__
        name = type(m).__name__
        if mod.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")):
            return "dynamic-int8" if "dynamic" in mod else "torch-quantized"
        if mod.startswith("bitsandbytes"):
            return "bnb-4bit" if "4bit" in name else "bnb-8bit"
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    if qc is not None:
        return str(getattr(qc, "quant_method", None) or (qc.get("quant_method") if isinstance(qc, dict) else "quantized"))
    return None


__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "FLAG_THRESHOLD_PCT",
    "FlopsCount",
    "count_analytic",
    "count_forward",
    "count_from_records",
    "count_generate",
    "count_third_party",
    "deviation_pct",
    "is_quantized",
]

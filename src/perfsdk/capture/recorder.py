"""Operation capture: every tensor operation a model executes, as :class:`~perfsdk.capture.ops.OpRecord`.

:class:`OperationCapture` is a context manager built on a ``TorchDispatchMode`` (so it sees the
ATen operations that actually run, on real tensors and on the meta device) plus forward
pre/post hooks on every submodule of the given model (so each operation knows the module path
and type it ran in). The hooks are removed when the block exits, even on error; nothing global
is patched.

Counting convention (the same in the analytic model and every backend)
---------------------------------------------------------------------
- ``flops`` counts multiply and add separately: ``flops == 2 * macs`` for every matrix product
  (``linear``, ``mm``, ``addmm``, ``bmm``, ``matmul``, convolutions) and attention.
- Attention counts the full QKᵀ and PV products over every (query, key) pair the kernel is given:
  ``2 * B * Hq * Lq * Lk * (D + Dv)`` FLOPs, **no causal halving** — like
  ``torch.utils.flop_counter``. Grouped-query attention is counted with the query heads (the
  KV heads are broadcast). Fused SDPA kernels (flash, efficient, cuDNN, math and the CPU flash
  path ``_scaled_dot_product_flash_attention_for_cpu``) and eager ``matmul`` attention give the
  same number.
- Bias additions, normalizations, activations, softmax and other elementwise work carry no
  FLOPs; they report ``elements`` (output elements) so that a cost model can price them.
- ``bytes_read`` / ``bytes_written`` are the operand and result sizes; ``weight_bytes`` is the
  part of ``bytes_read`` that is model parameters or buffers (for an embedding lookup: the rows
  gathered); ``kv_bytes`` is the part of an attention operation's reads that is keys and values.
  View operations move no data and report zero bytes. An attention call that broadcasts fewer
  key/value heads to its query heads without ``enable_gqa`` runs PyTorch's unfused path: its bytes
  and kernel calls (``launches``) are that path's (:func:`broadcast_attention_extra`).
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from perfsdk.capture.ops import OpCategory, OpRecord, Phase

log = structlog.get_logger("perfsdk.capture")

#: Order in which phases run (and are listed).
PHASE_ORDER = {"encode": 0, "prefill": 1, "decode": 2, "forward": 3}

CONVENTION = "full QK^T and PV products, no causal halving (as torch.utils.flop_counter); FLOPs = 2 x MACs"

aten = torch.ops.aten

_SDPA_OPS = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_attention_math_for_mps",
    "aten::_scaled_dot_product_fused_attention_overrideable",
}
# (B, L, H, D) layouts of the low-level kernels
_BLHD_ATTENTION_OPS = {"aten::_flash_attention_forward", "aten::_efficient_attention_forward"}
_MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
               "aten::_addmm_activation", "aten::addbmm", "aten::mv", "aten::dot", "aten::_grouped_mm",
               "aten::_scaled_grouped_mm", "aten::_scaled_mm"}
_CONV_OPS = {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
             "aten::_slow_conv2d_forward", "aten::convolution_overrideable"}
_NORM_OPS = {"aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm", "aten::_fused_rms_norm",
             "aten::group_norm", "aten::native_group_norm", "aten::batch_norm",
             "aten::native_batch_norm", "aten::_native_batch_norm_legit_no_training"}
_ACTIVATION_OPS = {"aten::silu", "aten::gelu", "aten::relu", "aten::tanh", "aten::sigmoid",
                   "aten::hardswish", "aten::mish", "aten::elu", "aten::leaky_relu", "aten::softplus",
                   "aten::glu", "aten::silu_", "aten::relu_", "aten::gelu_"}
_SOFTMAX_OPS = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::log_softmax",
                "aten::_log_softmax"}
_EMBEDDING_OPS = {"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag"}
# Ops that only describe tensors; never recorded.
_SKIP_OPS = {"aten::size", "aten::sym_size", "aten::stride", "aten::sym_stride", "aten::numel",
             "aten::sym_numel", "aten::dim", "aten::is_contiguous", "aten::sym_is_contiguous",
             "aten::is_strides_like_format", "aten::is_non_overlapping_and_dense",
             "aten::storage_offset", "aten::sym_storage_offset", "aten::_local_scalar_dense",
             "aten::is_same_size", "aten::result_type", "prim::device", "aten::item"}
# Handled here as one operation: do not decompose them into their parts.
_NO_DECOMPOSE = _SDPA_OPS | _MATMUL_OPS | _NORM_OPS | _ACTIVATION_OPS | _SOFTMAX_OPS | _EMBEDDING_OPS


def _tensor_bytes(t: torch.Tensor) -> int:
    return int(t.numel()) * int(t.element_size())


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)) and all(not isinstance(x, (tuple, list, dict)) for x in obj):
        return [x for x in obj if isinstance(x, torch.Tensor)]
    flat, _ = tree_flatten(obj)
    return [x for x in flat if isinstance(x, torch.Tensor)]


def _prod(xs: Iterable[int]) -> int:
    return int(math.prod(int(x) for x in xs))


def matmul_macs(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Multiply-adds of ``torch.matmul(a, b)`` for tensors of these shapes (with broadcasting)."""
    if len(a) == 1 and len(b) == 1:
        return int(a[0])
    if len(a) == 1:  # (k) @ (..., k, n)
        return _prod(b[:-2]) * int(b[-2]) * int(b[-1])
    if len(b) == 1:  # (..., m, k) @ (k)
        return _prod(a[:-1]) * int(a[-1])
    batch = torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return _prod(batch) * int(a[-2]) * int(a[-1]) * int(b[-1])


def attention_macs(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    """Multiply-adds of QKᵀ plus PV for ``(…, Hq, Lq, D)`` queries and ``(…, Hk, Lk, D)`` keys.

    Full products (no causal halving); KV heads broadcast to the query heads (GQA).
    """
    return attention_scores(q, k) * (int(q[-1]) + int(v[-1]))


def attention_scores(q: tuple[int, ...], k: tuple[int, ...]) -> int:
    """Score elements (query x key pairs over every head) of a fused attention kernel for
    ``(…, Hq, Lq, D)`` queries and ``(…, Hk, Lk, D)`` keys: the softmax it computes inside, which
    costs per element whatever the head size (no causal halving, as :func:`attention_macs`)."""
    return _prod(q[:-2]) * int(q[-2]) * int(k[-2])


def broadcast_attention_extra(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
                              masked: bool) -> tuple[int, int, int]:
    """Elements read, elements written and kernel calls that PyTorch's unfused attention adds over a
    fused kernel's (which reads Q, K, V and the mask and writes the output) for a
    ``scaled_dot_product_attention`` call whose keys and values have fewer heads than its queries
    and that does not pass ``enable_gqa`` (multi-query attention written as ``q [B, H, L, D]``
    against ``k, v [B, 1, S, D]``, broadcast). No fused kernel takes heads of different counts, so
    the math path runs, one kernel at a time: Q and Kᵀ each scaled (read and written), QKᵀ into a
    score tensor, the mask added to it, its softmax, and the product with V (the scores written
    and read three times each). With more than one sequence in the batch, broadcasting a key or
    value head to every query head cannot be a view: K and V are copied out to the queries' heads
    first, and the products read the copies. Returns ``(read, written, calls)``, ``calls`` beyond
    the fused kernel's one."""
    nq, nk, nv = _prod(q), _prod(k), _prod(v)
    scores = attention_scores(q, k)
    read = nq + nk + 3 * scores
    written = nq + nk + 3 * scores
    calls = 5 + int(masked)  # two scalings, two products, the softmax (and the mask's addition)
    batch = _prod(q[:-3])
    if batch > 1 and k[-3] < q[-3]:
        rep = int(q[-3]) // max(1, int(k[-3]))
        # the copies read K and V once and write them rep times; the products read the copies
        # (rep times K and V) where the fused kernel read K and V once
        read += rep * (nk + nv)
        written += rep * (nk + nv)
        calls += 2
    return read, written, calls - 1


@dataclass
class _Frame:
    path: str
    type_name: str
    module: torch.nn.Module


class _WeightSet:
    """Identity set of tensors that are (views of) model parameters or buffers.

    Keyed by ``id`` with a weak reference to guard against reuse of ids by new tensors.
    """

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}

    def add(self, t: torch.Tensor) -> None:
        key = id(t)

        def forget(_ref: weakref.ref[torch.Tensor], k: int = key) -> None:
            self._refs.pop(k, None)

        try:
            self._refs[key] = weakref.ref(t, forget)
        except TypeError:  # pragma: no cover - tensors are weak-referenceable
            pass

    def __contains__(self, t: object) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t

    def clear(self) -> None:
        self._refs.clear()


class _CaptureMode(TorchDispatchMode):
    def __init__(self, capture: OperationCapture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        cap = self.capture
        name = func._schema.name if hasattr(func, "_schema") else str(func)
        if name in _SKIP_OPS:
            return func(*args, **kwargs)
        if name not in _NO_DECOMPOSE and _is_composite(func):
            # Composite ops (einsum, tensordot, ...) may hide matrix products: record their parts.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        clock = cap.op_clock
        t0 = clock() if clock is not None else 0
        out = func(*args, **kwargs)
        elapsed_ns = clock() - t0 if clock is not None else None
        try:
            cap._record(func, name, args, kwargs, out, elapsed_ns)
        except Exception as exc:  # capture must never break the model
            log.warning("could not record operation", op=name, error=repr(exc))
        return out


_COMPOSITE_CACHE: dict[Any, bool] = {}


def _is_composite(func: Any) -> bool:
    hit = _COMPOSITE_CACHE.get(func)
    if hit is None:
        try:
            hit = bool(torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"))
        except Exception:
            hit = False
        _COMPOSITE_CACHE[func] = hit
    return hit


class OperationCapture:
    """Record every operation ``model`` executes inside the ``with`` block.

    ``phase``/``step``/``context_len`` are stamped on each record and can be changed while
    capturing with :meth:`set_phase`. With ``auto_phase=True`` (one capture per ``model.generate``
    call) the calls of the top module are attributed in order: the first is ``prefill``
    (``step`` 0), each later one ``decode`` with ``step`` 1, 2, … and ``context_len`` = cached
    plus new positions (read through :mod:`perfsdk.models.internals`; when the cache contradicts
    the order, :attr:`phase_unavailable` says so); operations inside the model's encode modules (an encoder-decoder's
    encoder, a vision or audio tower and its projector, see :mod:`perfsdk.models.encode`) are
    ``encode`` (``step`` 0), whether they run before the first forward or inside it. Operations
    that run outside ``model``'s modules (e.g. sampling inside ``generate``) are not recorded
    unless ``include_outside=True``.

    With ``op_clock`` (a nanosecond clock, e.g. one that synchronizes CUDA first) each record's
    ``time_s`` is the time its operation took: the clock read just before and just after the
    operation runs, the recording itself left out.
    """

    def __init__(self, model: torch.nn.Module | None = None, *, phase: Phase = "forward", step: int = 0,
                 context_len: int | None = None, auto_phase: bool = False, include_outside: bool = False,
                 op_clock: Callable[[], int] | None = None) -> None:
        self.model = model
        self.phase: Phase = phase
        self.step = step
        self.context_len = context_len
        self.auto_phase = auto_phase
        self.include_outside = include_outside
        self.op_clock = op_clock
        self.records: list[OpRecord] = []
        self.forwards: list[dict[str, Any]] = []  # one entry per top-module call: phase, step, context_len
        self._stack: list[_Frame] = []
        self._handles: list[Any] = []
        self._weights = _WeightSet()
        self._mode: _CaptureMode | None = None
        self._root_type = type(model).__name__ if model is not None else ""
        self._encode_depth = 0
        self._before_encode: tuple[Phase, int, int | None] = (phase, step, context_len)
        from perfsdk.models.internals import PhaseTracker

        self._phases = PhaseTracker()

    @property
    def phase_unavailable(self) -> str | None:
        """Why the prefill/decode split of this capture cannot be trusted (None when it can)."""
        return self._phases.unavailable if self.auto_phase else None

    # -- public ---------------------------------------------------------------------------

    def set_phase(self, phase: Phase, step: int | None = None, context_len: int | None = None) -> None:
        """Stamp the following operations with this phase (and step, context length)."""
        self.phase = phase
        if step is not None:
            self.step = step
        self.context_len = context_len

    def __enter__(self) -> OperationCapture:
        self._install()
        self._mode = _CaptureMode(self)
        try:
            self._mode.__enter__()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(exc_type, exc, tb)
        finally:
            self._mode = None
            self._remove()

    # -- totals ---------------------------------------------------------------------------

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.records)

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.records)

    def totals(self) -> dict[str, dict[str, int]]:
        from perfsdk.capture.totals import totals_by_phase

        return totals_by_phase(self.records)

    # -- hooks ----------------------------------------------------------------------------

    def _install(self) -> None:
        if self.model is None:
            return
        for p in self.model.parameters():
            self._weights.add(p)
        for b in self.model.buffers():
            self._weights.add(b)
        encode: set[str] = set()
        if self.auto_phase:
            from perfsdk.models.encode import encode_paths

            encode = encode_paths(self.model)
        for path, mod in self.model.named_modules():
            frame = _Frame(path, type(mod).__name__, mod)
            is_root = mod is self.model
            is_encode = path in encode
            self._handles.append(mod.register_forward_pre_hook(self._make_pre(frame, is_root, is_encode),
                                                               with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._make_post(frame, is_encode), always_call=True))

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()
        self._weights.clear()

    def _make_pre(self, frame: _Frame, is_root: bool, is_encode: bool = False) -> Any:
        def pre(mod: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if is_root and not self._stack:
                self._on_root_forward(args, kwargs)
            if is_encode:
                if self._encode_depth == 0:
                    self._before_encode = (self.phase, self.step, self.context_len)
                    self.phase, self.step, self.context_len = "encode", 0, None
                self._encode_depth += 1
            self._stack.append(frame)

        return pre

    def _make_post(self, frame: _Frame, is_encode: bool = False) -> Any:
        def post(mod: torch.nn.Module, args: Any, output: Any) -> None:
            # pop up to and including this frame (tolerates a frame left behind by an error)
            for i in range(len(self._stack) - 1, -1, -1):
                if self._stack[i] is frame:
                    del self._stack[i:]
                    break
            if is_encode and self._encode_depth > 0:
                self._encode_depth -= 1
                if self._encode_depth == 0:
                    self.phase, self.step, self.context_len = self._before_encode

        return post

    def _on_root_forward(self, args: Any, kwargs: dict[str, Any]) -> None:
        if self.auto_phase:
            phase, self.step, self.context_len = self._phases.on_forward(args, kwargs)
            self.phase = phase  # type: ignore[assignment]
        self.forwards.append({"phase": self.phase, "step": self.step, "context_len": self.context_len})

    # -- recording ------------------------------------------------------------------------

    def _record(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                elapsed_ns: int | None = None) -> None:
        ins = _tensors(args) + (_tensors(list(kwargs.values())) if kwargs else [])
        outs = _tensors(out)
        is_view = bool(getattr(func, "is_view", False))
        weight_in = [t for t in ins if t in self._weights]
        if weight_in and (is_view or name in ("aten::_to_copy", "aten::to", "aten::contiguous", "aten::clone")):
            for t in outs:  # views and casts of weights are still weights
                self._weights.add(t)
        if not self._stack and not self.include_outside:
            return
        frame = self._stack[-1] if self._stack else None
        path = frame.path if frame else "<outside>"
        mtype = frame.type_name if frame else None
        in_attention = any("attention" in f.type_name.lower() or "attn" in f.type_name.lower() for f in self._stack)
        in_norm = frame is not None and "norm" in frame.type_name.lower()

        category: OpCategory = "other"
        macs = 0
        flops_override: int | None = None
        kv = 0
        scores = 0  # score elements of a fused attention kernel (the softmax it runs inside)
        unfused: tuple[int, int, int] | None = None  # what the unfused attention path adds
        shapes = [tuple(int(s) for s in t.shape) for t in ins]
        if name in _SDPA_OPS or name in _BLHD_ATTENTION_OPS:
            q, k, v = (tuple(int(s) for s in a.shape) for a in args[:3])
            if name in _BLHD_ATTENTION_OPS:  # (B, L, H, D) -> (B, H, L, D)
                q, k, v = ((x[0], x[2], x[1], x[3]) for x in (q, k, v))
            macs = attention_macs(q, k, v)
            scores = attention_scores(q, k)
            category = "attention"
            kv = _tensor_bytes(args[1]) + _tensor_bytes(args[2])
            if name == "aten::scaled_dot_product_attention" and len(q) >= 3 and k[-3] != q[-3] \
                    and not (kwargs or {}).get("enable_gqa"):
                mask = args[3] if len(args) > 3 else (kwargs or {}).get("attn_mask")
                unfused = broadcast_attention_extra(q, k, v, isinstance(mask, torch.Tensor))
        elif name in _MATMUL_OPS:
            macs = self._matmul_macs(name, args, outs)
            has_weight = bool(weight_in)
            if not has_weight and in_attention:
                category = "attention"
                operand = args[2] if name in ("aten::baddbmm", "aten::addbmm") else args[1]
                if isinstance(operand, torch.Tensor):
                    kv = _tensor_bytes(operand)
            else:
                category = "matmul"
        elif name in _CONV_OPS:
            from torch.utils.flop_counter import flop_registry

            fn = flop_registry.get(func.overloadpacket)
            if fn is not None:
                flops_override = int(fn(*args, **kwargs, out_val=out))
                macs = flops_override // 2
            category = "matmul"
        elif name in _EMBEDDING_OPS:
            category = "embedding"
        elif name in _SOFTMAX_OPS:
            category = "softmax"
        elif name in _NORM_OPS:
            category = "norm"
        elif name in _ACTIVATION_OPS:
            category = "activation"
        elif is_view:
            category = "other"
        elif _is_elementwise(name, outs):
            category = "norm" if in_norm else "elementwise"

        stored_rows: int | None = None  # rows of a matrix product's weight as stored
        in_out = False  # ... and whether it is stored [in, out]
        groups: int | None = None  # groups of a grouped product's weight, and the rows of each
        group_rows: list[int] | None = None
        picks: int | None = None  # ... and the groups each token's rows go to (the router's top-k)
        if is_view:
            bytes_read = bytes_written = weight_bytes = 0
        elif category == "embedding":
            gathered = sum(_tensor_bytes(t) for t in outs)
            idx = sum(_tensor_bytes(t) for t in ins if t not in self._weights)
            bytes_read, weight_bytes, bytes_written = gathered + idx, gathered, gathered
        else:
            bytes_read = sum(_tensor_bytes(t) for t in ins)
            weight_bytes = sum(_tensor_bytes(t) for t in weight_in)
            bytes_written = sum(_tensor_bytes(t) for t in outs)
            share = 1.0
            if name in ("aten::_grouped_mm", "aten::_scaled_grouped_mm") and weight_bytes:
                # experts stored as one [E, ...] tensor: the product reads the experts its rows reach
                # (the offsets read once: on a GPU reading them waits for the device)
                grouping = grouped_rows(args, kwargs)
                if grouping is not None:
                    groups, group_rows = grouping
                    picks = self._routing_picks()
                    share = reached_share(groups, group_rows, int(args[0].shape[0]), picks)
                unread = int(weight_bytes * (1.0 - share))
                bytes_read, weight_bytes = bytes_read - unread, weight_bytes - unread
            if category == "matmul" and weight_in:
                stored_rows = round(share * max(stored_weight_rows(t) for t in weight_in))
                in_out = weight_stored_in_out(name, args, weight_in)
            if unfused is not None:
                size = int(args[0].element_size())
                bytes_read += unfused[0] * size
                bytes_written += unfused[1] * size
        elements = sum(int(t.numel()) for t in outs) if category not in ("matmul", "attention") and not is_view else scores
        dtype_src = outs[0] if outs else (ins[0] if ins else None)
        self.records.append(
            OpRecord(
                module_path=path,
                op=name.replace("aten::", "aten."),
                category=category,
                phase=self.phase,
                step=self.step,
                input_shapes=shapes,
                output_shape=tuple(int(s) for s in outs[0].shape) if outs else None,
                dtype=str(dtype_src.dtype).replace("torch.", "") if dtype_src is not None else "float32",
                flops=flops_override if flops_override is not None else 2 * macs,
                macs=macs,
                bytes_read=bytes_read,
                bytes_written=bytes_written,
                weight_bytes=weight_bytes,
                kv_bytes=kv,
                elements=elements,
                context_len=self.context_len,
                module_type=mtype,
                time_s=elapsed_ns / 1e9 if elapsed_ns is not None else None,
                weight_rows=stored_rows,
                weight_in_out=in_out,
                groups=groups,
                group_rows=group_rows,
                group_picks=picks,
                input_dtype=(str(ins[0].dtype).replace("torch.", "") if name == "aten::_to_copy" and ins
                             else None),
                launches=1 + (unfused[2] if unfused is not None else 0),
            )
        )

    def _routing_picks(self) -> int | None:
        """Groups each token's rows go to in a grouped product (a mixture-of-experts router's
        top-k): the ``top_k`` or ``num_experts_per_tok`` of the innermost module around the op that
        has one (the sparse block or its router), else the model config's ``num_experts_per_tok``
        (or its text model's); None where none says."""
        def picks(obj: Any, names: tuple[str, ...]) -> int | None:
            for name in names:
                v = getattr(obj, name, None)
                if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
                    return v
            return None

        for frame in reversed(self._stack):
            found = picks(frame.module, ("top_k", "num_experts_per_tok"))
            if found is not None:
                return found
        cfg = getattr(self.model, "config", None)
        if cfg is None:
            return None
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else None
        return picks(cfg, ("num_experts_per_tok",)) or (picks(text, ("num_experts_per_tok",)) if text is not None else None)

    @staticmethod
    def _matmul_macs(name: str, args: tuple[Any, ...], outs: list[torch.Tensor]) -> int:
        def shp(i: int) -> tuple[int, ...]:
            return tuple(int(s) for s in args[i].shape)

        if name in ("aten::_grouped_mm", "aten::_scaled_grouped_mm"):
            # grouped GEMM (mixture-of-experts): each output element contracts one K slice
            a, b = shp(0), shp(1)
            if len(a) == 2 and len(b) == 2:  # groups split K: M x K_total x N
                return int(a[0]) * int(a[1]) * int(b[1])
            return int(outs[0].numel()) * int(a[-1]) if outs else 0

        if name == "aten::linear":
            x, w = shp(0), shp(1)
            return _prod(x[:-1]) * int(w[0]) * int(w[1])
        if name in ("aten::mm", "aten::bmm", "aten::matmul", "aten::mv", "aten::dot", "aten::_scaled_mm"):
            return matmul_macs(shp(0), shp(1))
        if name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation", "aten::addbmm"):
            a, b = shp(1), shp(2)
            return matmul_macs(a, b)
        return 0


def stored_weight_rows(t: torch.Tensor) -> int:
    """Rows of a weight as stored in memory: its elements over the length of its contiguous
    (stride-1) dimension. A linear layer's ``[out, in]`` weight has ``out`` (also when a product
    reads it transposed), a Conv1D's ``[in, out]`` weight ``in``, experts stored ``[E, in, out]``
    ``E * in``; a vector (a bias) has one."""
    if t.dim() < 2:
        return 1
    inner = [d for d in range(t.dim()) if t.stride(d) == 1 and t.shape[d] > 1]
    length = int(t.shape[inner[-1]]) if inner else int(t.shape[-1])
    return int(t.numel()) // max(1, length)


#: where each matrix product takes its second operand, the one a layer's weight is in a model's
#: product ``x @ W``, in ``[..., in, out]`` orientation (``aten::linear`` takes it ``[out, in]``)
_PRODUCT_OPERAND = {"aten::addmm": 2, "aten::baddbmm": 2, "aten::addbmm": 2, "aten::_addmm_activation": 2,
                    "aten::mm": 1, "aten::bmm": 1, "aten::matmul": 1, "aten::_grouped_mm": 1,
                    "aten::_scaled_grouped_mm": 1, "aten::_scaled_mm": 1, "aten::linear": 1}


def weight_stored_in_out(name: str, args: tuple[Any, ...], weights: list[torch.Tensor]) -> bool:
    """Whether a matrix product reads its weight stored ``[in, out]`` (its output features
    contiguous, as transformers' Conv1D stores it) rather than ``[out, in]`` (a linear layer's,
    which the product reads transposed). False when the weight is not the product's second
    operand or is a vector."""
    i = _PRODUCT_OPERAND.get(name)
    w = args[i] if i is not None and len(args) > i else None
    if not isinstance(w, torch.Tensor) or w.dim() < 2 or not any(w is t for t in weights):
        return False
    out_dim = -2 if name == "aten::linear" else -1  # linear's weight is [out, in]
    return int(w.shape[out_dim]) > 1 and w.stride(out_dim) == 1


def grouped_rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, list[int] | None] | None:
    """``(E, rows of each group)`` of a grouped product over ``[E, ...]`` weights
    (mixture-of-experts), the rows read off the offsets of a real run (``None`` on the meta device,
    where the offsets have no values); ``None`` for any other product."""
    w = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
    if w is None or w.dim() != 3 or not isinstance(args[0], torch.Tensor) or args[0].dim() != 2:
        return None
    groups = int(w.shape[0])
    offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
    if isinstance(offs, torch.Tensor) and offs.device.type != "meta" and offs.numel() == groups:
        ends = offs.detach().to("cpu", torch.int64)
        sizes = torch.diff(ends, prepend=torch.zeros(1, dtype=torch.int64))
        return groups, [int(x) for x in sizes.tolist()]
    return groups, None


def grouped_weight_share(args: tuple[Any, ...], kwargs: dict[str, Any], picks: int | None = None) -> float:
    """Share of a grouped product's ``[E, ...]`` weights its rows reach (mixture-of-experts):
    the groups with rows, read off the offsets of a real run; on the meta device, where the
    offsets have no values, the expected share (:func:`reached_share`; ``picks``: the groups each
    token's rows go to, the router's top-k)."""
    grouping = grouped_rows(args, kwargs)
    return 1.0 if grouping is None else reached_share(*grouping, int(args[0].shape[0]), picks)


def reached_share(groups: int, group_rows: list[int] | None, rows: int, picks: int | None = None) -> float:
    """Share of ``groups`` reached by a grouped product of ``rows`` routed rows: the groups with
    rows (``group_rows``, from a real run), else the expected share. A router sends each of the
    ``rows / k`` tokens to ``k = picks`` different groups, so a group is missed by all of them with
    probability ``(1 - k/E)^(M/k)``; without ``picks`` each row picks one of the E groups on its
    own, ``(1 - 1/E)^M``. (Top-2 of 4 groups, one token: 2 groups of 4 reached, where rows picking
    on their own would reach 1.75.)"""
    if groups <= 1:
        return 1.0
    if group_rows is not None:
        return float(sum(1 for r in group_rows if r > 0)) / groups
    if picks and picks <= groups:
        return 1.0 - (1.0 - picks / groups) ** (rows / picks)
    return 1.0 - (1.0 - 1.0 / groups) ** rows


_ELEMENTWISE_HINTS = ("add", "sub", "mul", "div", "pow", "sqrt", "rsqrt", "exp", "log", "neg", "cos", "sin",
                      "mean", "sum", "where", "abs", "clamp", "maximum", "minimum", "max", "min", "erf",
                      "reciprocal", "masked_fill", "tril", "triu", "eq", "ne", "lt", "le", "gt", "ge",
                      "bitwise", "logical", "floor", "ceil", "round", "sign", "square", "var", "std",
                      "argmax", "topk", "cumsum", "lerp", "addcmul", "addcdiv", "fill")


def _is_elementwise(name: str, outs: list[torch.Tensor]) -> bool:
    base = name.split("::", 1)[-1].lstrip("_").rstrip("_")
    return any(base == h or base.startswith(h + "_") or base.startswith(h) for h in _ELEMENTWISE_HINTS) and bool(outs)


def capture_generate(model: torch.nn.Module, **generate_kwargs: Any) -> tuple[Any, OperationCapture]:
    """Run ``model.generate(**kwargs)`` under an auto-phased capture; returns (output, capture)."""
    with torch.inference_mode(), OperationCapture(model, auto_phase=True) as cap:
        out = model.generate(**generate_kwargs)  # type: ignore[operator]
    return out, cap

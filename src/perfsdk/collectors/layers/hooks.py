"""Forward hooks that time module calls, and which modules get them.

:class:`ModuleTimer` puts a forward pre-hook and a forward hook on the selected modules for one
step, timestamps every call on the given clock and removes every hook when told to (the
collector does so when the step ends, whether it succeeded or raised).

Each call is recorded with its phase: inside ``generate``, calls within the model's encode
modules (:func:`perfsdk.models.encode.encode_paths`: an encoder-decoder's encoder, a vision or
audio tower and its projector) are ``encode``, whether they run before the first top-module call
or inside it; other calls take the phase of the top-module call that contains them (calls before
the first one count as prefill). The outermost coverage calls and the outermost encode calls are
summed apart, so that a call nested in another one is counted once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import structlog

from perfsdk.collectors.layers.config import LayersConfig
from perfsdk.collectors.layers.result import LayerPhase, ParamValue

log = structlog.get_logger("perfsdk.collectors.layers")

#: How the top module is named in paths (``named_modules`` gives it the empty string).
ROOT_PATH = "(root)"

#: Module attributes shown as its settings in the layer table, when present and plain values.
PARAM_ATTRS = (
    "in_features", "out_features", "in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
    "groups", "num_embeddings", "embedding_dim", "padding_idx", "normalized_shape", "num_features", "eps",
    "variance_epsilon", "momentum", "affine", "elementwise_affine", "dim", "p", "inplace", "approximate",
    "negative_slope", "embed_dim", "num_heads", "head_dim", "hidden_size", "num_key_value_heads",
    "num_key_value_groups", "output_size", "scale_factor", "mode", "input_size", "num_layers", "bidirectional",
    "batch_first",
)


def _is_container(module: Any) -> bool:
    import torch.nn as nn

    return isinstance(module, (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict))


def coverage_paths(root: Any) -> list[str]:
    """The modules whose times should add up to (almost) the whole top-module time.

    The top module's children, where a child holding a block stack (a ``ModuleList`` or
    ``ModuleDict``) is replaced by its children, recursively; containers themselves are never
    called, so their entries stand for them. A leaf top module covers itself.
    """
    out: list[str] = []

    def expand(prefix: str, module: Any) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if _is_container(child) or any(_is_container(c) for c in child.children()):
                expand(path, child)
            else:
                out.append(path)

    expand("", root)
    return out or [""]


def _plain(value: Any) -> tuple[bool, ParamValue]:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True, value
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return True, [int(v) for v in value]
    return False, None


def module_params(module: Any) -> dict[str, ParamValue]:
    """A module's settings (``in_features``, ``kernel_size``, ``eps`` ...; ``bias`` as whether it
    has one): the attributes of :data:`PARAM_ATTRS` it has, when they are plain values."""
    out: dict[str, ParamValue] = {}
    attrs = vars(module)
    for name in PARAM_ATTRS:
        if name in attrs:
            ok, value = _plain(attrs[name])
            if ok:
                out[name] = value
    params = getattr(module, "_parameters", {})
    if "bias" in params or "bias" in attrs:
        out["bias"] = params.get("bias", attrs.get("bias")) is not None
    return out


def parameter_count(module: Any) -> int:
    """Parameters the module holds, its children included."""
    return sum(int(p.numel()) for p in module.parameters())


def _describe(module: Any) -> tuple[dict[str, ParamValue], int | None]:
    """Settings and parameter count; an exotic module (lazy parameters ...) never breaks timing."""
    try:
        params = module_params(module)
    except Exception:
        params = {}
    try:
        count: int | None = parameter_count(module)
    except Exception:
        count = None
    return params, count


@dataclass
class Target:
    """One hooked module."""

    path: str
    module_type: str
    depth: int
    is_root: bool
    in_coverage: bool
    order: int = 0
    is_encode: bool = False
    params: dict[str, ParamValue] = field(default_factory=dict)
    parameters: int | None = None


@dataclass
class StepRecord:
    """What one instrumented step recorded, raw."""

    index: int
    kind: str
    start_ns: int = 0
    # (target index, forward index, start_ns, duration_ns, input shapes or None, phase)
    calls: list[tuple[int, int, int, int, list[list[int]] | None, LayerPhase]] = field(default_factory=list)
    # time of the outermost coverage-module calls
    coverage_ns: int = 0
    # outermost encode-module calls: (duration_ns, phase of the top-module call they ran in, or
    # None when they ran outside it)
    encode_calls: list[tuple[int, LayerPhase | None]] = field(default_factory=list)
    context_lens: list[int | None] = field(default_factory=list)
    first_shapes: dict[tuple[int, str], list[list[int]]] = field(default_factory=dict)
    hook_ns: int = 0
    hook_calls: int = 0


def tensor_shapes(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[list[int]]:
    shapes = [list(a.shape) for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
    if kwargs:
        shapes.extend(list(v.shape) for v in kwargs.values() if hasattr(v, "shape") and hasattr(v, "dtype"))
    return shapes


def context_len(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Cached positions + new positions of a top-module call, when they can be read."""
    from perfsdk.models.internals import context_length

    return context_length(args, kwargs)


def phase_of(kind: str, forward_index: int) -> LayerPhase:
    """Phase of a call outside the encode modules: inside ``generate`` the first top-module call
    is the prefill, later ones decode steps; calls before the first top-module call (index -1)
    prepare the prompt, so they count as prefill."""
    if kind != "generate":
        return "forward"
    return "prefill" if forward_index <= 0 else "decode"


# An open call: (start_ns, forward index, phase, outermost coverage call, outermost encode call,
# phase of the top-module call an outermost encode call runs in)
_OpenCall = tuple[int, int, LayerPhase, bool, bool, Union[LayerPhase, None]]


class ModuleTimer:
    """Times the selected modules of a model for one step at a time."""

    def __init__(self, cfg: LayersConfig) -> None:
        self.cfg = cfg
        self.targets: list[Target] = []
        self.now: Callable[[], int] = time.perf_counter_ns
        self._handles: list[Any] = []
        self._stacks: list[list[_OpenCall]] = []
        self._pending_shapes: list[list[Any]] = []
        self._current: StepRecord | None = None
        self._forward_index = -1
        self._encode_depth = 0
        self._coverage_depth = 0
        self._root_stack: list[_OpenCall] = []

    @property
    def current(self) -> StepRecord | None:
        """The record of the step being timed (None between steps)."""
        return self._current

    def select(self, root: Any) -> list[tuple[Target, Any]]:
        """The modules to time: the top module, the coverage modules, the encode modules and
        those the filters keep.

        An encode module counts as a coverage module unless coverage modules already sit inside
        it (T5's encoder blocks are coverage modules, so the encoder itself is not).
        """
        from perfsdk.models.encode import encode_paths

        cover = set(coverage_paths(root))
        encode = set(encode_paths(root))
        cover |= {e for e in encode if not any(c == e or c.startswith(e + ".") for c in cover)}
        wanted_types = set(self.cfg.module_types) if self.cfg.module_types is not None else None
        out: list[tuple[Target, Any]] = []
        for order, (path, module) in enumerate(root.named_modules()):
            if _is_container(module):
                continue
            depth = 0 if path == "" else path.count(".") + 1
            is_root = path == ""
            in_cov = path in cover
            is_encode = path in encode
            keep = is_root or in_cov or is_encode
            if not keep:
                type_ok = wanted_types is None or type(module).__name__ in wanted_types
                depth_ok = self.cfg.max_depth is None or depth <= self.cfg.max_depth
                keep = type_ok and depth_ok
            if keep:
                params, count = _describe(module)
                out.append((Target(path or ROOT_PATH, type(module).__name__, depth, is_root, in_cov, order,
                                   params=params, parameters=count, is_encode=is_encode), module))
        return out

    def attach(self, root: Any, rec: StepRecord) -> None:
        """Hook the selected modules of ``root``; calls are recorded into ``rec``."""
        selected = self.select(root)
        self.targets = [t for t, _ in selected]
        self._stacks = [[] for _ in selected]
        self._pending_shapes = [[] for _ in selected]
        self._current = rec
        self._forward_index = -1
        self._encode_depth = 0
        self._coverage_depth = 0
        self._root_stack = next((self._stacks[i] for i, t in enumerate(self.targets) if t.is_root), [])
        try:
            for i, (target, module) in enumerate(selected):
                self._handles.append(module.register_forward_pre_hook(self._make_pre(i, target), with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._make_post(i, target), always_call=True))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Remove every hook (idempotent) and stop recording."""
        handles, self._handles = self._handles, []
        for h in handles:
            try:
                h.remove()
            except Exception as exc:  # a handle whose module is gone: nothing left to remove
                log.warning("could not remove a hook", error=repr(exc))
        self._current = None

    def _make_pre(self, i: int, target: Target) -> Any:
        stack = self._stacks[i]
        kind = self._current.kind if self._current is not None else "forward"
        log_events = self.cfg.log_events
        is_root, in_cov = target.is_root, target.in_coverage
        is_encode = target.is_encode and kind == "generate"

        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h0 = time.perf_counter_ns()
            rec = self._current
            if rec is None:
                return
            if is_root:
                self._forward_index += 1
                rec.context_lens.append(context_len(args, kwargs))
            encode_start = is_encode and self._encode_depth == 0
            if is_encode:
                self._encode_depth += 1
            outer_phase = phase_of(kind, self._forward_index)
            phase: LayerPhase = "encode" if self._encode_depth > 0 else outer_phase
            cov_outer = in_cov and self._coverage_depth == 0
            if in_cov:
                self._coverage_depth += 1
            # an encode pass inside a top-module call is taken out of that call's phase
            nested_in = outer_phase if encode_start and self._root_stack else None
            key = (i, phase)
            shapes = None
            if log_events or key not in rec.first_shapes:
                shapes = tensor_shapes(args, kwargs)
                rec.first_shapes.setdefault(key, shapes)
            t0 = self.now()
            stack.append((t0, self._forward_index, phase, cov_outer, encode_start, nested_in))
            rec.hook_calls += 1
            rec.hook_ns += time.perf_counter_ns() - h0
            if log_events:
                self._pending_shapes[i].append(shapes)

        return pre

    def _make_post(self, i: int, target: Target) -> Any:
        stack = self._stacks[i]
        log_events = self.cfg.log_events
        in_cov = target.in_coverage
        is_encode = target.is_encode and self._current is not None and self._current.kind == "generate"

        def post(module: Any, args: tuple[Any, ...], output: Any) -> None:
            t1 = self.now()
            h0 = time.perf_counter_ns()
            rec = self._current
            if rec is None or not stack:
                return
            t0, fwd, phase, cov_outer, encode_start, nested_in = stack.pop()
            if in_cov:
                self._coverage_depth = max(0, self._coverage_depth - 1)
            if is_encode:
                self._encode_depth = max(0, self._encode_depth - 1)
            if cov_outer:
                rec.coverage_ns += t1 - t0
            if encode_start:
                rec.encode_calls.append((t1 - t0, nested_in))
            shapes = self._pending_shapes[i].pop() if log_events and self._pending_shapes[i] else None
            rec.calls.append((i, fwd, t0, t1 - t0, shapes, phase))
            rec.hook_calls += 1
            rec.hook_ns += time.perf_counter_ns() - h0

        return post

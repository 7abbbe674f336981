"""Per-module timing through forward hooks, split into prefill and decode.

The ``layers`` collector answers "which layers take the time". For the selected measured steps
it gets instrumented copies (same inputs, run by the session after the timed steps, left out of
every other statistic; see ``instrumentation`` in the configuration), puts a forward pre-hook
and a forward hook on the model's modules, timestamps each call on the
session clock (synchronizing CUDA first when the model runs there, so a timestamp means "the
work before it has finished", not "it was launched"), and removes every hook when the step
ends, whether it succeeded or raised.

Phases: inside ``generate`` the first call of the top module is the prefill, every later call is
one decode step; each module call is attributed to the phase of the top-module call that
contains it. The context length of each top-level call is read from the KV cache it receives
(cached positions + new positions). ``s.forward`` steps have a single phase, ``forward``.

Coverage: the time spent in the *coverage modules* — the top module's children, where a child
that holds a block stack (an ``nn.ModuleList``/``nn.ModuleDict``) is replaced by its own
children, so for a decoder LM these are the embedding, each decoder layer, the final norm, the
rotary embedding and the LM head — divided by the step time. What is missing is the code between
modules (masks, cache updates, sampling, ``generate`` bookkeeping).

Overhead: hooks slow the model down. ``overhead_pct`` compares the instrumented steps with the
measured steps of the same shape (the timed originals of the copies) (same kind, batch, input token
counts and number of generated positions), with medians so that one preempted step does not
decide it: ``(sum_k n_k * median_instrumented_k / sum_k n_k * median_baseline_k - 1) * 100`` over
the shapes ``k`` that have both, ``n_k`` instrumented steps each. ``hook_time_s`` is the time spent inside the hook functions themselves
(a lower bound of the cost: it leaves out PyTorch's slower call path when hooks exist).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.plugins import hookimpl

if TYPE_CHECKING:
    from perfsdk.events import Step
    from perfsdk.session import Session

log = structlog.get_logger("perfsdk.collectors.layers")

#: How the top module is named in paths (``named_modules`` gives it the empty string).
ROOT_PATH = "(root)"

LayerPhase = Literal["prefill", "decode", "forward"]
_PHASES: tuple[LayerPhase, ...] = ("prefill", "decode", "forward")


class StepSelection(BaseModel):
    """Which measured (non-warm-up) steps to instrument: the first N, or every Nth.

    Steps are counted from 0 in the order they start, warm-up steps excluded. ``every: N``
    selects steps 0, N, 2N, ... so the first measured step is always included. A plain integer
    in a config (``steps: 3``) means ``first: 3``.
    """

    model_config = ConfigDict(extra="forbid")

    first: int | None = Field(default=None, ge=1)
    every: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return {"first": data}
        return data

    @model_validator(mode="after")
    def _one_of(self) -> StepSelection:
        if self.first is not None and self.every is not None:
            raise ValueError("set either first or every, not both")
        if self.first is None and self.every is None:
            object.__setattr__(self, "first", 1)
        return self

    def selects(self, ordinal: int) -> bool:
        """Whether the measured step with this 0-based ordinal is instrumented."""
        if self.every is not None:
            return ordinal % self.every == 0
        return ordinal < (self.first or 0)

    def describe(self) -> str:
        return f"every {self.every}" if self.every is not None else f"first {self.first}"


class LayersConfig(CollectorConfig):
    """Settings of the ``layers`` collector."""

    max_depth: int | None = Field(
        default=None, ge=0,
        description="Time modules down to this depth (the top module is 0, ``model.layers.0`` is 3); "
        "none: all modules. The coverage modules are always timed.",
    )
    module_types: list[str] | None = Field(
        default=None,
        description="Time only modules of these class names (e.g. LlamaDecoderLayer, Linear); "
        "none: all. The top module and the coverage modules are always timed.",
    )
    steps: StepSelection = Field(default_factory=StepSelection,
                                 description="Measured steps to instrument: {first: N} or {every: N}.")
    log_events: bool = Field(default=False,
                             description="Store every module call, time-ordered, as the series layers_events.")
    per_function: bool = Field(
        default=False,
        description="Also count softmax, matmul and normalization operations per module "
        "(through perfsdk.capture, on the instrumented steps).",
    )
    top_n: int | None = Field(default=None, ge=1,
                              description="Keep only the N slowest modules per phase in the result; none: all.")


class ModuleRow(CollectorResult):
    """One module's calls in one phase, summed over the instrumented steps."""

    path: str
    module_type: str
    phase: LayerPhase
    depth: int
    calls: int
    total_s: float
    mean_s: float
    share_pct: float = Field(description="total_s / instrumented step time * 100")
    phase_share_pct: float | None = Field(
        default=None, description="total_s / top-module time in this phase * 100")
    input_shapes: list[list[int]] = Field(default_factory=list,
                                          description="Tensor input shapes of the first call in this phase.")


class ModuleTypeRow(CollectorResult):
    """All modules of one class in one phase."""

    module_type: str
    phase: LayerPhase
    modules: int
    calls: int
    total_s: float
    mean_s: float
    share_pct: float
    phase_share_pct: float | None = None


class PhaseRow(CollectorResult):
    """Top-module calls of one phase, summed over the instrumented steps."""

    phase: LayerPhase
    forwards: int
    total_s: float
    mean_s: float
    share_pct: float
    context_len_min: int | None = None
    context_len_max: int | None = None


class FunctionRow(CollectorResult):
    """Operations of one kind (matmul, attention, softmax, norm) inside one module and phase.

    Counted by the shared operation capture (``perfsdk.capture``); ``ops`` counts ATen operations
    (a normalization written as several elementwise operations counts each of them).
    """

    path: str
    module_type: str | None = None
    phase: str
    category: str
    ops: int
    flops: int
    elements: int
    bytes: int = Field(description="bytes read + bytes written")


class FunctionTotalRow(CollectorResult):
    """All operations of one kind in one phase."""

    phase: str
    category: str
    ops: int
    flops: int
    elements: int
    bytes: int


class LayersResult(CollectorResult):
    """Where the step time goes, module by module, for prefill and decode."""

    status: Literal["ok", "unavailable"] = "ok"
    reason: str | None = None
    steps_selection: str
    steps_instrumented: int = 0
    steps_failed: int = 0
    step_indices: list[int] = Field(default_factory=list)
    step_time_s: float = Field(default=0.0, description="Sum of the instrumented steps' wall times.")
    step_time_mean_s: float | None = None
    modules_timed: int = 0
    synchronized: bool = Field(default=False, description="Timestamps synchronize CUDA before being read.")
    phases: list[PhaseRow] = Field(default_factory=list)
    coverage_modules: list[str] = Field(default_factory=list)
    coverage_time_s: float | None = None
    coverage_pct: float | None = Field(
        default=None, description="Time in the coverage modules / instrumented step time * 100.")
    forward_coverage_pct: float | None = Field(
        default=None, description="Time in the coverage modules / top-module time * 100.")
    overhead_pct: float | None = Field(
        default=None,
        description="(median instrumented / median un-instrumented step time of the same shape - 1) * 100.")
    overhead_method: str = ""
    overhead_compared_steps: int = 0
    overhead_baseline_steps: int = 0
    overhead_reason: str | None = None
    steps_also_profiled: list[int] = Field(
        default_factory=list,
        description="Instrumented steps that torch_profiler also wrapped: their times include the profiler's "
        "slowdown (they are left out of overhead_pct; steps profiled alone are left out of its baseline).")
    hook_calls: int = 0
    hook_time_s: float = 0.0
    hook_time_pct: float | None = Field(default=None, description="hook_time_s / instrumented step time * 100")
    modules: list[ModuleRow] = Field(default_factory=list)
    module_types: list[ModuleTypeRow] = Field(default_factory=list)
    events_series: str | None = None
    events: int = 0
    per_function_status: Literal["off", "ok", "unavailable"] = "off"
    per_function_reason: str | None = None
    per_function: list[FunctionRow] = Field(default_factory=list)
    per_function_totals: list[FunctionTotalRow] = Field(default_factory=list)


# -- module selection ---------------------------------------------------------------------


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


@dataclass
class _Target:
    """One hooked module."""

    path: str
    module_type: str
    depth: int
    is_root: bool
    in_coverage: bool


@dataclass
class _StepRecord:
    """What one instrumented step recorded, raw."""

    index: int
    kind: str
    start_ns: int = 0
    # (target index, forward index, start_ns, duration_ns, input shapes or None)
    calls: list[tuple[int, int, int, int, list[list[int]] | None]] = field(default_factory=list)
    context_lens: list[int | None] = field(default_factory=list)
    first_shapes: dict[tuple[int, str], list[list[int]]] = field(default_factory=dict)
    hook_ns: int = 0
    hook_calls: int = 0


def _tensor_shapes(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[list[int]]:
    shapes = [list(a.shape) for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
    if kwargs:
        shapes.extend(list(v.shape) for v in kwargs.values() if hasattr(v, "shape") and hasattr(v, "dtype"))
    return shapes


def _context_len(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Cached positions + new positions of a top-module call, when they can be read."""
    x = kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
    if x is None and args and hasattr(args[0], "shape"):
        x = args[0]
    if x is None or not hasattr(x, "shape") or len(x.shape) < 2:
        return None
    new = int(x.shape[1])
    cache = kwargs.get("past_key_values")
    past = 0
    if cache is not None and hasattr(cache, "get_seq_length"):
        try:
            past = int(cache.get_seq_length())
        except Exception:  # an exotic cache: the shape alone is still informative
            past = 0
    return past + new


def _phase_of(kind: str, forward_index: int) -> LayerPhase:
    if kind != "generate":
        return "forward"
    return "prefill" if forward_index == 0 else "decode"


def _step_shape_key(step: Step) -> tuple[Any, ...]:
    """Steps with equal keys do the same work, so their times can be compared."""
    if step.kind == "generate":
        return ("generate", step.batch_size, tuple(step.input_tokens), len(step.token_times_ns))
    shapes: list[tuple[int, ...]] = []
    for v in step.inputs.values():
        if hasattr(v, "shape"):
            shapes.append(tuple(int(d) for d in v.shape))
    return ("forward", step.batch_size, tuple(step.input_tokens), tuple(shapes))


# -- the collector ------------------------------------------------------------------------


class LayersCollector(Collector):
    """Per-module forward times (hooks) for prefill and decode, with coverage and overhead."""

    name: ClassVar[str] = "layers"
    Config: ClassVar[type[BaseModel]] = LayersConfig
    Result: ClassVar[type[BaseModel]] = LayersResult
    default_enabled: ClassVar[bool] = False
    description: ClassVar[str] = "per-layer forward times (hooks), by module and type, prefill vs decode"
    instruments_steps: ClassVar[bool] = True

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.cfg: LayersConfig = self.config  # type: ignore[assignment]
        self._ordinal = 0
        self._handles: list[Any] = []
        self._targets: list[_Target] = []
        self._targets_model_id: int | None = None
        self._stacks: list[list[tuple[int, int]]] = []
        self._current: _StepRecord | None = None
        self._forward_index = -1
        self._now: Any = time.perf_counter_ns
        self._synchronized = False
        self._records: list[_StepRecord] = []
        self._step_times: dict[int, float] = {}
        self._failed = 0
        self._unavailable: str | None = None
        # (step index, shape key, duration_s, instrumented) of every measured step that finished
        self._timings: list[tuple[int, tuple[Any, ...], float, bool]] = []
        self._instrumented_indices: set[int] = set()
        self._capture: Any = None
        self._capture_ops: list[Any] = []
        self._capture_error: str | None = None
        self._pending_shapes: list[list[Any]] = []

    # -- hooks on the model ---------------------------------------------------------------

    def _select_targets(self, root: Any) -> list[tuple[_Target, Any]]:
        cover = set(coverage_paths(root))
        wanted_types = set(self.cfg.module_types) if self.cfg.module_types is not None else None
        out: list[tuple[_Target, Any]] = []
        for path, module in root.named_modules():
            if _is_container(module):
                continue
            depth = 0 if path == "" else path.count(".") + 1
            is_root = path == ""
            in_cov = path in cover
            keep = is_root or in_cov
            if not keep:
                type_ok = wanted_types is None or type(module).__name__ in wanted_types
                depth_ok = self.cfg.max_depth is None or depth <= self.cfg.max_depth
                keep = type_ok and depth_ok
            if keep:
                out.append((_Target(path or ROOT_PATH, type(module).__name__, depth, is_root, in_cov), module))
        return out

    def _attach(self, root: Any, rec: _StepRecord) -> None:
        selected = self._select_targets(root)
        self._targets = [t for t, _ in selected]
        self._stacks = [[] for _ in selected]
        self._pending_shapes = [[] for _ in selected]
        self._current = rec
        self._forward_index = -1
        try:
            for i, (target, module) in enumerate(selected):
                self._handles.append(module.register_forward_pre_hook(self._make_pre(i, target.is_root),
                                                                      with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._make_post(i), always_call=True))
        except BaseException:
            self._detach()
            raise

    def _detach(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            try:
                h.remove()
            except Exception as exc:  # a handle whose module is gone: nothing left to remove
                log.warning("could not remove a hook", error=repr(exc))

    def _make_pre(self, i: int, is_root: bool) -> Any:
        stack = self._stacks[i]
        kind = self._current.kind if self._current is not None else "forward"
        log_events = self.cfg.log_events

        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h0 = time.perf_counter_ns()
            rec = self._current
            if rec is None:
                return
            if is_root:
                self._forward_index += 1
                rec.context_lens.append(_context_len(args, kwargs))
            phase = _phase_of(kind, self._forward_index)
            key = (i, phase)
            shapes = None
            if log_events or key not in rec.first_shapes:
                shapes = _tensor_shapes(args, kwargs)
                rec.first_shapes.setdefault(key, shapes)
            t0 = self._now()
            stack.append((t0, self._forward_index))
            rec.hook_calls += 1
            rec.hook_ns += time.perf_counter_ns() - h0
            if log_events:
                self._pending_shapes[i].append(shapes)

        return pre

    def _make_post(self, i: int) -> Any:
        stack = self._stacks[i]
        log_events = self.cfg.log_events

        def post(module: Any, args: tuple[Any, ...], output: Any) -> None:
            t1 = self._now()
            h0 = time.perf_counter_ns()
            rec = self._current
            if rec is None or not stack:
                return
            t0, fwd = stack.pop()
            shapes = self._pending_shapes[i].pop() if log_events and self._pending_shapes[i] else None
            rec.calls.append((i, fwd, t0, t1 - t0, shapes))
            rec.hook_calls += 1
            rec.hook_ns += time.perf_counter_ns() - h0

        return post

    # -- lifecycle ------------------------------------------------------------------------

    def wants_to_instrument(self, session: Any, step: Step) -> bool:
        """The selected measured steps (``steps``: first N or every Nth)."""
        ordinal = self._ordinal
        self._ordinal += 1
        return self.cfg.steps.selects(ordinal)

    @hookimpl
    def perfsdk_before_generate(self, session: Session, step: Step) -> None:
        if self.name not in step.instrumented_by:
            return
        model = step.model
        try:
            import torch.nn as nn
        except ImportError:  # pragma: no cover - torch is a dependency
            self._unavailable = "torch is not installed"
            return
        if not isinstance(model, nn.Module):
            self._unavailable = f"the step's model is a {type(model).__name__}, not a torch.nn.Module"
            return
        self._use_clock(session, model)
        rec = _StepRecord(index=step.index, kind=step.kind)
        self._attach(model, rec)
        self._instrumented_indices.add(step.index)
        if self.cfg.per_function:
            self._start_capture(session, model, step)

    @hookimpl
    def perfsdk_after_generate(self, session: Session, step: Step) -> None:
        rec = self._current if step.index in self._instrumented_indices else None
        ops: list[Any] = []
        try:
            if rec is not None and self.cfg.per_function:
                ops = self._stop_capture(step)
        finally:
            if rec is not None:
                self._detach()
                self._current = None
        if step.warmup or step.error is not None or step.end_ns is None:
            if rec is not None:
                self._failed += 1
            return
        duration_s = (step.end_ns - step.start_ns) / 1e9
        self._timings.append((step.index, _step_shape_key(step), duration_s, rec is not None))
        if rec is not None:
            rec.start_ns = step.start_ns
            self._records.append(rec)
            self._capture_ops.extend(ops)
            self._step_times[step.index] = duration_s

    @hookimpl
    def perfsdk_finalize(self, session: Session) -> LayersResult:
        # Normally nothing is attached here; a step interrupted between hooks must not leave any.
        try:
            if self._capture is not None:
                self._stop_capture_quietly()
        finally:
            self._detach()
        self._current = None
        return self._build_result(session)

    # -- helpers --------------------------------------------------------------------------

    def _use_clock(self, session: Session, model: Any) -> None:
        """Synchronize timestamps when the model runs on CUDA (telling the session clock)."""
        try:
            dev = next(model.parameters()).device
        except (StopIteration, AttributeError):
            dev = None
        if dev is not None and dev.type == "cuda":
            session.clock.use_device(dev)
        if session.clock.cuda_devices:
            clock = session.clock
            self._now = lambda: clock.now_ns(sync=True)
            self._synchronized = True
        else:
            self._now = time.perf_counter_ns
            self._synchronized = False

    def _start_capture(self, session: Session, model: Any, step: Step) -> None:
        """Per-function accounting through the shared operation capture, when installed."""
        try:
            import perfsdk.capture  # noqa: F401
        except ImportError as exc:
            self._capture_error = f"perfsdk.capture is not available: {exc}"
            return
        try:
            self._capture = _open_capture(model, step)
        except Exception as exc:
            self._capture = None
            self._capture_error = f"operation capture failed to start: {exc!r}"

    def _stop_capture_quietly(self) -> None:
        cap, self._capture = self._capture, None
        try:
            cap.__exit__(None, None, None)
        except Exception as exc:
            log.warning("could not stop the operation capture", error=repr(exc))

    def _stop_capture(self, step: Step) -> list[Any]:
        cap, self._capture = self._capture, None
        if cap is None:
            return []
        try:
            return _close_capture(cap)
        except Exception as exc:
            self._capture_error = f"operation capture failed: {exc!r}"
            return []

    def _build_result(self, session: Session) -> LayersResult:
        base: dict[str, Any] = {"steps_selection": self.cfg.steps.describe(), "steps_failed": self._failed,
                                "synchronized": self._synchronized}
        if not self._records:
            reason = self._unavailable or (
                "no measured step was instrumented" + (" (the instrumented steps failed)" if self._failed else ""))
            return LayersResult(status="unavailable", reason=reason, **base)
        targets = self._targets
        step_time = sum(self._step_times.values())
        # per (target, phase): calls, total_ns
        agg: dict[tuple[int, str], list[int]] = {}
        shapes: dict[tuple[int, str], list[list[int]]] = {}
        phase_ctx: dict[str, list[int]] = {}
        hook_ns = 0
        hook_calls = 0
        events: list[dict[str, Any]] = []
        for rec in self._records:
            hook_ns += rec.hook_ns
            hook_calls += rec.hook_calls
            for key, first_shp in rec.first_shapes.items():
                shapes.setdefault(key, first_shp)
            for fwd, ctx in enumerate(rec.context_lens):
                if ctx is not None:
                    phase_ctx.setdefault(_phase_of(rec.kind, fwd), []).append(ctx)
            for i, fwd, t0, dur, shp in rec.calls:
                phase = _phase_of(rec.kind, fwd)
                a = agg.setdefault((i, phase), [0, 0])
                a[0] += 1
                a[1] += dur
                if self.cfg.log_events:
                    t = targets[i]
                    events.append({
                        "step": rec.index, "phase": phase, "forward": fwd, "path": t.path,
                        "module_type": t.module_type, "depth": t.depth,
                        "start_s": (t0 - rec.start_ns) / 1e9, "duration_s": dur / 1e9,
                        "input_shapes": shp or [],
                        "context_len": rec.context_lens[fwd] if 0 <= fwd < len(rec.context_lens) else None,
                    })
        root_i = next(i for i, t in enumerate(targets) if t.is_root)
        phase_time: dict[str, float] = {ph: agg[(root_i, ph)][1] / 1e9 for ph in _PHASES if (root_i, ph) in agg}

        def share(x: float) -> float:
            return x / step_time * 100.0 if step_time > 0 else 0.0

        def pshare(x: float, ph: str) -> float | None:
            t = phase_time.get(ph)
            return x / t * 100.0 if t else None

        rows: list[ModuleRow] = []
        for (i, ph), (calls, tot_ns) in agg.items():
            t = targets[i]
            tot = tot_ns / 1e9
            rows.append(ModuleRow(path=t.path, module_type=t.module_type, phase=ph, depth=t.depth,  # type: ignore[arg-type]
                                  calls=calls, total_s=tot, mean_s=tot / calls, share_pct=share(tot),
                                  phase_share_pct=pshare(tot, ph), input_shapes=shapes.get((i, ph), [])))
        order = {p: k for k, p in enumerate(_PHASES)}
        rows.sort(key=lambda r: (order[r.phase], -r.total_s))
        by_type: dict[tuple[str, str], list[Any]] = {}
        for r in rows:
            b = by_type.setdefault((r.module_type, r.phase), [set(), 0, 0.0])
            b[0].add(r.path)
            b[1] += r.calls
            b[2] += r.total_s
        type_rows = [ModuleTypeRow(module_type=mt, phase=ph, modules=len(b[0]), calls=b[1], total_s=b[2],  # type: ignore[arg-type]
                                   mean_s=b[2] / b[1], share_pct=share(b[2]), phase_share_pct=pshare(b[2], ph))
                     for (mt, ph), b in by_type.items()]
        type_rows.sort(key=lambda r: (order[r.phase], -r.total_s))
        if self.cfg.top_n is not None:
            kept: list[ModuleRow] = []
            for ph in _PHASES:
                kept.extend([r for r in rows if r.phase == ph][: self.cfg.top_n])
            rows = kept
        phases = []
        for ph in _PHASES:
            if (root_i, ph) not in agg:
                continue
            calls, tot_ns = agg[(root_i, ph)]
            ctxs = phase_ctx.get(ph) or []
            phases.append(PhaseRow(phase=ph, forwards=calls, total_s=tot_ns / 1e9, mean_s=tot_ns / 1e9 / calls,
                                   share_pct=share(tot_ns / 1e9), context_len_min=min(ctxs) if ctxs else None,
                                   context_len_max=max(ctxs) if ctxs else None))
        cov_idx = [i for i, t in enumerate(targets) if t.in_coverage]
        cov_s = sum(c[1] for (i, _), c in agg.items() if i in set(cov_idx)) / 1e9
        root_s = sum(phase_time.values())
        if self.cfg.log_events:
            events.sort(key=lambda e: (e["step"], e["start_s"], e["depth"]))
            session.add_series("layers_events", events)
        profiler = session.collector("torch_profiler")
        profiled = set(getattr(profiler, "profiled_steps", []) or [])
        overhead = self._overhead(profiled)
        per_fn = self._per_function_rows()
        return LayersResult(
            status="ok",
            steps_instrumented=len(self._records),
            step_indices=[r.index for r in self._records],
            step_time_s=step_time,
            step_time_mean_s=step_time / len(self._records),
            modules_timed=len(targets),
            phases=phases,
            coverage_modules=[targets[i].path for i in cov_idx],
            coverage_time_s=cov_s,
            coverage_pct=share(cov_s),
            forward_coverage_pct=cov_s / root_s * 100.0 if root_s > 0 else None,
            hook_calls=hook_calls,
            hook_time_s=hook_ns / 1e9,
            hook_time_pct=share(hook_ns / 1e9),
            modules=rows,
            module_types=type_rows,
            events_series="layers_events" if self.cfg.log_events else None,
            events=len(events),
            **overhead,
            **per_fn,
            **base,
        )

    def _overhead(self, profiled: set[int]) -> dict[str, Any]:
        method = ("median instrumented step time vs median un-instrumented step time, per step shape "
                  "(kind, batch, input tokens, generated positions), weighted by instrumented steps: "
                  "(sum n*median_instrumented / sum n*median_baseline - 1) * 100")
        baseline: dict[tuple[Any, ...], list[float]] = {}
        instrumented_by_key: dict[tuple[Any, ...], list[float]] = {}
        for index, key, dur, instrumented in self._timings:
            if index in profiled:  # the profiler's own slowdown would be counted
                continue
            (instrumented_by_key if instrumented else baseline).setdefault(key, []).append(dur)
        actual = 0.0
        expected = 0.0
        compared = 0
        for key, durs in instrumented_by_key.items():
            if key in baseline:
                actual += len(durs) * statistics.median(durs)
                expected += len(durs) * statistics.median(baseline[key])
                compared += len(durs)
        out: dict[str, Any] = {"overhead_method": method,
                               "overhead_baseline_steps": sum(len(v) for v in baseline.values()),
                               "steps_also_profiled": sorted(i for i in self._step_times if i in profiled)}
        if compared == 0 or expected <= 0:
            reason = ("no un-instrumented measured step has the shape of an instrumented one; "
                      "run more measured steps than instrumented ones (e.g. steps: {every: 2})")
            if out["steps_also_profiled"]:
                reason += "; steps also wrapped in torch_profiler are left out of the comparison"
            out["overhead_reason"] = reason
            return out
        out["overhead_pct"] = (actual / expected - 1.0) * 100.0
        out["overhead_compared_steps"] = compared
        return out

    def _per_function_rows(self) -> dict[str, Any]:
        if not self.cfg.per_function:
            return {}
        if self._capture_error is not None and not self._capture_ops:
            return {"per_function_status": "unavailable", "per_function_reason": self._capture_error}
        agg: dict[tuple[str, str | None, str, str], list[int]] = {}
        tot: dict[tuple[str, str], list[int]] = {}
        for op in self._capture_ops:
            cat = op.category
            if cat not in FUNCTION_CATEGORIES:
                continue
            nbytes = int(op.bytes_read) + int(op.bytes_written)
            for acc in (agg.setdefault((op.module_path or ROOT_PATH, op.module_type, str(op.phase), cat), [0, 0, 0, 0]),
                        tot.setdefault((str(op.phase), cat), [0, 0, 0, 0])):
                acc[0] += 1
                acc[1] += int(op.flops)
                acc[2] += int(op.elements)
                acc[3] += nbytes
        rows = [FunctionRow(path=p, module_type=mt, phase=ph, category=c, ops=v[0], flops=v[1], elements=v[2], bytes=v[3])
                for (p, mt, ph, c), v in agg.items()]
        rows.sort(key=lambda r: (r.phase, r.path, r.category))
        totals = [FunctionTotalRow(phase=ph, category=c, ops=v[0], flops=v[1], elements=v[2], bytes=v[3])
                  for (ph, c), v in sorted(tot.items())]
        out: dict[str, Any] = {"per_function_status": "ok", "per_function": rows, "per_function_totals": totals}
        if self._capture_error is not None:
            out["per_function_reason"] = self._capture_error
        return out


#: Operation kinds counted by per-function accounting (``attention`` is a fused QK^T/softmax/PV
#: kernel, or the matrix products of an eager attention).
FUNCTION_CATEGORIES = ("matmul", "attention", "softmax", "norm")


def _open_capture(model: Any, step: Step) -> Any:
    """Start the shared operation capture on ``model`` for one step."""
    from perfsdk.capture import OperationCapture

    cap = OperationCapture(model, auto_phase=step.kind == "generate", phase="forward", step=step.index)
    cap.__enter__()
    return cap


def _close_capture(cap: Any) -> list[Any]:
    """Stop the capture (removing its hooks) and return its operation records."""
    cap.__exit__(None, None, None)
    return list(cap.records)

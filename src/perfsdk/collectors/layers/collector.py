"""The ``layers`` collector: lifecycle (which steps are instrumented) and the result it builds.

The selected measured steps get instrumented copies (same inputs, run by the session after the
timed steps, left out of every other statistic; see ``instrumentation`` in the configuration):
the hooks are put on for those copies only. ``overhead_pct`` compares each copy with the timed
original of the same shape.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, ClassVar

import structlog
from pydantic import BaseModel

from perfsdk.collector import Collector
from perfsdk.collectors.layers.config import InstrumentsSelectedSteps, LayersConfig
from perfsdk.collectors.layers.functions import close_capture, function_rows, open_capture
from perfsdk.collectors.layers.hooks import ModuleTimer, StepRecord, phase_of
from perfsdk.collectors.layers.result import PHASES, LayersResult, ModuleRow, ModuleTypeRow, PhaseRow
from perfsdk.plugins import hookimpl

if TYPE_CHECKING:
    from perfsdk.events import Step
    from perfsdk.session import Session

log = structlog.get_logger("perfsdk.collectors.layers")


def _step_shape_key(step: Step) -> tuple[Any, ...]:
    """Steps with equal keys do the same work, so their times can be compared."""
    if step.kind == "generate":
        return ("generate", step.batch_size, tuple(step.input_tokens), len(step.token_times_ns))
    shapes: list[tuple[int, ...]] = []
    for v in [*step.args, *step.inputs.values()]:
        if hasattr(v, "shape"):
            shapes.append(tuple(int(d) for d in v.shape))
    return ("forward", step.batch_size, tuple(step.input_tokens), tuple(shapes))


class LayersCollector(InstrumentsSelectedSteps, Collector):
    """Per-module forward times (hooks) for encode, prefill and decode, with coverage and overhead."""

    name: ClassVar[str] = "layers"
    Config: ClassVar[type[BaseModel]] = LayersConfig
    Result: ClassVar[type[BaseModel]] = LayersResult
    default_enabled: ClassVar[bool] = False
    description: ClassVar[str] = "per-layer forward times (hooks), by module and type, encode / prefill / decode"
    title: ClassVar[str] = "Layers"
    key_columns: ClassVar[tuple[str, ...]] = ("coverage_pct",)

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.cfg: LayersConfig = self.config  # type: ignore[assignment]
        self._timer = ModuleTimer(self.cfg)
        self._synchronized = False
        self._records: list[StepRecord] = []
        self._step_times: dict[int, float] = {}
        self._failed = 0
        self._unavailable: str | None = None
        # (step index, shape key, duration_s, instrumented) of every measured step that finished
        self._timings: list[tuple[int, tuple[Any, ...], float, bool]] = []
        self._instrumented_indices: set[int] = set()
        self._capture: Any = None
        self._capture_ops: list[Any] = []
        self._capture_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

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
        rec = StepRecord(index=step.index, kind=step.kind)
        self._timer.attach(model, rec)
        self._instrumented_indices.add(step.index)
        if self.cfg.per_function:
            self._start_capture(model, step)

    @hookimpl
    def perfsdk_after_generate(self, session: Session, step: Step) -> None:
        rec = self._timer.current if step.index in self._instrumented_indices else None
        ops: list[Any] = []
        try:
            if rec is not None and self.cfg.per_function:
                ops = self._stop_capture()
        finally:
            if rec is not None:
                self._timer.detach()
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
        from perfsdk.collector import model_elsewhere

        if (why := model_elsewhere(session)) is not None:
            return LayersResult(status="unavailable", reason=why, steps_selection=self.cfg.steps.describe())
        # Normally nothing is attached here; a step interrupted between hooks must not leave any.
        try:
            if self._capture is not None:
                self._stop_capture_quietly()
        finally:
            self._timer.detach()
        return self._build_result(session)

    # -- presentation (the collector contract) --------------------------------------------

    @classmethod
    def summary_rows(cls, result: Any) -> list[tuple[str, str]]:
        if result.status != "ok":
            return [("status", f"{result.status}: {result.reason or ''}".strip())]
        return [("instrumented steps", str(result.steps_instrumented))]

    @classmethod
    def summary_tables(cls, result: Any) -> list[Any]:
        """Rich tables for the terminal summary: the slowest layers per phase, coverage, overhead."""
        from perfsdk.collectors.layers.tables import summary_tables

        return summary_tables(LayersResult.model_validate(_as_dict(result)))

    @classmethod
    def report_section(cls, result: Any, run: Any = None, series: dict[str, list[dict[str, Any]]] | None = None) -> Any:
        """The HTML report's section: the layer table, the per-function tables and, when
        ``series`` holds ``layers_events``, the time-ordered event log."""
        from perfsdk.collectors.layers.tables import report_section

        if series is None and run is not None and hasattr(run, "read_series"):
            series = {"layers_events": run.read_series("layers_events")}
        return report_section(LayersResult.model_validate(_as_dict(result)), run, series)

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
            self._timer.now = lambda: clock.now_ns(sync=True)
            self._synchronized = True
        else:
            self._timer.now = time.perf_counter_ns
            self._synchronized = False

    def _start_capture(self, model: Any, step: Step) -> None:
        """Per-function accounting through the shared operation capture, timed on the timer's clock."""
        try:
            import perfsdk.capture  # noqa: F401
        except ImportError as exc:
            self._capture_error = f"perfsdk.capture is not available: {exc}"
            return
        try:
            self._capture = open_capture(model, step.kind, step.index, self._timer.now)
        except Exception as exc:
            self._capture = None
            self._capture_error = f"operation capture failed to start: {exc!r}"

    def _stop_capture_quietly(self) -> None:
        cap, self._capture = self._capture, None
        try:
            cap.__exit__(None, None, None)
        except Exception as exc:
            log.warning("could not stop the operation capture", error=repr(exc))

    def _stop_capture(self) -> list[Any]:
        cap, self._capture = self._capture, None
        if cap is None:
            return []
        try:
            return close_capture(cap)
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
        targets = self._timer.targets
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
                    phase_ctx.setdefault(phase_of(rec.kind, fwd), []).append(ctx)
            for i, fwd, t0, dur, shp, phase in rec.calls:
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
        # per phase: [calls, total_ns] of the top module, with the encode passes as a phase of their own
        phase_tot: dict[str, list[int]] = {ph: list(agg[(root_i, ph)]) for ph in PHASES if (root_i, ph) in agg}
        for rec in self._records:
            for enc_ns, nested_in in rec.encode_calls:
                enc = phase_tot.setdefault("encode", [0, 0])
                enc[0] += 1
                enc[1] += enc_ns
                if nested_in is not None and nested_in in phase_tot:
                    phase_tot[nested_in][1] -= enc_ns
        phase_time: dict[str, float] = {ph: v[1] / 1e9 for ph, v in phase_tot.items()}

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
                                  order=t.order, calls=calls, total_s=tot, mean_s=tot / calls, share_pct=share(tot),
                                  phase_share_pct=pshare(tot, ph), input_shapes=shapes.get((i, ph), []),
                                  params=t.params, parameters=t.parameters))
        order = {p: k for k, p in enumerate(PHASES)}
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
            for ph in PHASES:
                kept.extend([r for r in rows if r.phase == ph][: self.cfg.top_n])
            rows = kept
        phases = []
        for ph in PHASES:
            if ph not in phase_tot:
                continue
            calls, tot_ns = phase_tot[ph]
            ctxs = phase_ctx.get(ph) or []
            phases.append(PhaseRow(phase=ph, forwards=calls, total_s=tot_ns / 1e9, mean_s=tot_ns / 1e9 / calls,
                                   share_pct=share(tot_ns / 1e9), context_len_min=min(ctxs) if ctxs else None,
                                   context_len_max=max(ctxs) if ctxs else None))
        cov_idx = [i for i, t in enumerate(targets) if t.in_coverage]
        cov_s = sum(rec.coverage_ns for rec in self._records) / 1e9
        root_s = sum(phase_time.values())
        if self.cfg.log_events:
            events.sort(key=lambda e: (e["step"], e["start_s"], e["depth"]))
            session.add_series("layers_events", events)
        profiler = session.collector("torch_profiler")
        profiled = set(getattr(profiler, "profiled_steps", []) or [])
        overhead = self._overhead(profiled)
        per_fn = self._per_function_rows(step_time)
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

    def _per_function_rows(self, step_time_s: float) -> dict[str, Any]:
        if not self.cfg.per_function:
            return {}
        if self._capture_error is not None and not self._capture_ops:
            return {"per_function_status": "unavailable", "per_function_reason": self._capture_error}
        out: dict[str, Any] = {"per_function_status": "ok", **function_rows(self._capture_ops, step_time_s)}
        if self._capture_error is not None:
            out["per_function_reason"] = self._capture_error
        return out


def _as_dict(result: Any) -> Any:
    return result.model_dump() if hasattr(result, "model_dump") else result


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(LayersCollector)

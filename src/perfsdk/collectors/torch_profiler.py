"""Operator profiling with ``torch.profiler`` on selected steps.

The ``torch_profiler`` collector starts a ``torch.profiler.profile`` right before a selected step
and stops it right after — also when the step raises. The profiled steps are instrumented copies
of the selected measured steps (same inputs, run by the session after the timed steps), so the
profiler's slowdown never enters the latency figures. Each profiled step leaves a
Chrome/Perfetto trace with the run (artifact ``torch_trace_step<N>.json``, open it in
``chrome://tracing`` or https://ui.perfetto.dev), and the operators of all profiled steps are
aggregated into a table of the top operators by self CPU time (self CUDA time when CUDA was
profiled), with memory when ``profile_memory`` is on.

Stopping the profiler is all that happens between steps; the operator table and the traces are
built at the end of the run, so the profiles of the selected steps are held in memory until then.

The profiler slows the step down a lot (every operator is recorded): the time of a profiled
step is not representative, and it is left out of every statistic. Profile a few steps (``steps: {first: 1}``, the default, or
``{every: N}``) and read the times as relative weights.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import structlog
from pydantic import BaseModel, Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.collectors.layers import StepSelection
from perfsdk.collectors.layers.config import InstrumentsSelectedSteps
from perfsdk.fmt import fmt_ms as _ms
from perfsdk.fmt import fmt_pct as _pct
from perfsdk.plugins import hookimpl

if TYPE_CHECKING:
    from perfsdk.events import Step
    from perfsdk.session import Session

log = structlog.get_logger("perfsdk.collectors.torch_profiler")

Activity = Literal["cpu", "cuda"]



@contextlib.contextmanager
def native_stderr_quiet() -> Iterator[None]:
    """Silence the native profiler's own lines (``USDT: … profiler_start``) while it starts or
    stops: file descriptor 2 points at ``/dev/null`` for that call only."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (captured, closed): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)

class TorchProfilerConfig(CollectorConfig):
    """Settings of the ``torch_profiler`` collector."""

    steps: StepSelection = Field(default_factory=StepSelection,
                                 description="Measured steps to profile: {first: N} or {every: N}.")
    activities: list[Activity] | None = Field(
        default=None, description="What to record; none: cpu, plus cuda when the model runs on CUDA.")
    record_shapes: bool = Field(default=False, description="Record operator input shapes (in the trace).")
    profile_memory: bool = Field(default=False, description="Record tensor allocations per operator.")
    with_stack: bool = Field(default=False, description="Record Python stacks (larger traces, more overhead).")
    top_n: int = Field(default=20, ge=1, description="Operators kept in the result.")
    save_traces: bool = Field(default=True, description="Store each profiled step's Chrome/Perfetto trace.")


class OperatorRow(CollectorResult):
    """One operator, summed over the profiled steps (times in seconds)."""

    name: str
    calls: int
    self_cpu_time_s: float
    cpu_time_total_s: float
    self_cuda_time_s: float | None = None
    cuda_time_total_s: float | None = None
    self_cpu_memory_bytes: int | None = None
    self_cuda_memory_bytes: int | None = None
    share_pct: float = Field(description="This operator's share of the self time of all operators "
                                         "(CUDA time when CUDA was profiled, else CPU time)")


class TorchProfilerResult(CollectorResult):
    """Top operators and stored traces of the profiled steps."""

    status: Literal["ok", "unavailable"] = "ok"
    reason: str | None = None
    steps_selection: str
    steps_profiled: int = 0
    steps_failed: int = 0
    step_indices: list[int] = Field(default_factory=list)
    activities: list[str] = Field(default_factory=list)
    cuda_reason: str | None = Field(default=None, description="Why CUDA activity was not recorded, if asked for.")
    sort_by: str = "self_cpu_time_s"
    traces: list[str] = Field(default_factory=list, description="Artifact names of the stored traces.")
    operators_total: int = 0
    self_cpu_time_total_s: float = 0.0
    self_cuda_time_total_s: float | None = None
    operators: list[OperatorRow] = Field(default_factory=list)


def _device_attr(evt: Any, new: str, old: str) -> float:
    """Device-time fields were renamed from ``cuda`` to ``device`` in recent torch."""
    v = getattr(evt, new, None)
    if v is None:
        v = getattr(evt, old, 0.0)
    return float(v or 0.0)


class TorchProfilerCollector(InstrumentsSelectedSteps, Collector):
    """Wraps selected steps in ``torch.profiler``: traces as artifacts, top operators as results."""

    name: ClassVar[str] = "torch_profiler"
    Config: ClassVar[type[BaseModel]] = TorchProfilerConfig
    Result: ClassVar[type[BaseModel]] = TorchProfilerResult
    default_enabled: ClassVar[bool] = False
    description: ClassVar[str] = "torch.profiler traces of selected steps and the top operators"
    title: ClassVar[str] = "Operators (torch.profiler)"

    @classmethod
    def summary_rows(cls, result: Any) -> list[tuple[str, str]]:
        if result.status != "ok":
            return [("status", f"{result.status}: {getattr(result, 'reason', None) or ''}".strip())]
        return [("profiled steps", str(result.steps_profiled))]

    @classmethod
    def summary_tables(cls, result: Any) -> list[Any]:
        return profiler_tables(result.model_dump(mode="json"))

    @classmethod
    def report_section(cls, result: Any, run: Any) -> Any:
        from perfsdk.collector import ReportSection, html_table

        if result.status != "ok" or not result.operators:
            return None
        cols = ["name", "calls", "self_cpu_time_s", "cpu_time_total_s", "self_cuda_time_s", "share_pct"]
        rows = [[getattr(op, c, None) for c in cols] for op in result.operators]
        return ReportSection(cls.title, html_table(cols, rows))

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.cfg: TorchProfilerConfig = self.config  # type: ignore[assignment]
        self._prof: Any = None
        self._prof_step: int | None = None
        self._activities: list[str] = []
        self._cuda_reason: str | None = None
        self._reason: str | None = None
        self._profiled: list[int] = []
        self._failed = 0
        self._traces: list[str] = []
        # name -> [calls, self_cpu_us, cpu_total_us, self_dev_us, dev_total_us, self_cpu_mem, self_dev_mem]
        self._ops: dict[str, list[float]] = {}
        self._pending: list[tuple[int, Any]] = []

    @property
    def profiled_steps(self) -> list[int]:
        """Indices of the steps profiled so far (their times are inflated by the profiler)."""
        return list(self._profiled)

    def _choose_activities(self, session: Session, model: Any) -> list[Any]:
        import torch
        from torch.profiler import ProfilerActivity

        on_cuda = bool(session.clock.cuda_devices)
        try:
            on_cuda = on_cuda or next(model.parameters()).device.type == "cuda"
        except (StopIteration, AttributeError, TypeError):
            pass
        wanted = self.cfg.activities
        names = ["cpu"] + (["cuda"] if on_cuda else []) if wanted is None else list(dict.fromkeys(wanted))
        acts: list[Any] = []
        chosen: list[str] = []
        for n in names:
            if n == "cpu":
                acts.append(ProfilerActivity.CPU)
                chosen.append("cpu")
            elif n == "cuda":
                if torch.cuda.is_available():
                    acts.append(ProfilerActivity.CUDA)
                    chosen.append("cuda")
                else:
                    self._cuda_reason = "CUDA is not available on this machine"
        self._activities = chosen
        return acts

    @hookimpl
    def perfsdk_before_generate(self, session: Session, step: Step) -> None:
        if self.name not in step.instrumented_by:
            return
        try:
            import torch
            from torch.profiler import profile
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            self._reason = f"torch.profiler is not available: {exc}"
            return
        if torch.autograd._profiler_enabled():
            self._reason = "another torch profiler was already running; step not profiled"
            log.warning("torch profiler already active", step=step.index)
            return
        acts = self._choose_activities(session, step.model)
        if not acts:
            self._reason = "none of the requested activities is available"
            return
        prof = profile(activities=acts, record_shapes=self.cfg.record_shapes,
                       profile_memory=self.cfg.profile_memory, with_stack=self.cfg.with_stack)
        with native_stderr_quiet():
            prof.start()
        self._prof = prof
        self._prof_step = step.index

    @hookimpl
    def perfsdk_after_generate(self, session: Session, step: Step) -> None:
        if self._prof is None or self._prof_step != step.index:
            return
        prof = self._stop()
        if step.error is not None or step.warmup:
            self._failed += 1
            return
        self._profiled.append(step.index)
        # Aggregating and exporting take long; doing it at finalize keeps the gap between steps short.
        self._pending.append((step.index, prof))

    @hookimpl
    def perfsdk_finalize(self, session: Session) -> TorchProfilerResult:
        from perfsdk.collector import model_elsewhere

        if (why := model_elsewhere(session)) is not None:
            return TorchProfilerResult(status="unavailable", reason=why, steps_selection=self.cfg.steps.describe())
        # Normally stopped in after_generate; never leave a profiler running past the run.
        if self._prof is not None:
            self._stop()
        pending, self._pending = self._pending, []
        for index, prof in pending:
            self._accumulate(prof)
            if self.cfg.save_traces:
                self._save_trace(session, prof, index)
        return self._build_result()

    # -- helpers --------------------------------------------------------------------------

    def _stop(self) -> Any:
        prof, self._prof, self._prof_step = self._prof, None, None
        try:
            with native_stderr_quiet():
                prof.stop()
        except Exception as exc:
            log.warning("could not stop the torch profiler", error=repr(exc))
            raise
        return prof

    def _accumulate(self, prof: Any) -> None:
        for evt in prof.key_averages():
            if getattr(evt, "is_user_annotation", False):
                continue
            a = self._ops.setdefault(evt.key, [0, 0.0, 0.0, 0.0, 0.0, 0, 0])
            a[0] += int(evt.count)
            a[1] += float(evt.self_cpu_time_total)
            a[2] += float(evt.cpu_time_total)
            a[3] += _device_attr(evt, "self_device_time_total", "self_cuda_time_total")
            a[4] += _device_attr(evt, "device_time_total", "cuda_time_total")
            a[5] += int(getattr(evt, "self_cpu_memory_usage", 0) or 0)
            a[6] += int(getattr(evt, "self_device_memory_usage", 0) or 0)

    def _save_trace(self, session: Session, prof: Any, index: int) -> None:
        fd, path = tempfile.mkstemp(prefix="perfsdk-trace-", suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, "rb") as fh:
                data = fh.read()
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        name = f"torch_trace_step{index}.json"
        session.add_artifact(name, data)
        self._traces.append(name)

    def _build_result(self) -> TorchProfilerResult:
        base: dict[str, Any] = {"steps_selection": self.cfg.steps.describe(), "steps_failed": self._failed,
                                "activities": self._activities, "cuda_reason": self._cuda_reason}
        if not self._profiled:
            reason = self._reason or (
                "no measured step was profiled" + (" (the profiled steps failed)" if self._failed else ""))
            return TorchProfilerResult(status="unavailable", reason=reason, **base)
        cuda = "cuda" in self._activities
        mem = self.cfg.profile_memory
        self_cpu_total = sum(a[1] for a in self._ops.values()) / 1e6
        self_cuda_total = sum(a[3] for a in self._ops.values()) / 1e6 if cuda else None
        sort_idx = 3 if cuda else 1
        ranked = sorted(self._ops.items(), key=lambda kv: (-kv[1][sort_idx], -kv[1][1], kv[0]))
        denom = (self_cuda_total if cuda else self_cpu_total) or 0.0
        rows = []
        for name, a in ranked[: self.cfg.top_n]:
            rows.append(OperatorRow(
                name=name, calls=int(a[0]), self_cpu_time_s=a[1] / 1e6, cpu_time_total_s=a[2] / 1e6,
                self_cuda_time_s=a[3] / 1e6 if cuda else None, cuda_time_total_s=a[4] / 1e6 if cuda else None,
                self_cpu_memory_bytes=int(a[5]) if mem else None,
                self_cuda_memory_bytes=int(a[6]) if mem and cuda else None,
                share_pct=(a[sort_idx] / 1e6) / denom * 100.0 if denom > 0 else 0.0,
            ))
        return TorchProfilerResult(
            status="ok", reason=self._reason, steps_profiled=len(self._profiled), step_indices=self._profiled,
            sort_by="self_cuda_time_s" if cuda else "self_cpu_time_s", traces=self._traces,
            operators_total=len(self._ops), self_cpu_time_total_s=self_cpu_total,
            self_cuda_time_total_s=self_cuda_total, operators=rows, **base,
        )


def profiler_tables(prof: dict[str, Any] | None, max_rows: int = 15) -> list[Any]:
    """Rich table of a ``torch_profiler`` result (its JSON form): the top operators."""
    from rich.table import Table

    tables: list[Any] = []
    if prof and prof.get("status") == "ok":
        cuda = prof.get("sort_by") == "self_cuda_time_s"
        t = Table(title=f"Top operators ({prof['steps_profiled']} profiled steps, by {prof['sort_by']})")
        cols = ["operator", "calls", "self CPU ms", "CPU total ms"] + (["self CUDA ms"] if cuda else []) + ["%"]
        for i, col in enumerate(cols):
            t.add_column(col, justify="left" if i == 0 else "right")
        for r in prof.get("operators", [])[:max_rows]:
            cells = [r["name"], str(r["calls"]), _ms(r["self_cpu_time_s"]), _ms(r["cpu_time_total_s"])]
            if cuda:
                cells.append(_ms(r.get("self_cuda_time_s")))
            cells.append(_pct(r["share_pct"]))
            t.add_row(*cells)
        tables.append(t)
    return tables


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(TorchProfilerCollector)

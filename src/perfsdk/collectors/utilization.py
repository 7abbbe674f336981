"""The ``utilization`` collector: CPU, RSS and per-GPU readings on the shared sampler.

One probe on ``session.sampler`` (no thread or process of its own). Each sample holds process
and system CPU %, the RSS of the process tree (children included) and, per GPU through the
NVML seam, utilization %, memory used, power, SM clock and temperature — tagged with the
session phase at that moment. The samples are stored as the ``utilization`` series; the result
has summary statistics overall and per phase, and the sampler's own CPU time.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.energy.cpu import SystemCpu
from perfsdk.energy.nvml import NVML_UPDATE_PERIOD_S, NvmlReader, open_nvml
from perfsdk.plugins import hookimpl
from perfsdk.series import BoundedSeries
from perfsdk.stats import Stats, summarize

if TYPE_CHECKING:
    from perfsdk.session import Session

GPU_FIELDS = ("utilization_pct", "memory_used_bytes", "power_w", "sm_clock_mhz", "temperature_c")


class UtilizationConfig(CollectorConfig):
    """Settings of the ``utilization`` collector."""

    interval_s: float = Field(default=0.1, gt=0, le=60, description="sampling interval")
    gpus: bool = Field(default=True, description="read GPUs through NVML")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuUtilization(_Frozen):
    """Summary statistics of one GPU's readings."""

    index: int
    name: str
    utilization_pct: Stats
    memory_used_bytes: Stats
    power_w: Stats
    sm_clock_mhz: Stats
    temperature_c: Stats


class PhaseUtilization(_Frozen):
    """Summary statistics of the samples taken during one phase."""

    samples: int
    cpu_process_pct: Stats
    cpu_system_pct: Stats
    rss_bytes: Stats
    gpus: list[GpuUtilization] = Field(default_factory=list)


class UtilizationResult(CollectorResult):
    """CPU, RSS and GPU utilization: overall, per phase, and the sampler's own cost."""

    status: Literal["ok", "unavailable"]
    interval_s: float
    samples: int
    warmup_samples: int = 0
    instrumented_samples: int = Field(
        default=0, description="Samples taken while an instrumented step ran, left out of every statistic.")
    cpu_process_pct: Stats
    cpu_system_pct: Stats
    rss_bytes: Stats
    gpus: list[GpuUtilization] = Field(default_factory=list)
    gpu_available: bool = False
    gpu_reason: str = ""
    per_phase: dict[str, PhaseUtilization] = Field(default_factory=dict)
    sampler_cpu_time_s: float
    sampler_cpu_s_per_s: float | None
    sampler_run_s: float | None
    series: str | None = None
    notes: list[str] = Field(default_factory=list)


#: How often the list of child processes is rebuilt. Listing children scans every process in
#: /proc (about a millisecond); reading the RSS of known children is cheap.
CHILDREN_REFRESH_S = 1.0


class _TreeRss:
    """RSS of a process and its children, with the child list refreshed every second."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.children: list[Any] = []
        self._listed_ns: int | None = None

    def __call__(self, t_ns: int) -> int:
        import psutil

        if self._listed_ns is None or t_ns - self._listed_ns >= CHILDREN_REFRESH_S * 1e9:
            self.children = self.proc.children(recursive=True)
            self._listed_ns = t_ns
        total = self.proc.memory_info().rss
        for child in self.children:
            try:
                total += child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return int(total)


class UtilizationCollector(Collector):
    """Samples CPU %, process-tree RSS and GPU readings at ``interval_s`` on the shared sampler.

    ``nvml_reader`` is the test seam for GPUs (with ``None``, pynvml is opened if available).
    """

    name = "utilization"
    title = "Utilization"
    Config = UtilizationConfig
    Result = UtilizationResult
    default_enabled = True
    description = "CPU %, RSS (process tree) and per-GPU utilization, power, clocks, temperature"

    @classmethod
    def summary_rows(cls, result: UtilizationResult) -> list[tuple[str, str]]:
        from perfsdk.fmt import fmt_pct

        if result.status != "ok" and result.samples == 0:
            return [("utilization", result.gpu_reason or "unavailable")]
        rows = [("CPU (process) mean", f"{fmt_pct(result.cpu_process_pct.mean)} %"),
                ("CPU (system) mean", f"{fmt_pct(result.cpu_system_pct.mean)} %"),
                ("samples", str(result.samples))]
        for g in result.gpus:
            rows.append((f"GPU {g.index} utilization mean", f"{fmt_pct(g.utilization_pct.mean)} %"))
        if not result.gpu_available and result.gpu_reason:
            rows.append(("GPU", result.gpu_reason))
        return rows

    @classmethod
    def report_section(cls, result: UtilizationResult, run: Any) -> Any:
        from perfsdk.collector import ReportFigure, ReportSection, html_table
        from perfsdk.experiments.report import utilization_over_time

        sec = ReportSection("Utilization over time")
        png = utilization_over_time(run.read_series(result.series) if result.series else [])
        if png:
            sec.figures.append(ReportFigure("utilization", "Utilization over time", png))
        else:
            sec.notes.append("No utilization series stored with this run.")
        rows = [[ph, u.samples, u.cpu_process_pct.mean, u.cpu_system_pct.mean,
                 (u.rss_bytes.max / 2**20) if u.rss_bytes.max is not None else None] for ph, u in result.per_phase.items()]
        if rows:
            sec.html.append(html_table(["phase", "samples", "CPU process % mean", "CPU system % mean", "RSS max MiB"], rows))
        sec.notes += result.notes
        return sec

    def __init__(self, config: BaseModel | None = None, *, nvml_reader: NvmlReader | None = None) -> None:
        super().__init__(config)
        self.cfg: UtilizationConfig = self.config  # type: ignore[assignment]
        self._nvml = nvml_reader
        self._owns_nvml = False
        self.gpu_reason = "not started"
        self.gpu_names: list[str] = []
        self.rows = BoundedSeries()  # long runs: kept rows stay evenly spaced, memory stays flat
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._proc: Any = None
        self._sys: SystemCpu | None = None
        self._rss: _TreeRss | None = None

    @hookimpl
    def perfsdk_session_start(self, session: Session) -> None:
        import psutil

        self._session = session
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # prime: the first call always returns 0.0
        self._sys = SystemCpu()
        self._rss = _TreeRss(self._proc)
        if self.cfg.gpus:
            if self._nvml is None:
                self._nvml, why = open_nvml()
                self._owns_nvml = self._nvml is not None
                self.gpu_reason = why
            if self._nvml is not None:
                n = self._nvml.device_count()
                self.gpu_names = [self._nvml.name(i) for i in range(n)]
                self.gpu_reason = f"{n} GPU(s): " + ", ".join(self.gpu_names)
        else:
            self.gpu_reason = "disabled (collectors.utilization.gpus)"
        session.sampler.add_probe("utilization", self.sample, self.cfg.interval_s)

    def _gpu(self, fn: Any, i: int) -> Any:
        try:
            return fn(i)
        except Exception:
            return None

    def sample(self, t_ns: int) -> None:
        """Take one sample (the sampler probe)."""
        s = self._session
        assert s is not None and self._proc is not None and self._sys is not None
        row: dict[str, Any] = {
            "t_s": s.clock.since_origin_s(t_ns),
            "phase": s.phase,
            "warmup": s.in_warmup,
            "instrumented": getattr(s, "in_instrumented", False),
            "cpu_process_pct": self._proc.cpu_percent(None),
            "cpu_system_pct": self._sys.percent(),
            "rss_bytes": self._rss(t_ns) if self._rss is not None else None,
        }
        if self._nvml is not None:
            r = self._nvml
            for i in range(len(self.gpu_names)):
                row[f"gpu{i}_utilization_pct"] = self._gpu(r.utilization_pct, i)
                row[f"gpu{i}_memory_used_bytes"] = self._gpu(r.memory_used_bytes, i)
                row[f"gpu{i}_power_w"] = self._gpu(r.power_w, i)
                row[f"gpu{i}_sm_clock_mhz"] = self._gpu(r.sm_clock_mhz, i)
                row[f"gpu{i}_temperature_c"] = self._gpu(r.temperature_c, i)
        with self._lock:
            self.rows.append(row)

    @hookimpl
    def perfsdk_finalize(self, session: Session) -> UtilizationResult:
        if self._owns_nvml and self._nvml is not None:
            self._nvml.close()
        from perfsdk.collector import host_elsewhere

        away = host_elsewhere(session)
        if away is not None:
            from perfsdk.stats import summarize as _empty

            return UtilizationResult(status="unavailable", interval_s=self.cfg.interval_s, samples=0,
                                     cpu_process_pct=_empty([]), cpu_system_pct=_empty([]), rss_bytes=_empty([]),
                                     gpu_reason=f"unavailable: {away}", sampler_cpu_time_s=0.0,
                                     sampler_cpu_s_per_s=None, sampler_run_s=None,
                                     notes=[f"unavailable: {away}: this host's CPUs and GPUs do not run the model"])
        with self._lock:
            rows = list(self.rows)
            if rows:
                session.add_series("utilization", self.rows)
        return summarize_rows(rows, self.cfg.interval_s, self.gpu_names, self.gpu_reason, session.sampler)


def _stats(rows: list[dict[str, Any]], key: str) -> Stats:
    return summarize(r[key] for r in rows if r.get(key) is not None)


def _gpu_stats(rows: list[dict[str, Any]], names: list[str]) -> list[GpuUtilization]:
    return [GpuUtilization(index=i, name=n, **{f: _stats(rows, f"gpu{i}_{f}") for f in GPU_FIELDS})
            for i, n in enumerate(names)]


def summarize_rows(rows: list[dict[str, Any]], interval_s: float, gpu_names: list[str], gpu_reason: str,
                   sampler: Any) -> UtilizationResult:
    """Build the result from samples: overall statistics, per phase (warm-up left out), costs."""
    notes = []
    if interval_s < NVML_UPDATE_PERIOD_S and gpu_names:
        notes.append(f"interval_s {interval_s:g} is below NVML's ~{NVML_UPDATE_PERIOD_S:g} s update period: "
                     "consecutive GPU samples may repeat the same reading")
    by_phase: dict[str, list[dict[str, Any]]] = defaultdict(list)
    warm = 0
    instrumented = [r for r in rows if r.get("instrumented")]
    rows = [r for r in rows if not r.get("instrumented")]
    for r in rows:
        if r.get("warmup"):
            warm += 1
            continue
        by_phase[r["phase"]].append(r)
    per_phase = {
        phase: PhaseUtilization(samples=len(rs), cpu_process_pct=_stats(rs, "cpu_process_pct"),
                                cpu_system_pct=_stats(rs, "cpu_system_pct"), rss_bytes=_stats(rs, "rss_bytes"),
                                gpus=_gpu_stats(rs, gpu_names))
        for phase, rs in sorted(by_phase.items())
    }
    run_s = None
    if sampler.started_ns is not None and sampler.stopped_ns is not None:
        run_s = (sampler.stopped_ns - sampler.started_ns) / 1e9
    if warm:
        notes.append(f"{warm} warm-up samples counted in the overall statistics, left out of per_phase")
    if instrumented:
        notes.append(f"{len(instrumented)} samples taken during instrumented steps left out of every statistic")
    if not rows:
        notes.append("no samples were taken (the run was shorter than one interval, or the sampler did not run)")
    return UtilizationResult(
        status="ok" if rows else "unavailable",
        interval_s=interval_s,
        samples=len(rows),
        warmup_samples=warm,
        instrumented_samples=len(instrumented),
        cpu_process_pct=_stats(rows, "cpu_process_pct"),
        cpu_system_pct=_stats(rows, "cpu_system_pct"),
        rss_bytes=_stats(rows, "rss_bytes"),
        gpus=_gpu_stats(rows, gpu_names),
        gpu_available=bool(gpu_names),
        gpu_reason=gpu_reason,
        per_phase=per_phase,
        sampler_cpu_time_s=float(sampler.cpu_time_s),
        sampler_cpu_s_per_s=(sampler.cpu_time_s / run_s) if run_s else None,
        sampler_run_s=run_s,
        series="utilization" if rows else None,
        notes=notes,
    )


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(UtilizationCollector)

"""The run's validity verdict: can its numbers be trusted?

Like MLPerf LoadGen's VALID/INVALID, every run ends with a verdict — ``valid``, ``noisy`` or
``invalid`` — and the reasons behind it, each starting with its kind:

- ``contention``: other processes used the CPUs while timed steps ran. At the edges of every
  timed step (outside its timed interval) the monitor reads the system-wide busy CPU time
  (``/proc/stat`` through psutil: user, nice, system, irq, softirq and steal) and this process
  tree's CPU time; others' time is the difference. On CUDA, other processes on the GPUs in use
  (NVML) are contention too.
- ``unstable``: the coefficient of variation of step latency is high. Steps are grouped by shape
  (kind, batch, input tokens, generated positions) and each one's time divided by its shape's
  median, so a run of different batches is not called unstable for being varied.
- ``cold-start``: the first timed step of a shape was its slowest, by more than
  ``validity.max_cold_ratio`` times the median of the shape's later steps: it paid a first-run cost (on CUDA, kernel
  and attention plans chosen per shape) that the warm-up did not cover.
- ``drift``: the last third of those steps is slower (or faster) than the first third.
- ``few-samples``: no timed step (invalid), fewer latency samples than the tail percentiles
  need, or timed steps shorter than the sampler's interval.
- ``instrumented``: timed steps were instrumented in place (``instrumentation.replay: false``)
  and left out of the statistics; if that left none, the run is invalid.
- ``throttled``: the CPU clock (cpufreq in sysfs) or a GPU's SM clock fell between the first and
  the last third of the timed steps, CPU thermal throttle counters rose, or NVML reported a
  power or thermal slowdown.

The thresholds are ``validity.*`` in the configuration. Readings that cannot be taken here
(no ``/proc``, no cpufreq, no NVML) leave their figures empty with a note, never a reason.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from perfsdk.config import ValidityConfig
from perfsdk.schemas import (
    ContentionFigures,
    InstrumentedFigures,
    SampleFigures,
    StabilityFigures,
    ThrottleFigures,
    Validity,
)

if TYPE_CHECKING:
    from perfsdk.events import Step
    from perfsdk.session import Session

log = structlog.get_logger("perfsdk.validity")

#: Below this much timed wall time, CPU tick accounting (10 ms) is too coarse to judge contention.
MIN_CONTENTION_S = 0.5
#: Grouped steps needed for a coefficient of variation, and for a drift between thirds.
MIN_STEPS_CV = 3
MIN_STEPS_DRIFT = 6
#: Clock samples needed to compare the first and the last third.
MIN_CLOCK_SAMPLES = 3
#: How often the list of child processes is rebuilt (it scans every process in /proc).
CHILDREN_REFRESH_S = 1.0
DEFAULT_CPU_ROOT = "/sys/devices/system/cpu"

#: NVML clock-event (throttle) reasons that mean the GPU was slowed down by power or heat.
GPU_THROTTLE_BITS = {
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}
TIMED_PHASES = frozenset({"prefill", "decode", "forward"})
#: The kinds a reason starts with.
KINDS = ("contention", "unstable", "cold-start", "drift", "few-samples", "instrumented", "throttled")


# -- seams ----------------------------------------------------------------------------------


class GpuProbe(Protocol):
    """The NVML readings the verdict uses. Methods raise on failure; ``None`` = unsupported."""

    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str | None: ...
    def compute_pids(self, index: int) -> list[int] | None: ...
    def throttle_reasons(self, index: int) -> int | None: ...
    def sm_clock_mhz(self, index: int) -> float | None: ...
    def close(self) -> None: ...


class PynvmlGpuProbe:
    """:class:`GpuProbe` over ``pynvml`` (``nvidia-ml-py``)."""

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._handles: dict[int, Any] = {}

    def _h(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def uuid(self, index: int) -> str | None:
        u = self._nv.nvmlDeviceGetUUID(self._h(index))
        return u.decode() if isinstance(u, bytes) else str(u)

    def compute_pids(self, index: int) -> list[int] | None:
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses"):
            fn = getattr(self._nv, name, None)
            if fn is not None:
                return [int(p.pid) for p in fn(self._h(index))]
        return None

    def throttle_reasons(self, index: int) -> int | None:
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self._nv, name, None)
            if fn is not None:
                return int(fn(self._h(index)))
        return None

    def sm_clock_mhz(self, index: int) -> float | None:
        return float(self._nv.nvmlDeviceGetClockInfo(self._h(index), self._nv.NVML_CLOCK_SM))

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:  # already shut down: nothing to release
            pass


def open_gpu_probe() -> tuple[GpuProbe | None, str]:
    """Initialize NVML for the verdict: ``(probe, "ok")`` or ``(None, reason)``."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return None, f"NVML initialization failed: {exc}"
    return PynvmlGpuProbe(pynvml), "ok"


class CpuClocks:
    """Mean CPU clock (cpufreq ``scaling_cur_freq``) and the thermal throttle counters, from sysfs.

    ``root`` is the seam (``/sys/devices/system/cpu``); tests point it at a fake tree.
    """

    def __init__(self, root: str = DEFAULT_CPU_ROOT) -> None:
        self.root = Path(root)
        self.freq_files: list[Path] = []
        self.throttle_files: list[Path] = []
        if self.root.is_dir():
            for cpu in sorted(self.root.glob("cpu[0-9]*")):
                f = cpu / "cpufreq" / "scaling_cur_freq"
                if f.is_file():
                    self.freq_files.append(f)
                for name in ("core_throttle_count", "package_throttle_count"):
                    t = cpu / "thermal_throttle" / name
                    if t.is_file():
                        self.throttle_files.append(t)

    @property
    def readable(self) -> bool:
        return bool(self.freq_files or self.throttle_files)

    def mean_mhz(self) -> float | None:
        vals = []
        for f in self.freq_files:
            try:
                vals.append(int(f.read_text().strip()) / 1000.0)  # kHz
            except (OSError, ValueError):
                continue
        return sum(vals) / len(vals) if vals else None

    def throttle_count(self) -> int | None:
        total = None
        for f in self.throttle_files:
            try:
                total = (total or 0) + int(f.read_text().strip())
            except (OSError, ValueError):
                continue
        return total


def _system_busy_s() -> float | None:
    import psutil

    t = psutil.cpu_times()
    return sum(float(getattr(t, k, 0.0) or 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


class _TreeCpu:
    """CPU seconds of this process (reaped children included) and its live children."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.children: list[Any] = []
        self.measured: list[Any] = []  # a local server's processes: part of what is measured

    def refresh_children(self) -> None:
        try:
            self.children = self.proc.children(recursive=True)
        except Exception:  # the process table changed under us: keep the previous list
            pass
        for p in list(self.measured):
            try:
                self.children += [p, *p.children(recursive=True)]
            except Exception:
                continue

    def pids(self) -> set[int]:
        return {self.proc.pid, *(c.pid for c in self.children)}

    def __call__(self) -> float | None:
        import psutil

        t = self.proc.cpu_times()
        total = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        for c in self.children:
            try:
                ct = c.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += ct.user + ct.system
        return float(total)


# -- pure figures -----------------------------------------------------------------------------


def shape_key(step: Step) -> tuple[Any, ...]:
    """Steps with equal keys do the same work."""
    if step.kind == "generate":
        return ("generate", step.batch_size, tuple(step.input_tokens), len(step.token_times_ns))
    shapes = tuple(tuple(int(d) for d in v.shape) for v in (step.inputs or {}).values() if hasattr(v, "shape"))
    return ("forward", step.batch_size, tuple(step.input_tokens), shapes)


def stability(steps: Sequence[Step], cold_ratio: float = 1.5) -> StabilityFigures:
    """CV and first-to-last-third drift of step times, each divided by its shape's median, and the
    shapes whose first step was their slowest and took more than ``cold_ratio`` times the median
    of their later steps."""
    groups: dict[tuple[Any, ...], list[Step]] = {}
    for st in steps:
        if st.duration_s:
            groups.setdefault(shape_key(st), []).append(st)
    norm: list[tuple[int, float]] = []
    shapes = 0
    cold: list[float] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        shapes += 1
        med = statistics.median(m.duration_s or 0.0 for m in members)
        if med <= 0:
            continue
        ordered = sorted(members, key=lambda m: m.start_ns)
        later = statistics.median(m.duration_s or 0.0 for m in ordered[1:])
        first = ordered[0].duration_s or 0.0
        if later > 0 and first / later > cold_ratio and first >= max(m.duration_s or 0.0 for m in ordered):
            cold.append(first / later)
        norm.extend((m.start_ns, (m.duration_s or 0.0) / med) for m in ordered)
    norm.sort()
    vals = [v for _, v in norm]
    cv = drift = None
    if len(vals) >= MIN_STEPS_CV:
        mean = sum(vals) / len(vals)
        cv = statistics.stdev(vals) / mean if mean > 0 else None
    if len(vals) >= MIN_STEPS_DRIFT:
        k = len(vals) // 3
        first, last = statistics.median(vals[:k]), statistics.median(vals[-k:])
        drift = (last / first - 1.0) * 100.0 if first > 0 else None
    return StabilityFigures(steps=len(vals), shapes=shapes, cv=cv, drift_pct=drift, cold_shapes=len(cold),
                            cold_ratio=max(cold) if cold else None)


def _thirds_change(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if len(values) < MIN_CLOCK_SAMPLES:
        return None, None, None
    k = max(1, len(values) // 3)
    first, last = statistics.median(values[:k]), statistics.median(values[-k:])
    return first, last, ((last / first - 1.0) * 100.0 if first > 0 else None)


def throttle_figures(samples: Sequence[dict[str, Any]], notes: list[str] | None = None) -> ThrottleFigures:
    """Figures from clock samples taken during timed steps (time-ordered dicts with ``cpu_mhz``,
    ``cpu_throttle``, ``gpu_mhz`` and ``gpu_reasons`` — each may be ``None``)."""
    cpu = [float(s["cpu_mhz"]) for s in samples if s.get("cpu_mhz") is not None]
    gpu = [float(s["gpu_mhz"]) for s in samples if s.get("gpu_mhz") is not None]
    counts = [int(s["cpu_throttle"]) for s in samples if s.get("cpu_throttle") is not None]
    reasons: set[str] = set()
    for s in samples:
        bits = s.get("gpu_reasons") or 0
        reasons.update(name for bit, name in GPU_THROTTLE_BITS.items() if bits & bit)
    c0, c1, cchg = _thirds_change(cpu)
    g0, g1, gchg = _thirds_change(gpu)
    return ThrottleFigures(
        samples=len(samples), cpu_freq_first_mhz=c0, cpu_freq_last_mhz=c1, cpu_freq_change_pct=cchg,
        cpu_throttle_events=(counts[-1] - counts[0]) if len(counts) >= 2 else None,
        gpu_sm_clock_first_mhz=g0, gpu_sm_clock_last_mhz=g1, gpu_sm_clock_change_pct=gchg,
        gpu_throttle_reasons=sorted(reasons), notes=list(notes or []))


def latency_samples(steps: Sequence[Step]) -> int:
    """Requests of generate steps that produced a token, plus forward steps."""
    n = 0
    for st in steps:
        if st.kind == "forward":
            n += 1
        else:
            n += sum(1 for k in (st.output_tokens or []) if k > 0)
    return n


def instrumented_figures(steps: Sequence[Step]) -> InstrumentedFigures:
    by: dict[str, int] = {}
    copies = in_place = 0
    spent = 0.0
    for st in steps:
        if not st.instrumented_by:
            continue
        for name in st.instrumented_by:
            by[name] = by.get(name, 0) + 1
        if st.replay_of is not None:
            copies += 1
        else:
            in_place += 1
        spent += st.duration_s or 0.0
    return InstrumentedFigures(steps=copies + in_place, copies=copies, in_place=in_place,
                               by_collector=dict(sorted(by.items())), time_s=spent)


def client_bound(cfg: ValidityConfig, stats: Any) -> str | None:
    """``client-bound: …`` when the load-generating client fell behind its own schedule: the
    p99 of its sends' lag behind schedule, or of its event loop's delay, above
    ``validity.max_client_lag_s``. None when it kept up (or was not measured)."""
    if stats is None:
        return None
    from perfsdk.stats import summarize

    worst = []
    for what, values in (("sends lagged their schedule", stats.send_lag_ns),
                         ("the event loop was late", stats.loop_lag_ns)):
        st = summarize(v / 1e9 for v in values)
        if st.p99 is not None and st.p99 > cfg.max_client_lag_s:
            worst.append(f"{what} by {st.p99 * 1e3:.1f} ms at p99")
    if not worst:
        return None
    return (f"client-bound: {'; '.join(worst)} (limit {cfg.max_client_lag_s * 1e3:g} ms): the client, not the "
            f"server, may set these latencies")


def judge(cfg: ValidityConfig, *, contention: ContentionFigures, stab: StabilityFigures, samples: SampleFigures,
          instr: InstrumentedFigures, throttle: ThrottleFigures) -> tuple[str, list[str]]:
    """The verdict and its reasons from the figures and the thresholds."""
    noisy: list[str] = []
    invalid: list[str] = []
    if contention.other_cpu_pct is not None and contention.status == "ok":
        pct, cores = contention.other_cpu_pct, contention.other_cpu_cores or 0.0
        text = (f"other processes used {pct:.1f}% of the CPUs ({cores:.2f} of {contention.logical_cpus}) while "
                "timed steps ran")
        if cfg.invalid_contention_pct is not None and pct > cfg.invalid_contention_pct:
            invalid.append(f"contention: {text} (limit for a valid comparison {cfg.invalid_contention_pct:g}%)")
        elif pct > cfg.max_contention_pct:
            noisy.append(f"contention: {text} (limit {cfg.max_contention_pct:g}%)")
    if contention.gpu_other_pids:
        noisy.append(f"contention: other processes on the GPU (pids {', '.join(map(str, contention.gpu_other_pids))})")
    if stab.cv is not None and stab.cv > cfg.max_cv:
        noisy.append(f"unstable: step latency varies by {stab.cv * 100:.1f}% (coefficient of variation over "
                     f"{stab.steps} steps; limit {cfg.max_cv * 100:g}%)")
    if stab.cold_shapes:
        noisy.append(f"cold-start: the first timed step of {stab.cold_shapes} of {stab.shapes} step shapes was its "
                     f"slowest, up to {stab.cold_ratio:.1f}x the median of that shape's later steps (a first-run cost the warm-up did "
                     "not cover: set workload.warmup_every_batch: true, or run each shape once in s.warmup())")
    if stab.drift_pct is not None and abs(stab.drift_pct) > cfg.max_drift_pct:
        word = "slower" if stab.drift_pct > 0 else "faster"
        noisy.append(f"drift: the last third of timed steps is {abs(stab.drift_pct):.1f}% {word} than the first "
                     f"(limit {cfg.max_drift_pct:g}%)")
    if samples.timed_steps == 0:
        invalid.append("few-samples: no timed step finished")
    else:
        if samples.latency_samples < samples.min_samples:
            noisy.append(f"few-samples: {samples.latency_samples} latency samples, fewer than the {samples.min_samples} "
                         "that tail percentiles (p99) need")
        if (samples.timed_wall_s is not None and samples.sampler_interval_s is not None
                and samples.timed_wall_s < samples.sampler_interval_s):
            noisy.append(f"few-samples: timed steps lasted {samples.timed_wall_s:.3g} s, less than the sampler's "
                         f"{samples.sampler_interval_s:g} s interval (sampled figures rest on one or no sample)")
    if instr.in_place:
        names = ", ".join(instr.by_collector)
        text = (f"instrumented: {instr.in_place} timed step(s) instrumented in place by {names}, left out of the "
                "statistics")
        (invalid if samples.timed_steps == 0 else noisy).append(text)
    drops = []
    if throttle.cpu_freq_change_pct is not None and -throttle.cpu_freq_change_pct > cfg.max_freq_drop_pct:
        drops.append(f"CPU clock fell {-throttle.cpu_freq_change_pct:.1f}% "
                     f"({throttle.cpu_freq_first_mhz:.0f} -> {throttle.cpu_freq_last_mhz:.0f} MHz)")
    if throttle.gpu_sm_clock_change_pct is not None and -throttle.gpu_sm_clock_change_pct > cfg.max_freq_drop_pct:
        drops.append(f"GPU SM clock fell {-throttle.gpu_sm_clock_change_pct:.1f}% "
                     f"({throttle.gpu_sm_clock_first_mhz:.0f} -> {throttle.gpu_sm_clock_last_mhz:.0f} MHz)")
    if throttle.cpu_throttle_events:
        drops.append(f"{throttle.cpu_throttle_events} CPU thermal throttle events")
    if throttle.gpu_throttle_reasons:
        drops.append("GPU slowed down: " + ", ".join(throttle.gpu_throttle_reasons))
    if drops:
        noisy.append(f"throttled: {'; '.join(drops)} (clock limit {cfg.max_freq_drop_pct:g}%)")
    if invalid:
        return "invalid", invalid + noisy
    return ("noisy" if noisy else "valid"), noisy


# -- the monitor ----------------------------------------------------------------------------------


class ValidityMonitor:
    """Gathers what the verdict needs during a session and computes it at the end.

    Readings at the edges of timed steps are cheap (two ``/proc`` reads each edge) and happen
    outside the timed interval; clocks, throttling and GPU processes are read by the shared
    sampler every ``validity.sample_interval_s`` while a timed step runs. Seams for tests:
    ``busy_s`` and ``tree_s`` (CPU-second readers), ``cpu_root`` (sysfs) and ``gpu``.
    """

    def __init__(self, cfg: ValidityConfig, *, busy_s: Callable[[], float | None] | None = None,
                 tree_s: Callable[[], float | None] | None = None, cpu_root: str = DEFAULT_CPU_ROOT,
                 gpu: GpuProbe | None = None) -> None:
        self.cfg = cfg
        self.busy_s = busy_s
        self.tree_s: Callable[[], float | None] | None = tree_s
        self.cpu_root = cpu_root
        self.gpu = gpu
        self._gpu_opened = gpu is not None  # an injected probe is read whatever the device
        self._owns_gpu = False
        self._gpu_status: str | None = None
        self._gpu_indices: list[int] | None = None
        self._tree: _TreeCpu | None = None
        self._clocks: CpuClocks | None = None
        self._session: Session | None = None
        self._lock = threading.Lock()
        self._edge: tuple[int, float | None, float | None] | None = None
        self.timed_ns = 0
        self.busy_total = 0.0
        self.own_total = 0.0
        self.readings = 0
        self.failed_readings = 0
        self.samples: list[dict[str, Any]] = []
        self.gpu_pids: set[int] = set()
        self.notes: list[str] = []
        self._children_ns = 0

    def include_processes(self, pids: list[int], why: str) -> None:
        """Count these processes (and their children) as part of what is measured, not as
        contention: the local server of a served model."""
        if self._tree is None:
            return
        import psutil

        for pid in pids:
            try:
                self._tree.measured.append(psutil.Process(pid))
            except Exception:
                continue
        self._tree.refresh_children()
        self.notes.append(f"{why} (pid {', '.join(map(str, pids))}): its CPU time counts as measured work, not "
                          f"as contention")

    def attach(self, session: Session) -> None:
        """Set up the readers and the sampler probe (at session start)."""
        self._session = session
        if self.tree_s is None:
            try:
                self._tree = _TreeCpu()
                self._tree.refresh_children()
                self.tree_s = self._tree
            except Exception as exc:
                self.notes.append(f"contention: this process's CPU time cannot be read ({exc!r})")
        if self.busy_s is None:
            self.busy_s = _system_busy_s
        self._clocks = CpuClocks(self.cpu_root)
        session.sampler.add_probe("validity", self.sample, self.cfg.sample_interval_s)

    # -- edges of timed steps (main thread) ----------------------------------------------------

    def _read(self) -> tuple[int, float | None, float | None]:
        t = time.perf_counter_ns()
        try:
            busy = self.busy_s() if self.busy_s is not None else None
            own = self.tree_s() if self.tree_s is not None else None
        except Exception:
            busy = own = None
        return t, busy, own

    def step_begin(self) -> None:
        if self.busy_s is None:
            return
        self._edge = self._read()

    def step_end(self) -> None:
        start, self._edge = self._edge, None
        if start is None:
            return
        end = self._read()
        with self._lock:
            if None in (start[1], start[2], end[1], end[2]):
                self.failed_readings += 1
                return
            self.timed_ns += end[0] - start[0]
            self.busy_total += end[1] - start[1]  # type: ignore[operator]
            self.own_total += end[2] - start[2]  # type: ignore[operator]
            self.readings += 1

    # -- sampler probe (sampler thread) -------------------------------------------------------

    def sample(self, t_ns: int) -> None:
        """Refresh the child list; read clocks, throttling and GPU processes during timed steps."""
        s = self._session
        if s is None:
            return
        if self._tree is not None and t_ns - self._children_ns >= CHILDREN_REFRESH_S * 1e9:
            self._tree.refresh_children()
            self._children_ns = t_ns
        if s.phase not in TIMED_PHASES or s.in_warmup or s.in_instrumented:
            return
        row: dict[str, Any] = {"t_ns": t_ns, "cpu_mhz": None, "cpu_throttle": None, "gpu_mhz": None,
                               "gpu_reasons": None}
        if self._clocks is not None and self._clocks.readable:
            row["cpu_mhz"] = self._clocks.mean_mhz()
            row["cpu_throttle"] = self._clocks.throttle_count()
        self._sample_gpu(s, row)
        with self._lock:
            self.samples.append(row)

    def _gpu_devices(self, s: Session) -> list[int]:
        """NVML indices of the GPUs this session uses (matched by UUID; all when unknown)."""
        assert self.gpu is not None
        if self._gpu_indices is not None:
            return self._gpu_indices
        n = self.gpu.device_count()
        wanted: list[int] = list(range(n))
        try:
            import torch

            uuids = {str(torch.cuda.get_device_properties(i).uuid) for i in s.clock.cuda_devices}
            mine = [i for i in range(n) if (self.gpu.uuid(i) or "").removeprefix("GPU-") in uuids]
            wanted = mine or wanted
        except Exception:  # no torch CUDA properties (a fake probe, an old torch): every GPU
            pass
        self._gpu_indices = wanted
        return wanted

    def _sample_gpu(self, s: Session, row: dict[str, Any]) -> None:
        if not self._gpu_opened:
            if not s.clock.cuda_devices:
                return
            self._gpu_opened = True
            self.gpu, why = open_gpu_probe()
            self._owns_gpu = self.gpu is not None
            if self.gpu is None:
                self._gpu_status = f"unavailable: {why}"
                return
        if self.gpu is None:
            return
        try:
            devices = self._gpu_devices(s)
            mine = self._tree.pids() if self._tree is not None else {os.getpid()}
            clocks = []
            reasons = 0
            for i in devices:
                pids = self.gpu.compute_pids(i)
                if pids:
                    self.gpu_pids.update(p for p in pids if p not in mine)
                r = self.gpu.throttle_reasons(i)
                reasons |= int(r or 0)
                mhz = self.gpu.sm_clock_mhz(i)
                if mhz is not None:
                    clocks.append(mhz)
            row["gpu_mhz"] = sum(clocks) / len(clocks) if clocks else None
            row["gpu_reasons"] = reasons
            self._gpu_status = "ok"
        except Exception as exc:
            if self._gpu_status != f"unavailable: NVML read failed ({exc!r})":
                log.warning("NVML read for the validity verdict failed", error=repr(exc))
            self._gpu_status = f"unavailable: NVML read failed ({exc!r})"

    # -- the verdict ----------------------------------------------------------------------------

    def contention(self) -> ContentionFigures:
        import psutil

        cpus = psutil.cpu_count() or os.cpu_count() or 1
        timed_s = self.timed_ns / 1e9
        base: dict[str, Any] = {"timed_s": timed_s, "logical_cpus": cpus, "gpu_status": self._gpu_status,
                                "gpu_other_pids": sorted(self.gpu_pids)}
        if self.readings == 0:
            why = "no timed step was read" if not self.failed_readings else "CPU times could not be read"
            return ContentionFigures(status="unavailable", reason=why, **base)
        other = max(0.0, self.busy_total - self.own_total)
        figures = ContentionFigures(system_busy_cpu_s=self.busy_total, own_cpu_s=self.own_total, other_cpu_s=other,
                                    other_cpu_cores=other / timed_s if timed_s > 0 else None,
                                    other_cpu_pct=other / (timed_s * cpus) * 100.0 if timed_s > 0 else None, **base)
        if timed_s < MIN_CONTENTION_S:
            return figures.model_copy(update={
                "status": "unavailable",
                "reason": f"timed steps lasted {timed_s:.3g} s, too short for CPU tick accounting "
                          f"(needs {MIN_CONTENTION_S:g} s)"})
        return figures

    def finalize(self, session: Session) -> Validity:
        measured = session.measured_steps
        wall = None
        if measured:
            wall = (max(st.end_ns or 0 for st in measured) - min(st.start_ns for st in measured)) / 1e9
        intervals = [iv for name, iv in session.sampler.intervals_s.items() if name != "validity"]
        samples = SampleFigures(timed_steps=len(measured), latency_samples=latency_samples(measured),
                                min_samples=self.cfg.min_samples, timed_wall_s=wall,
                                sampler_interval_s=min(intervals) if intervals else None)
        notes = list(self.notes) + list(getattr(session, "instrumentation_notes", []))
        clock_notes = []
        if self._clocks is not None and not self._clocks.readable:
            clock_notes.append(f"no cpufreq or thermal_throttle files under {self.cpu_root}: CPU clocks not read")
        with self._lock:
            rows = list(self.samples)
        throttle = throttle_figures(rows, clock_notes)
        contention = self.contention()
        if contention.status != "ok" and contention.reason:
            notes.append(f"contention not judged: {contention.reason}")
        instr = instrumented_figures(session.steps)
        if instr.copies:
            notes.append(f"{instr.copies} instrumented cop{'y' if instr.copies == 1 else 'ies'} of timed steps "
                         f"({', '.join(f'{k}: {v}' for k, v in instr.by_collector.items())}) left out of the statistics")
        served = [st for st in measured if st.served is not None]
        stab = stability([st for st in measured if st.served is None], self.cfg.max_cold_ratio)
        if served:
            notes.append("stability not judged on requests to a served model: their latency follows the load")
        verdict, reasons = judge(self.cfg, contention=contention, stab=stab, samples=samples, instr=instr,
                                 throttle=throttle)
        lag = client_bound(self.cfg, getattr(session, "client_stats", None))
        if lag is not None:
            reasons.append(lag)
            if verdict == "valid":
                verdict = "noisy"
        if self.gpu is not None and self._owns_gpu:
            self.gpu.close()
        return Validity(verdict=verdict, reasons=reasons, notes=notes, contention=contention,  # type: ignore[arg-type]
                        stability=stab, samples=samples, instrumented=instr, throttling=throttle,
                        thresholds=self.cfg.model_dump(mode="json"))


# -- presentation -------------------------------------------------------------------------------

VERDICT_STYLE = {"valid": "green", "noisy": "yellow", "invalid": "red"}


def summary_lines(v: Validity | None) -> list[str]:
    """Terminal lines (rich markup): the verdict with its reasons, then instrumented steps left out."""
    from rich.markup import escape

    if v is None:
        return ["validity: [dim]unknown (stored before verdicts)[/]"]
    style = VERDICT_STYLE.get(v.verdict, "white")
    line = f"validity: [{style}]{v.verdict}[/]"
    if v.reasons:
        line += " — " + escape("; ".join(v.reasons))
    lines = [line]
    if v.instrumented.steps:
        by = ", ".join(f"{k} {n}" for k, n in v.instrumented.by_collector.items())
        what = f"{v.instrumented.copies} cop{'y' if v.instrumented.copies == 1 else 'ies'} of timed steps"
        if v.instrumented.in_place:
            what += f", {v.instrumented.in_place} timed in place"
        lines.append(f"[dim]instrumented steps: {what} ({escape(by)}), left out of every statistic[/]")
    return lines


def report_html(v: Validity | None) -> str:
    """An HTML block for the report: verdict, reasons, notes and the figures behind them."""
    import html

    if v is None:
        return "<p>No verdict: this run was stored before runs had one.</p>"
    colour = {"valid": "#2a9d8f", "noisy": "#e9c46a", "invalid": "#e76f51"}.get(v.verdict, "#999")
    parts = [f'<p><b style="background:{colour};padding:2px 8px;border-radius:3px">{html.escape(v.verdict)}</b></p>']
    if v.reasons:
        parts.append("<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in v.reasons) + "</ul>")
    rows: list[tuple[str, Any]] = [
        ("other processes' CPU (% of all CPUs)", v.contention.other_cpu_pct),
        ("other GPU processes", ", ".join(map(str, v.contention.gpu_other_pids)) or "-"),
        ("step latency CV", v.stability.cv),
        ("drift, last vs first third (%)", v.stability.drift_pct),
        ("timed steps", v.samples.timed_steps),
        ("latency samples", v.samples.latency_samples),
        ("instrumented steps (copies / in place)", f"{v.instrumented.copies} / {v.instrumented.in_place}"),
        ("CPU clock change (%)", v.throttling.cpu_freq_change_pct),
        ("GPU SM clock change (%)", v.throttling.gpu_sm_clock_change_pct),
    ]

    def cell(x: Any) -> str:
        if x is None:
            return "-"
        return f"{x:.4g}" if isinstance(x, float) else html.escape(str(x))

    parts.append("<table><tr><th>figure</th><th>value</th></tr>"
                 + "".join(f"<tr><td>{html.escape(k)}</td><td>{cell(x)}</td></tr>" for k, x in rows) + "</table>")
    if v.notes:
        parts.append("<ul>" + "".join(f"<li><i>{html.escape(n)}</i></li>" for n in v.notes) + "</ul>")
    return "\n".join(parts)

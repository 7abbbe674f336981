"""The ``energy`` collector: joules per window, per source, per output token.

Every available source is read at every window edge (``session``, ``step:N``, ``encode``,
``prefill``, ``decode``, ``stage:<name>``); the session synchronizes CUDA before each edge, so asynchronous
GPU work is inside the window it belongs to. Counters come first (NVML total energy, RAPL
``energy_uj``); power integration is used only where a GPU lacks the counter, and labeled;
``estimated`` (TDP × utilization) only when asked for. CodeCarbon runs beside them, offline,
for the session window. Without any measuring source the result is ``unavailable`` with the
reasons — never zeros.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult, RankShare
from perfsdk.energy.base import Channel, EnergySource
from perfsdk.energy.codecarbon_source import CodeCarbonReading, CodeCarbonSource
from perfsdk.energy.estimated import EstimatedSource
from perfsdk.energy.nvml import NvmlReader, NvmlSource
from perfsdk.energy.rapl import DEFAULT_ROOT, RAPL_MAX_POWER_W, RaplSource
from perfsdk.energy.windows import EnergyMeter, WindowEnergy
from perfsdk.plugins import hookimpl

if TYPE_CHECKING:
    from perfsdk.events import Window
    from perfsdk.session import Session

log = structlog.get_logger("perfsdk.collectors.energy")

SourceName = Literal["nvml", "rapl", "codecarbon"]
ALL_SOURCES: tuple[SourceName, ...] = ("nvml", "rapl", "codecarbon")
#: Sources that measure (counter or integrated), as opposed to model.
MEASURING = ("nvml", "rapl")
#: Scopes that never overlap each other, so their joules may be added (psys contains packages).
NON_OVERLAPPING = ("gpu", "package", "dram")
#: A phase's counter windows must add up to this many update periods before its per-token figure
#: is given: a counter moves in whole updates, so k periods' worth is known to about ±1/sqrt(k).
MIN_COUNTER_PERIODS = 10


class CodeCarbonSettings(CollectorConfig):
    """CodeCarbon settings: always offline; CO2 uses this country's grid intensity."""

    enabled: bool = True
    country_iso_code: str = Field(default="USA", min_length=3, max_length=3)
    region: str | None = None
    tracking_mode: Literal["machine", "process"] = "machine"
    measure_power_secs: float = Field(default=15.0, gt=0)


class EnergyConfig(CollectorConfig):
    """Settings of the ``energy`` collector."""

    sources: list[SourceName] | None = Field(
        default=None, description="sources to read; default: every available one of nvml, rapl, codecarbon")
    rapl_root: str = Field(default=DEFAULT_ROOT, description="powercap folder (containers may mount it elsewhere)")
    rapl_max_power_w: float = Field(
        default=RAPL_MAX_POWER_W, gt=0,
        description="generous upper bound of one RAPL zone's power: counters are read at least twice per the "
        "shortest time they can take to wrap at this power")
    estimated: bool = Field(default=False, description="add the opt-in 'estimated' source (TDP x utilization)")
    cpu_tdp_w: float | None = Field(default=None, gt=0, description="CPU TDP for the estimated source")
    power_interval_s: float = Field(default=0.1, gt=0, description="power sampling interval for integrated/estimated")
    codecarbon: CodeCarbonSettings = Field(default_factory=CodeCarbonSettings)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnergyWindow(_Frozen):
    """Energy of one window from one source/scope/device."""

    window: str
    source: str
    scope: str
    device: str
    device_name: str | None = None
    energy_j: float | None
    duration_s: float
    power_w: float | None
    method: Literal["counter", "integrated", "estimated"]
    low_confidence: bool = False
    confidence_note: str | None = None
    warmup: bool = False
    instrumented: bool = False
    step_index: int | None = None
    samples: int = 0
    co2_kg: float | None = None


class SourceStatus(_Frozen):
    """Whether a source could be used here, and why (not)."""

    name: str
    available: bool
    reason: str


class PhaseEnergy(_Frozen):
    """Energy of one phase (summed over its windows) on one source/scope/device."""

    energy_j: float | None
    duration_s: float
    power_w: float | None
    windows: int
    output_tokens: int | None = None
    input_tokens: int | None = None
    j_per_output_token: float | None = None
    j_per_input_token: float | None = None
    low_confidence_windows: int = 0
    low_confidence: bool = Field(
        default=False, description="The windows add up to fewer than MIN_COUNTER_PERIODS update periods of the "
                                   "counter: their summed difference is quantized to whole updates")
    confidence_note: str | None = None
    method: str


class CodeCarbonDetail(_Frozen):
    """What CodeCarbon reported for the session (CO2 for the configured country)."""

    energy_j: float
    cpu_energy_j: float
    gpu_energy_j: float
    ram_energy_j: float
    co2_kg: float
    duration_s: float
    country_iso_code: str | None
    region: str | None
    cpu_mode: str | None
    tracking_mode: str


class EnergyResult(CollectorResult):
    """Per-window energy, per-source totals, joules per output token, per phase.

    Keys of the per-source dicts are ``source:scope`` (``source:gpu:N`` for GPUs), e.g.
    ``nvml:gpu:0``, ``rapl:package``, ``rapl:dram``, ``codecarbon:machine``. The headline
    figures (``measured_energy_j``, ``j_per_output_token``, ``output_tokens_per_j``,
    ``j_per_output_token_per_phase``) add up the measuring channels that do not overlap — every
    GPU, RAPL package and RAPL dram (``measured_keys``) — and are ``None`` when there is none.
    """

    status: Literal["ok", "unavailable"]
    reasons: list[str] = Field(default_factory=list)
    sources: list[SourceStatus]
    windows: list[EnergyWindow] = Field(default_factory=list)
    energy_j: dict[str, float | None] = Field(default_factory=dict)
    steps_energy_j: dict[str, float | None] = Field(default_factory=dict)
    output_tokens: int = 0
    measured_keys: list[str] = Field(default_factory=list)
    measured_energy_j: float | None = None
    measured_steps_energy_j: float | None = None
    j_per_output_token: float | None = None
    output_tokens_per_j: float | None = None
    j_per_output_token_per_phase: dict[str, float | None] = Field(default_factory=dict)
    j_per_output_token_by_source: dict[str, float] = Field(default_factory=dict)
    output_tokens_per_j_by_source: dict[str, float] = Field(default_factory=dict)
    per_phase: dict[str, dict[str, PhaseEnergy]] = Field(default_factory=dict)
    co2_kg: float | None = None
    codecarbon: CodeCarbonDetail | None = None
    warmup_windows: int = 0
    instrumented_windows: int = Field(
        default=0, description="Windows of instrumented steps (FLOPs counting, hooks, profiler), left out of the figures.")
    edge_reads: int = 0
    notes: list[str] = Field(default_factory=list)


class EnergyCollector(Collector):
    """Energy per window from NVML, RAPL, CodeCarbon (and, opt-in, an estimate).

    The keyword arguments are test seams: ``nvml_reader`` replaces pynvml, ``rapl_read_text``
    replaces file reads under the powercap root, ``extra_sources`` adds ready sources.
    """

    name = "energy"
    title = "Energy"
    key_columns = ("j_per_output_token",)
    Config = EnergyConfig
    Result = EnergyResult
    default_enabled = True
    description = "energy per window (NVML, RAPL, CodeCarbon), joules per output token"

    def __init__(self, config: BaseModel | None = None, *, nvml_reader: NvmlReader | None = None,
                 rapl_read_text: Callable[[Path], str] | None = None,
                 extra_sources: list[EnergySource] | None = None) -> None:
        super().__init__(config)
        self.cfg: EnergyConfig = self.config  # type: ignore[assignment]
        self._nvml_reader = nvml_reader
        self._rapl_read_text = rapl_read_text
        self._extra = list(extra_sources or [])
        self.statuses: list[SourceStatus] = []
        self.meter: EnergyMeter | None = None
        self.codecarbon: CodeCarbonSource | None = None
        self.cc_reading: CodeCarbonReading | None = None
        self.notes: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------

    def _selected(self, name: str) -> bool:
        return self.cfg.sources is None or name in self.cfg.sources

    def _open_sources(self) -> list[EnergySource]:
        opened: list[EnergySource] = []
        candidates: list[tuple[str, Callable[[], EnergySource]]] = [
            ("nvml", lambda: NvmlSource(self._nvml_reader)),
            ("rapl", lambda: RaplSource(self.cfg.rapl_root, self._rapl_read_text, self.cfg.rapl_max_power_w)),
        ]
        for name, make in candidates:
            if not self._selected(name):
                self.statuses.append(SourceStatus(name=name, available=False,
                                                  reason="not selected (collectors.energy.sources)"))
                continue
            src = make()
            try:
                ok, why = src.open()
            except Exception as exc:
                ok, why = False, f"{name} failed to open: {exc!r}"
            self.statuses.append(SourceStatus(name=name, available=ok, reason=why))
            if ok:
                opened.append(src)
            else:
                src.close()
        if self.cfg.estimated:
            est = EstimatedSource(self.cfg.cpu_tdp_w, nvml=self._nvml_reader)
            ok, why = est.open()
            self.statuses.append(SourceStatus(name="estimated", available=ok, reason=why))
            if ok:
                opened.append(est)
        for src in self._extra:
            ok, why = src.open() if not src.available else (True, src.reason)
            self.statuses.append(SourceStatus(name=src.name, available=ok, reason=why))
            if ok:
                opened.append(src)
        return opened

    @hookimpl
    def perfsdk_session_start(self, session: Session) -> None:
        self.meter = EnergyMeter(self._open_sources())
        if self.meter.wants_power_samples:
            session.sampler.add_probe("energy-power", self.meter.sample_power, self.cfg.power_interval_s)
        polled = [(src, iv) for src in self.meter.sources if (iv := src.poll_interval_s()) is not None]
        if polled:
            # Counters that wrap are read often enough to see every wrap, whatever the windows.
            def poll(t_ns: int) -> None:
                for src, _ in polled:
                    src.poll(t_ns)

            session.sampler.add_probe("energy-counters", poll, min(iv for _, iv in polled), start_now=False)
        cc = self.cfg.codecarbon
        if not (cc.enabled and self._selected("codecarbon")):
            why = "disabled (collectors.energy.codecarbon.enabled)" if not cc.enabled else \
                "not selected (collectors.energy.sources)"
            self.statuses.append(SourceStatus(name="codecarbon", available=False, reason=why))
            return
        self.codecarbon = CodeCarbonSource(cc.country_iso_code, cc.region, cc.tracking_mode, cc.measure_power_secs)
        ok, why = self.codecarbon.start()
        self.statuses.append(SourceStatus(name="codecarbon", available=ok, reason=why))

    # Read last when a window opens and first when it closes, so other collectors' edge work
    # (RSS reads, CUDA memory stats) stays outside the metered interval.
    @hookimpl(trylast=True)
    def perfsdk_window_open(self, session: Session, window: Window) -> None:
        if self.meter is not None and self.meter.sources:
            # an edge inside a timed step (a phase switch) is read off the generating thread
            self.meter.open(id(window), window.name, window.start_ns, window.warmup, window.step_index,
                            window.instrumented, defer=bool(getattr(session, "in_timed_interval", False)))

    @hookimpl(tryfirst=True)
    def perfsdk_window_close(self, session: Session, window: Window) -> None:
        if self.meter is not None and self.meter.sources and window.end_ns is not None:
            self.meter.close(id(window), window.end_ns, defer=bool(getattr(session, "in_timed_interval", False)))

    @classmethod
    def report_section(cls, result: EnergyResult, run: Any = None) -> Any:
        """The report's energy section as tables: headline figures, sources, energy per phase
        and channel, CodeCarbon's estimate and the notes."""
        from perfsdk.collector import ReportSection

        return ReportSection("Energy", energy_report_html(result))

    @hookimpl
    def perfsdk_finalize(self, session: Session) -> EnergyResult:
        if self.codecarbon is not None:
            self.cc_reading = self.codecarbon.stop()
            if self.cc_reading is None:
                self.statuses = [s if s.name != "codecarbon" else
                                 SourceStatus(name="codecarbon", available=False, reason=self.codecarbon.reason)
                                 for s in self.statuses]
        if self.meter is not None:
            self.meter.close_all()
        return build_result(self, session)

    # -- presentation ---------------------------------------------------------------------------

    @classmethod
    def summary_rows(cls, result: EnergyResult) -> list[tuple[str, str]]:
        rows: list[tuple[str, str]] = []
        if result.j_per_output_token is not None:
            rows.append(("energy J/token (measured)", f"{result.j_per_output_token:.4g}"))
            for phase, v in result.j_per_output_token_per_phase.items():
                if phase in ("encode", "prefill", "decode") and v is not None:
                    rows.append((f"  {phase} J/token", f"{v:.4g}"))
        else:
            missing = [r.split(":", 1)[0] for r in result.reasons]
            rows.append(("energy (measured)", f"unavailable: {', '.join(missing) or 'no source'} (see perfsdk doctor)"))
        cc = result.codecarbon
        if cc is not None:
            rows.append(("CodeCarbon estimate (session)",
                         f"{cc.energy_j:.4g} J, {cc.co2_kg * 1e3:.3g} g CO2 ({cc.country_iso_code or '?'})"))
        return rows

    # -- distributed runs -----------------------------------------------------------------------

    @classmethod
    def merge_ranks(cls, shares: list[RankShare]) -> EnergyResult:
        """Energy summed over hosts: a host-wide counter (``rapl:package``, ``codecarbon:machine``)
        read by several ranks of one host counts once (the largest reading); per-process sources
        (``...:process``) are summed. Joules per token use the tokens of all ranks."""
        present = [(sh.hostname or f"rank{sh.rank}", sh.result) for sh in shares]
        base: EnergyResult = present[0][1]
        upd: dict[str, Any] = {}
        for fld in ("energy_j", "steps_energy_j"):
            keys: dict[str, list[tuple[str, float]]] = {}
            for host, e in present:
                for k, v in getattr(e, fld).items():
                    if v is not None:
                        keys.setdefault(k, []).append((host, float(v)))
            upd[fld] = {k: _host_total(k, vals) for k, vals in keys.items()}
        tokens = sum(e.output_tokens for _, e in present)
        upd["output_tokens"] = tokens
        by_source = {k: v for k, v in upd["steps_energy_j"].items() if v}
        upd["j_per_output_token_by_source"] = {k: v / tokens for k, v in by_source.items() if tokens}
        upd["output_tokens_per_j_by_source"] = {k: tokens / v for k, v in by_source.items() if tokens}
        # the headline adds up only the non-overlapping measuring channels (as on one process)
        mkeys = sorted({k for _, e in present for k in e.measured_keys})
        measured = [upd["steps_energy_j"].get(k) for k in mkeys]
        if mkeys and all(v is not None for v in measured):
            m_steps = float(sum(measured))  # type: ignore[arg-type]
            upd.update(measured_keys=mkeys, measured_steps_energy_j=m_steps,
                       j_per_output_token=m_steps / tokens if tokens else None,
                       output_tokens_per_j=tokens / m_steps if m_steps and tokens else None)
        else:
            upd.update(j_per_output_token=None, output_tokens_per_j=None)
        upd["status"] = "ok" if any(e.status == "ok" for _, e in present) else base.status
        return base.model_copy(update=upd)


def _host_total(key: str, per_rank: list[tuple[str, float]]) -> float:
    """Sum over hosts; a host-wide counter read by several ranks of one host counts once."""
    if key.endswith(":process"):
        return sum(v for _, v in per_rank)
    by_host: dict[str, float] = {}
    for host, v in per_rank:
        by_host[host] = max(by_host.get(host, v), v)
    return sum(by_host.values())


# -- result building ------------------------------------------------------------------------


def _entry(w: WindowEnergy) -> EnergyWindow:
    note = w.note  # a counter read failed inside the window
    if note is None and w.duration_s < w.channel.update_period_s:
        note = f"window shorter than the {w.channel.update_period_s * 1000:g} ms counter update period"
    elif note is None and w.low_confidence:
        note = "fewer than two power samples in the window"
    return EnergyWindow(window=w.window, source=w.channel.source, scope=w.channel.scope, device=w.channel.device,
                        device_name=w.channel.device_name, energy_j=w.energy_j, duration_s=w.duration_s,
                        power_w=w.power_w, method=w.channel.method, low_confidence=w.low_confidence,
                        confidence_note=note, warmup=w.warmup, instrumented=w.instrumented,
                        step_index=w.step_index, samples=w.samples)


def _aggregate_confidence(channel: Channel, duration_s: float, windows: int,
                          energy_j: float | None) -> tuple[bool, str | None]:
    """Whether a counter's summed windows are too short to trust: a counter that refreshes every
    ``update_period_s`` moves in whole updates, so windows adding up to a few periods catch a
    few updates or none (the difference is then zero however much power was drawn)."""
    period = channel.update_period_s
    if channel.method != "counter" or period <= 0 or duration_s >= MIN_COUNTER_PERIODS * period:
        return False, None
    moved = "" if energy_j else "; the counter did not advance in them"
    return True, (f"{windows} window{'s' if windows != 1 else ''} adding up to {duration_s * 1000:.3g} ms, "
                  f"{duration_s / period:.2g} of the counter's {period * 1000:g} ms update periods "
                  f"(fewer than {MIN_COUNTER_PERIODS}){moved}")


def _phase_of(name: str) -> list[str]:
    """The per-phase buckets a window counts in (a served run's requests window stands for its
    overlapping steps)."""
    from perfsdk.events import SERVED_WINDOW

    if name.startswith("step:") or name == SERVED_WINDOW:
        return ["steps", name]
    return [name]


def _tokens(steps: list[Any], attr: str) -> int:
    return sum(sum(getattr(s, attr) or []) for s in steps)


def build_result(col: EnergyCollector, session: Session) -> EnergyResult:
    """Turn the meter's closed windows (and CodeCarbon's reading) into an :class:`EnergyResult`."""
    from perfsdk.collector import host_elsewhere
    from perfsdk.events import SERVED_WINDOW

    away = host_elsewhere(session)
    if away is not None:
        return EnergyResult(status="unavailable", reasons=[f"served model: {away}"], sources=col.statuses,
                            notes=[f"unavailable: {away}: this host's counters do not see the server"])
    notes = list(col.notes)
    meter = col.meter
    closed = meter.closed if meter is not None else []
    measured = {s.index: s for s in session.measured_steps}
    out_tokens = _tokens(list(measured.values()), "output_tokens")
    in_tokens = _tokens(list(measured.values()), "input_tokens")

    windows = [_entry(w) for w in closed]
    warmup_windows = len({(w.window, w.start_ns) for w in closed if w.warmup})
    instrumented_windows = len({(w.window, w.start_ns) for w in closed if w.instrumented})

    # per phase and per channel key: windows that count (not warm-up, measured steps only)
    acc: dict[str, dict[str, list[WindowEnergy]]] = defaultdict(lambda: defaultdict(list))
    skipped_err = 0
    for w in closed:
        if w.warmup or w.instrumented:
            continue
        if w.step_index is not None and w.step_index not in measured:
            skipped_err += 1
            continue
        for phase in _phase_of(w.window):
            acc[phase][w.channel.key].append(w)
    if skipped_err:
        notes.append(f"{skipped_err} window readings of failed steps left out of the summaries")

    def tokens_for(phase: str) -> tuple[int | None, int | None]:
        if phase in ("session", "steps", "encode", "prefill", "decode", SERVED_WINDOW):
            return out_tokens, in_tokens
        if phase.startswith("step:"):
            s = measured.get(int(phase.split(":", 1)[1]))
            if s is None:
                return None, None
            return sum(s.output_tokens or []), sum(s.input_tokens or [])
        return None, None

    per_phase: dict[str, dict[str, PhaseEnergy]] = {}
    for phase, by_key in acc.items():
        per_phase[phase] = {}
        for key, ws in by_key.items():
            vals = [w.energy_j for w in ws]
            e = None if any(v is None for v in vals) else float(sum(v for v in vals if v is not None))
            dur = sum(w.duration_s for w in ws)
            ot, it = tokens_for(phase)
            weak, why = _aggregate_confidence(ws[0].channel, dur, len(ws), e)
            per_phase[phase][key] = PhaseEnergy(
                energy_j=e, duration_s=dur, power_w=(e / dur if e is not None and dur > 0 else None),
                windows=len(ws), output_tokens=ot, input_tokens=it,
                j_per_output_token=(e / ot if e is not None and ot else None),
                j_per_input_token=(e / it if e is not None and it else None),
                low_confidence_windows=sum(1 for w in ws if w.low_confidence), low_confidence=weak,
                confidence_note=why, method=ws[0].channel.method)

    energy_j = {k: v.energy_j for k, v in per_phase.get("session", {}).items()}
    steps_energy_j = {k: v.energy_j for k, v in per_phase.get("steps", {}).items()}
    j_per_tok: dict[str, float] = {}
    tok_per_j: dict[str, float] = {}
    for k, e in steps_energy_j.items():
        if e is not None and out_tokens:
            j_per_tok[k] = e / out_tokens
            if e > 0:
                tok_per_j[k] = out_tokens / e

    co2 = None
    detail = None
    r = col.cc_reading
    if r is not None:
        key = f"codecarbon:{r.tracking_mode}"
        windows.append(EnergyWindow(window="session", source="codecarbon", scope=r.tracking_mode, device="host",
                                    device_name=r.cpu_mode and f"cpu mode {r.cpu_mode}", energy_j=r.energy_j,
                                    duration_s=r.duration_s,
                                    power_w=r.energy_j / r.duration_s if r.duration_s > 0 else None,
                                    method="estimated", co2_kg=r.co2_kg))
        energy_j[key] = r.energy_j
        per_phase.setdefault("session", {})[key] = PhaseEnergy(
            energy_j=r.energy_j, duration_s=r.duration_s,
            power_w=r.energy_j / r.duration_s if r.duration_s > 0 else None, windows=1,
            output_tokens=out_tokens, input_tokens=in_tokens,
            j_per_output_token=r.energy_j / out_tokens if out_tokens else None,
            j_per_input_token=r.energy_j / in_tokens if in_tokens else None, method="estimated")
        if out_tokens:
            j_per_tok[key] = r.energy_j / out_tokens
            if r.energy_j > 0:
                tok_per_j[key] = out_tokens / r.energy_j
        co2 = r.co2_kg
        detail = CodeCarbonDetail(energy_j=r.energy_j, cpu_energy_j=r.cpu_energy_j, gpu_energy_j=r.gpu_energy_j,
                                  ram_energy_j=r.ram_energy_j, co2_kg=r.co2_kg, duration_s=r.duration_s,
                                  country_iso_code=r.country_iso_code, region=r.region, cpu_mode=r.cpu_mode,
                                  tracking_mode=r.tracking_mode)
        notes.append("codecarbon covers the session window only (it samples every "
                     f"{col.cfg.codecarbon.measure_power_secs:g} s and cannot see single steps); its joules per "
                     "output token divide the whole session, idle time and warm-up included")

    measured_keys = sorted({w.channel.key for w in closed
                            if w.channel.source in MEASURING and w.channel.scope in NON_OVERLAPPING})

    def measured_sum(phase: str) -> float | None:
        vals = [per_phase.get(phase, {}).get(k) for k in measured_keys]
        if not measured_keys or any(v is None or v.energy_j is None for v in vals):
            return None
        return float(sum(v.energy_j for v in vals if v is not None and v.energy_j is not None))

    m_session, m_steps = measured_sum("session"), measured_sum("steps")
    per_phase_jpt: dict[str, float | None] = {}
    for phase in ("session", "steps", "encode", "prefill", "decode"):
        if phase in per_phase and measured_keys:
            e = measured_sum(phase)
            short = [pe for k in measured_keys if (pe := per_phase[phase].get(k)) is not None and pe.low_confidence]
            if short and e is not None:
                notes.append(f"{phase} J per output token left out: {short[0].confidence_note} (the counter difference "
                             "is kept with the phase's energy; more or longer steps give a figure)")
                e = None
            per_phase_jpt[phase] = e / out_tokens if e is not None and out_tokens else None
    if measured_keys and m_steps is None and steps_energy_j:
        notes.append("a counter reading failed in some step window: the headline per-token figure is left out")
    headline = m_steps
    if "steps" in per_phase and per_phase_jpt.get("steps") is None and m_steps is not None:
        headline = None  # the steps' windows are too short for the counter (noted above)

    measuring = [s for s in col.statuses if s.name in MEASURING and s.available]
    status: Literal["ok", "unavailable"] = "ok" if measuring else "unavailable"
    reasons = [f"{s.name}: {s.reason}" for s in col.statuses if not s.available]
    if status == "unavailable":
        notes.append("no measuring source (nvml, rapl) here: no measured energy; codecarbon/estimated rows, if any, "
                     "are models, labeled method=estimated")
    if not out_tokens:
        notes.append("no output tokens in measured steps: no per-token figures")
    return EnergyResult(status=status, reasons=reasons, sources=col.statuses, windows=windows, energy_j=energy_j,
                        steps_energy_j=steps_energy_j, output_tokens=out_tokens, measured_keys=measured_keys,
                        measured_energy_j=m_session, measured_steps_energy_j=m_steps,
                        j_per_output_token=headline / out_tokens if headline is not None and out_tokens else None,
                        output_tokens_per_j=out_tokens / headline if headline and out_tokens else None,
                        j_per_output_token_per_phase=per_phase_jpt,
                        j_per_output_token_by_source=j_per_tok, output_tokens_per_j_by_source=tok_per_j,
                        per_phase=per_phase, co2_kg=co2, codecarbon=detail,
                        warmup_windows=warmup_windows, instrumented_windows=instrumented_windows,
                        edge_reads=meter.edge_reads if meter else 0, notes=notes)


# -- report -----------------------------------------------------------------------------------


def _html_table(headers: list[str], rows: list[list[Any]], caption: str = "", cls: str = "") -> str:
    from perfsdk.collector import html_table

    return html_table(headers, rows, cls, caption)


def _phase_order(phase: str) -> tuple[int, str]:
    order = {"session": 0, "steps": 1, "encode": 2, "prefill": 3, "decode": 4, "forward": 5}
    return (order.get(phase, 6), phase)


def energy_report_html(result: EnergyResult) -> str:
    """The energy section of the HTML report: headline figures, sources, energy per phase and
    channel, CodeCarbon's estimate and the notes, as tables."""
    parts: list[str] = []
    headline: list[list[Any]] = [["status", result.status]]
    if result.measured_keys:
        headline += [["measured channels", ", ".join(result.measured_keys)],
                     ["session energy (J)", result.measured_energy_j],
                     ["energy of timed steps (J)", result.measured_steps_energy_j]]
    headline += [["output tokens (timed steps)", result.output_tokens],
                 ["J per output token", result.j_per_output_token],
                 ["output tokens per J", result.output_tokens_per_j]]
    for phase in ("encode", "prefill", "decode"):
        if phase in result.j_per_output_token_per_phase:
            headline.append([f"{phase} J per output token", result.j_per_output_token_per_phase[phase]])
    if result.codecarbon is not None:
        headline.append(["CO2 (CodeCarbon estimate, g)", result.codecarbon.co2_kg * 1e3])
    parts.append(_html_table(["figure", "value"], headline, "Measured energy", "kv"))

    parts.append(_html_table(["source", "available", "reason"],
                             [[s.name, s.available, s.reason] for s in result.sources], "Sources", "kv"))

    rows: list[list[Any]] = []
    for phase in sorted((p for p in result.per_phase if not p.startswith("step:")), key=_phase_order):
        for key, pe in sorted(result.per_phase[phase].items()):
            rows.append([phase, key, pe.method, pe.energy_j, pe.duration_s, pe.power_w, pe.output_tokens,
                         pe.j_per_output_token, pe.windows, pe.low_confidence_windows])
    if rows:
        parts.append(_html_table(["window", "channel", "method", "energy J", "duration s", "power W",
                                  "output tokens", "J / output token", "windows", "low-confidence windows"],
                                 rows, "Energy per window kind and channel (warm-up excluded)"))
    steps = sorted((p for p in result.per_phase if p.startswith("step:")), key=lambda p: int(p.split(":", 1)[1]))
    if steps:
        keys = sorted({k for p in steps for k in result.per_phase[p]})
        step_rows: list[list[Any]] = []
        for p in steps:
            by_key = result.per_phase[p]
            step_rows.append([p.split(":", 1)[1]] + [by_key[k].energy_j if k in by_key else None for k in keys])
        parts.append(_html_table(["step"] + [f"{k} J" for k in keys], step_rows, "Energy per timed step"))

    cc = result.codecarbon
    if cc is not None:
        parts.append(_html_table(["figure", "value"], [
            ["energy J", cc.energy_j], ["CPU J", cc.cpu_energy_j], ["GPU J", cc.gpu_energy_j],
            ["RAM J", cc.ram_energy_j], ["CO2 g", cc.co2_kg * 1e3], ["duration s", cc.duration_s],
            ["country", cc.country_iso_code], ["region", cc.region], ["CPU mode", cc.cpu_mode],
            ["tracking mode", cc.tracking_mode]], "CodeCarbon (estimate, session window)", "kv"))
    notes = ([f"unavailable: {r}" for r in result.reasons] if result.status == "unavailable" else []) + result.notes
    if notes:
        parts.append("<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(parts)


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(EnergyCollector)

"""Window accounting: counters read at window edges, power samples integrated per window.

The meter reads every counter source at each window edge. Edges that share a timestamp (a step
and its prefill open together; prefill closes exactly when decode opens) share one reading, so
nested windows add up exactly: ``prefill + decode == step``, and the session is the sum of its
steps plus the gaps between them. Power-sampled channels (``integrated``/``estimated``) are
sampled by the shared sampler thread and at every edge, and integrated with the trapezoid rule.

An edge inside a timed step (the switch from prefill to decode) is read on a helper thread when a
source reads slowly (``slow_reads``: NVML), so the generation it interrupts goes on at once: an
NVML read takes milliseconds on some machines, and NVML's counter refreshes every ~100 ms, so
reading a few ms after the edge changes nothing that can be seen. Fast sources (RAPL's sysfs
files) are read in place. The next edge read in the caller's thread waits for it, keeping readings in order.
"""

from __future__ import annotations

import bisect
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from perfsdk.energy.base import Channel, EnergySource


@dataclass
class WindowEnergy:
    """Energy of one window on one channel."""

    window: str
    channel: Channel
    start_ns: int
    end_ns: int
    energy_j: float | None
    samples: int = 0
    warmup: bool = False
    step_index: int | None = None
    instrumented: bool = False
    note: str | None = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def power_w(self) -> float | None:
        if self.energy_j is None or self.duration_s <= 0:
            return None
        return self.energy_j / self.duration_s

    @property
    def low_confidence(self) -> bool:
        """Shorter than the channel's update period, integrated from under two samples, or a
        counter whose reading inside the window failed (``note`` says what)."""
        if self.note is not None or self.duration_s < self.channel.update_period_s:
            return True
        return self.channel.method != "counter" and self.samples < 2


class PowerTrace:
    """Time-ordered (t_ns, watts) samples of one channel, integrable over any interval."""

    def __init__(self) -> None:
        self.t: list[int] = []
        self.w: list[float] = []

    def add(self, t_ns: int, watts: float) -> None:
        i = bisect.bisect_right(self.t, t_ns)
        self.t.insert(i, t_ns)
        self.w.insert(i, float(watts))

    def _at(self, t_ns: int) -> float:
        """Power at ``t_ns``: linear between neighbours, held flat beyond the ends."""
        i = bisect.bisect_left(self.t, t_ns)
        if i < len(self.t) and self.t[i] == t_ns:
            return self.w[i]
        if i == 0:
            return self.w[0]
        if i == len(self.t):
            return self.w[-1]
        t0, t1, w0, w1 = self.t[i - 1], self.t[i], self.w[i - 1], self.w[i]
        return w0 + (w1 - w0) * (t_ns - t0) / (t1 - t0)

    def energy_j(self, start_ns: int, end_ns: int) -> tuple[float | None, int]:
        """Trapezoid integral over [start, end] and the number of samples inside it."""
        if not self.t:
            return None, 0
        lo = bisect.bisect_left(self.t, start_ns)
        hi = bisect.bisect_right(self.t, end_ns)
        pts = [(start_ns, self._at(start_ns))]
        pts += [(self.t[k], self.w[k]) for k in range(lo, hi) if start_ns < self.t[k] < end_ns]
        pts.append((end_ns, self._at(end_ns)))
        e = 0.0
        for (ta, wa), (tb, wb) in zip(pts, pts[1:]):
            e += (wa + wb) / 2 * (tb - ta) / 1e9
        return e, hi - lo


class EnergyMeter:
    """Reads sources at window edges and turns each closed window into :class:`WindowEnergy`."""

    def __init__(self, sources: list[EnergySource]) -> None:
        self.sources = [s for s in sources if s.available]
        self._owner: dict[Channel, EnergySource] = {c: s for s in self.sources for c in s.channels}
        self.counter_channels = [c for s in self.sources for c in s.channels if c.method == "counter"]
        self.power_channels = [c for s in self.sources for c in s.channels if c.method != "counter"]
        self.traces: dict[Channel, PowerTrace] = {c: PowerTrace() for c in self.power_channels}
        self._lock = threading.Lock()
        self._last_edge: tuple[int, Any] | None = None
        self._open: dict[int, tuple[str, int, Any, bool, int | None, bool]] = {}
        # closed windows in order: rows, or a window whose edge readings are still being taken
        self._closed: list[list[WindowEnergy] | tuple[Any, ...]] = []
        self._helper: ThreadPoolExecutor | None = None
        self._defer_inner = any(s.slow_reads for s in self.sources)
        self._pending: Future | None = None
        self.edge_reads = 0

    @property
    def wants_power_samples(self) -> bool:
        return bool(self.power_channels)

    def sample_power(self, t_ns: int) -> None:
        """Add one power sample per power channel (the sampler probe; also called at edges)."""
        for src in self.sources:
            if not src.wants_power_samples:
                continue
            for ch, w in src.read_power().items():
                if w is not None:
                    with self._lock:
                        self.traces[ch].add(t_ns, w)

    def _read(self, t_ns: int) -> dict[Channel, Any]:
        readings: dict[Channel, Any] = {}
        for src in self.sources:
            readings.update(src.read_counters())
        self.edge_reads += 1
        if self.power_channels:
            self.sample_power(t_ns)
        return readings

    def edge(self, t_ns: int, defer: bool = False) -> Any:
        """Counter readings at ``t_ns`` (read once per distinct timestamp). With ``defer`` and a
        slow source, the reading is taken on the helper thread and a
        :class:`~concurrent.futures.Future` of it is returned."""
        if self._last_edge is not None and self._last_edge[0] == t_ns:
            return self._last_edge[1]
        readings: Any
        if defer and self._defer_inner:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perfsdk-energy-edge")
            readings = self._pending = self._helper.submit(self._read, t_ns)
        else:
            self._wait_pending()
            readings = self._read(t_ns)
        self._last_edge = (t_ns, readings)
        return readings

    def _wait_pending(self) -> None:
        if self._pending is not None:
            try:
                self._pending.result()
            except Exception:
                pass  # the windows that share this reading report it missing
            self._pending = None

    def open(self, token: int, name: str, t_ns: int, warmup: bool = False, step_index: int | None = None,
             instrumented: bool = False, defer: bool = False) -> None:
        """Start window ``name`` (``token`` identifies this instance, e.g. ``id(window)``);
        ``defer``: the edge is inside a timed step (read on the helper thread)."""
        self._open[token] = (name, t_ns, self.edge(t_ns, defer), warmup, step_index, instrumented)

    def close(self, token: int, t_ns: int, defer: bool = False) -> list[WindowEnergy]:
        """End a window: one :class:`WindowEnergy` per channel (``energy_j=None`` if missing).
        A window with an edge read on the helper thread returns nothing yet: its rows are in
        :attr:`closed` once the reading is in."""
        opened = self._open.pop(token, None)
        if opened is None:
            return []
        name, t0, start, warmup, step_index, instrumented = opened
        end = self.edge(t_ns, defer)
        if isinstance(start, Future) or isinstance(end, Future):
            self._closed.append((name, t0, t_ns, start, end, warmup, step_index, instrumented))
            return []
        out = self._rows(name, t0, t_ns, start, end, warmup, step_index, instrumented)
        self._closed.append(out)
        return out

    @property
    def closed(self) -> list[WindowEnergy]:
        """Every closed window's rows, in closing order (waits for readings still being taken)."""
        rows: list[WindowEnergy] = []
        for i, item in enumerate(self._closed):
            if isinstance(item, tuple):
                name, t0, t1, start, end, warmup, step_index, instrumented = item
                item = self._closed[i] = self._rows(name, t0, t1, _resolved(start), _resolved(end), warmup,
                                                    step_index, instrumented)
            rows.extend(item)
        return rows

    def _rows(self, name: str, t0: int, t_ns: int, start: dict[Channel, Any], end: dict[Channel, Any], warmup: bool,
              step_index: int | None, instrumented: bool) -> list[WindowEnergy]:
        out = []
        for ch in self.counter_channels:
            src = self._owner[ch]
            e = src.delta_j(ch, start.get(ch), end.get(ch))
            note = src.window_note(ch, start.get(ch), end.get(ch))
            out.append(WindowEnergy(name, ch, t0, t_ns, e, 2 if e is not None else 0, warmup, step_index,
                                    instrumented, note))
        for ch in self.power_channels:
            with self._lock:
                e, n = self.traces[ch].energy_j(t0, t_ns)
            out.append(WindowEnergy(name, ch, t0, t_ns, e, n, warmup, step_index, instrumented))
        return out

    def close_all(self) -> None:
        self._wait_pending()
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None
        for src in self.sources:
            try:
                src.close()
            except Exception:
                pass


def _resolved(readings: Any) -> dict[Channel, Any]:
    """A reading taken on the helper thread, or ``{}`` (every channel missing) if it failed."""
    if isinstance(readings, Future):
        try:
            return readings.result()
        except Exception:
            return {}
    return readings

"""Window accounting: counters read at window edges, power samples integrated per window.

The meter reads every counter source at each window edge. Edges that share a timestamp (a step
and its prefill open together; prefill closes exactly when decode opens) share one reading, so
nested windows add up exactly: ``prefill + decode == step``, and the session is the sum of its
steps plus the gaps between them. Power-sampled channels (``integrated``/``estimated``) are
sampled by the shared sampler thread and at every edge, and integrated with the trapezoid rule.
"""

from __future__ import annotations

import bisect
import threading
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
        self._last_edge: tuple[int, dict[Channel, Any]] | None = None
        self._open: dict[int, tuple[str, int, dict[Channel, Any], bool, int | None, bool]] = {}
        self.closed: list[WindowEnergy] = []
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

    def edge(self, t_ns: int) -> dict[Channel, Any]:
        """Counter readings at ``t_ns`` (read once per distinct timestamp)."""
        if self._last_edge is not None and self._last_edge[0] == t_ns:
            return self._last_edge[1]
        readings: dict[Channel, Any] = {}
        for src in self.sources:
            readings.update(src.read_counters())
        self.edge_reads += 1
        if self.power_channels:
            self.sample_power(t_ns)
        self._last_edge = (t_ns, readings)
        return readings

    def open(self, token: int, name: str, t_ns: int, warmup: bool = False, step_index: int | None = None,
             instrumented: bool = False) -> None:
        """Start window ``name`` (``token`` identifies this instance, e.g. ``id(window)``)."""
        self._open[token] = (name, t_ns, self.edge(t_ns), warmup, step_index, instrumented)

    def close(self, token: int, t_ns: int) -> list[WindowEnergy]:
        """End a window: one :class:`WindowEnergy` per channel (``energy_j=None`` if missing)."""
        opened = self._open.pop(token, None)
        if opened is None:
            return []
        name, t0, start, warmup, step_index, instrumented = opened
        end = self.edge(t_ns)
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
        self.closed.extend(out)
        return out

    def close_all(self) -> None:
        for src in self.sources:
            try:
                src.close()
            except Exception:
                pass

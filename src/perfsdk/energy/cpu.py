"""Whole-system CPU busy fraction from ``psutil.cpu_times`` deltas.

``psutil.cpu_percent(interval=None)`` keeps one module-wide baseline, so two callers (this
SDK and, say, CodeCarbon) reset each other's. Each :class:`SystemCpu` keeps its own.
"""

from __future__ import annotations

from typing import Any


class SystemCpu:
    """System-wide CPU % since the previous call (primed on construction)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._last = psutil.cpu_times()

    @staticmethod
    def _busy_total(t: Any) -> tuple[float, float]:
        total = sum(t)
        idle = getattr(t, "idle", 0.0) + getattr(t, "iowait", 0.0)
        return total - idle, total

    def percent(self) -> float | None:
        """Busy % of all CPUs since the last call; ``None`` if no time elapsed."""
        now = self._psutil.cpu_times()
        b0, t0 = self._busy_total(self._last)
        b1, t1 = self._busy_total(now)
        self._last = now
        if t1 <= t0:
            return None
        return max(0.0, min(100.0, 100.0 * (b1 - b0) / (t1 - t0)))

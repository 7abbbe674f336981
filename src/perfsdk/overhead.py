"""Time spent inside plugin hooks, and a warning for hooks that blow their budget.

A hook on the measured path (``perfsdk_before_generate``, ``perfsdk_after_generate``,
``perfsdk_window_open``/``close``, ``perfsdk_tokenize``) that takes long perturbs what is
measured; a window-open hook even runs inside the window it opens. The session times every
hook call; calls slower than ``PERFSDK_HOOK_BUDGET_S`` (default 0.05 s) on the measured path are
logged as a warning, and the totals are stored in the run under
``environment.extra.hook_time`` (per ``collector.hook``: calls, total_s, max_s, over_budget).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("perfsdk.overhead")

#: Hooks that run between or inside measured windows.
MEASURED_PATH_HOOKS = frozenset({
    "perfsdk_before_generate", "perfsdk_after_generate", "perfsdk_window_open", "perfsdk_window_close",
    "perfsdk_tokenize",
})
DEFAULT_BUDGET_S = 0.05


def budget_s() -> float:
    """Per-call budget for measured-path hooks (``PERFSDK_HOOK_BUDGET_S``)."""
    from perfsdk.envflags import number

    return number("PERFSDK_HOOK_BUDGET_S", DEFAULT_BUDGET_S)


@dataclass
class _Entry:
    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0
    over_budget: int = 0


class HookTimes:
    """Per (plugin, hook) call count, total and maximum time."""

    def __init__(self, budget: float | None = None) -> None:
        self.budget_ns = int((budget_s() if budget is None else budget) * 1e9)
        self.entries: dict[tuple[str, str], _Entry] = {}

    def add(self, owner: str, hook: str, dt_ns: int, measured: bool = True) -> None:
        """Count one call; ``measured=False`` (an instrumented step) is never over budget."""
        e = self.entries.get((owner, hook))
        if e is None:
            e = self.entries[(owner, hook)] = _Entry()
        e.calls += 1
        e.total_ns += dt_ns
        if dt_ns > e.max_ns:
            e.max_ns = dt_ns
        if measured and hook in MEASURED_PATH_HOOKS and dt_ns > self.budget_ns:
            e.over_budget += 1
            if e.over_budget == 1:
                log.warning("slow hook perturbs the measurement", plugin=owner, hook=hook,
                            took_s=round(dt_ns / 1e9, 4), budget_s=self.budget_ns / 1e9)

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{"collector.hook": {calls, total_s, max_s, over_budget}}``, slowest total first."""
        items = sorted(self.entries.items(), key=lambda kv: -kv[1].total_ns)
        return {f"{o}.{h}": {"calls": e.calls, "total_s": e.total_ns / 1e9, "max_s": e.max_ns / 1e9,
                             "over_budget": e.over_budget} for (o, h), e in items}

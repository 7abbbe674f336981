"""What every energy source looks like to the window accounting.

A source is a small backend behind a narrow reading seam. It reports one or more *channels*
(``source``, ``scope``, ``device``, ``method``) and either

- cumulative **counters** (``read_counters``): a raw reading per channel, turned into joules
  by ``delta_j`` (which knows the unit and the wraparound), or
- instantaneous **power** (``read_power``): watts per channel, sampled on the session's shared
  sampler and integrated over each window (labeled ``integrated`` or ``estimated``).

A reading that failed is ``None`` — missing, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Method = Literal["counter", "integrated", "estimated"]


@dataclass(frozen=True)
class Channel:
    """One energy stream: who measures (``source``), what (``scope``), where (``device``), how.

    ``update_period_s`` is how often the underlying value refreshes; windows shorter than it
    are flagged low-confidence.
    """

    source: str
    scope: str
    device: str
    method: Method
    device_name: str | None = None
    update_period_s: float = 0.0

    @property
    def key(self) -> str:
        """``source:scope`` (plus ``:device`` for per-device scopes such as GPUs)."""
        if self.scope == "gpu":
            return f"{self.source}:{self.scope}:{self.device}"
        return f"{self.source}:{self.scope}"


class EnergySource:
    """Base class for the counter and power sources the energy collector reads.

    ``open()`` returns ``(available, reason)``; after a successful open, ``channels`` lists
    what the source measures. ``close()`` releases handles and is idempotent.
    """

    name: str = ""
    #: reads take long enough (milliseconds) to be moved off a timed step: an edge inside one is
    #: then read on the meter's helper thread (:class:`~perfsdk.energy.windows.EnergyMeter`)
    slow_reads: bool = False

    def __init__(self) -> None:
        self.channels: list[Channel] = []
        self.available = False
        self.reason = "not opened"

    def open(self) -> tuple[bool, str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        """Release handles; safe to call twice."""

    def read_counters(self) -> dict[Channel, Any]:
        """Raw cumulative readings per counter channel (``None`` = failed read)."""
        return {}

    def delta_j(self, channel: Channel, start: Any, end: Any) -> float | None:
        """Joules between two raw readings of ``channel``; ``None`` if either is missing."""
        return None

    def window_note(self, channel: Channel, start: Any, end: Any) -> str | None:
        """Why a window between two raw readings is low-confidence although both were read
        (e.g. a failed read between them); ``None`` when nothing is wrong."""
        return None

    def poll_interval_s(self) -> float | None:
        """How often the shared sampler must read the counters so that none wraps unseen;
        ``None`` for counters that do not wrap in practice."""
        return None

    def poll(self, t_ns: int) -> None:
        """Read the counters once from the sampler thread (see :meth:`poll_interval_s`)."""

    def read_power(self) -> dict[Channel, float | None]:
        """Instantaneous watts per power channel (``None`` = failed read)."""
        return {}

    @property
    def wants_power_samples(self) -> bool:
        """True when some channel is integrated from power samples."""
        return any(c.method != "counter" for c in self.channels)

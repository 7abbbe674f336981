"""The roofline model: attainable throughput from arithmetic intensity.

Time of one operation on one device is bounded below by its compute time (FLOPs over achievable
FLOP/s) and by its memory time (bytes over achievable bandwidth); whichever is larger is the
bound. The ridge point is the arithmetic intensity (FLOPs per byte) where both are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from perfsdk.hardware.profile import HardwareProfile

Bound = Literal["compute", "memory", "transfer", "overhead"]


@dataclass(frozen=True)
class RooflinePoint:
    """Compute and memory time of an operation on a device, and which one binds."""

    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> Bound:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def ridge_point(profile: HardwareProfile, dtype: str) -> float:
    """FLOPs per byte above which an operation is compute-bound on ``profile``."""
    return profile.effective_flops(dtype) / profile.effective_bandwidth_bytes_per_s


def attainable_flops(profile: HardwareProfile, dtype: str, intensity_flops_per_byte: float) -> float:
    """Achievable FLOP/s at an arithmetic intensity: ``min(peak, intensity * bandwidth)``."""
    return min(profile.effective_flops(dtype), intensity_flops_per_byte * profile.effective_bandwidth_bytes_per_s)


def roofline(flops: float, bytes_moved: float, profile: HardwareProfile, dtype: str) -> RooflinePoint:
    """Compute and memory time for ``flops`` and ``bytes_moved`` on ``profile``."""
    compute_s = flops / profile.effective_flops(dtype) if flops else 0.0
    memory_s = bytes_moved / profile.effective_bandwidth_bytes_per_s if bytes_moved else 0.0
    return RooflinePoint(compute_s=compute_s, memory_s=memory_s)

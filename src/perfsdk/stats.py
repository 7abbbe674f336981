"""Summary statistics used by every collector."""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

#: Below this many samples a percentile is an extrapolation; it is flagged.
MIN_SAMPLES_FOR_P99 = 100
MIN_SAMPLES_FOR_P90 = 10


class Stats(BaseModel):
    """count, mean, std (sample), min, p50, p90, p95, p99, max of a list of values.

    ``low_sample_count`` is true when there are too few samples for the tail percentiles to
    mean much (fewer than 10 for p90/p95, fewer than 100 for p99).
    """

    model_config = ConfigDict(frozen=True)

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    low_sample_count: bool = True


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of pre-sorted values."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summarize(values: Iterable[float]) -> Stats:
    """Compute :class:`Stats`; an empty input gives ``count=0`` and ``None`` everywhere."""
    vals = sorted(float(v) for v in values)
    n = len(vals)
    if n == 0:
        return Stats()
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return Stats(
        count=n,
        mean=mean,
        std=std,
        min=vals[0],
        p50=percentile(vals, 50),
        p90=percentile(vals, 90),
        p95=percentile(vals, 95),
        p99=percentile(vals, 99),
        max=vals[-1],
        low_sample_count=n < MIN_SAMPLES_FOR_P99,
    )

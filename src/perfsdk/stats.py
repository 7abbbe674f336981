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


def rms(values: Iterable[float]) -> float:
    """Root mean square (about zero, not the mean) of ``values``, e.g. of relative differences."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("rms of an empty list")
    return math.sqrt(sum(v * v for v in vals) / len(vals))


def weighted_median(values: Iterable[float], weights: Iterable[float]) -> float:
    """The value at which the cumulative weight of ``values``, sorted, first reaches half the
    total (the lower weighted median; zero and negative weights count as none)."""
    pairs = sorted((float(v), max(0.0, float(w))) for v, w in zip(values, weights))
    total = sum(w for _, w in pairs)
    if not pairs or not total > 0:
        raise ValueError("weighted median of no positive weight")
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= total / 2.0:
            return v
    return pairs[-1][0]


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


def _normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_greater(x: list[float], y: list[float]) -> float | None:
    """One-sided p-value that ``x`` tends to be larger than ``y`` (Mann-Whitney U, normal
    approximation with tie and continuity corrections); None with fewer than 3 values a side."""
    n1, n2 = len(x), len(y)
    if n1 < 3 or n2 < 3:
        return None
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        r = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[k] = r
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return _normal_sf(z)


def proportion_greater(k1: int, n1: int, k2: int, n2: int) -> float | None:
    """One-sided p-value that the rate k1/n1 is larger than k2/n2 (two-proportion z test,
    pooled); None when either sample is empty."""
    if n1 == 0 or n2 == 0:
        return None
    p = (k1 + k2) / (n1 + n2)
    if p in (0.0, 1.0):
        return 1.0 if k1 / n1 <= k2 / n2 else 0.0
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    return _normal_sf((k1 / n1 - k2 / n2) / se)


def mann_kendall_increasing(values: list[float]) -> float | None:
    """One-sided p-value of an increasing trend over ``values`` in their order (Mann-Kendall,
    normal approximation with continuity correction); None with fewer than 8 values."""
    n = len(values)
    if n < 8:
        return None
    s = 0
    for i in range(n - 1):
        vi = values[i]
        for j in range(i + 1, n):
            d = values[j] - vi
            s += (d > 0) - (d < 0)
    var = n * (n - 1) * (2 * n + 5) / 18.0
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    return _normal_sf(z)

"""Compare runs (or sweeps point by point): relative change with a bootstrap confidence interval.

Samples are per request (the latency collector's ``requests`` series: ``ttft_s``, ``tpot_s``,
``e2e_s``), or per step for throughput (output tokens of the step over its duration). Runs
stored without the ``requests`` series fall back to the ``token_times`` series, one sample per
step. The change of a statistic (mean by default) from A to B is bootstrapped: both sample sets
are resampled with replacement, the relative change computed each time, and the 2.5/97.5
percentiles give a 95 % interval. A change is significant when the interval excludes zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from perfsdk.exporters.flatten import run_row
from perfsdk.schemas import RunResult
from perfsdk.store import Store, StoreError

#: Metrics with per-request (or per-step) samples, and whether lower is better.
SAMPLED_METRICS: dict[str, bool] = {"ttft_s": True, "tpot_s": True, "e2e_s": True, "output_tokens_per_s": False}
DEFAULT_METRICS = ("ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s")
Stat = Literal["mean", "p50", "p90", "p95", "p99"]


class CompareError(ValueError):
    """Unknown ids, or nothing to compare."""


def _stat_fn(stat: str) -> Any:
    if stat == "mean":
        return lambda a, axis=-1: np.mean(a, axis=axis)
    if stat.startswith("p") and stat[1:].isdigit():
        q = float(stat[1:])
        return lambda a, axis=-1: np.percentile(a, q, axis=axis)
    raise CompareError(f"unknown statistic {stat!r}; use mean, p50, p90, p95 or p99")


def bootstrap_change(a: Sequence[float], b: Sequence[float], *, stat: str = "mean", n_boot: int = 2000,
                     seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """Relative change (B − A) / A of ``stat``, with a bootstrap ``confidence`` interval.

    Returns ``(change, ci_low, ci_high)`` as fractions (0.1 = +10 %).
    """
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    if xa.size == 0 or xb.size == 0:
        raise CompareError("bootstrap needs samples on both sides")
    f = _stat_fn(stat)
    base = float(f(xa))
    if base == 0:
        raise CompareError("baseline statistic is zero: relative change undefined")
    change = float(f(xb)) / base - 1.0
    rng = np.random.default_rng(seed)
    changes = np.empty(n_boot)
    chunk = max(1, min(n_boot, 2_000_000 // max(xa.size, xb.size)))  # bounded memory for large sets
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        sa = xa[rng.integers(0, xa.size, size=(k, xa.size))]
        sb = xb[rng.integers(0, xb.size, size=(k, xb.size))]
        changes[start:start + k] = f(sb, axis=1) / f(sa, axis=1) - 1.0
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(changes, [alpha, 1 - alpha])
    return change, float(lo), float(hi)


@dataclass
class MetricComparison:
    """One metric of one candidate against the baseline."""

    metric: str
    baseline: str
    candidate: str
    baseline_value: float | None
    candidate_value: float | None
    change: float | None  # relative, (B - A) / A
    ci_low: float | None
    ci_high: float | None
    significant: bool | None
    lower_is_better: bool | None
    samples: tuple[int, int] | None = None
    point: str | None = None

    @property
    def slowdown(self) -> float | None:
        """How much worse B is (positive = worse), as a fraction; ``None`` when direction is unknown."""
        if self.change is None or self.lower_is_better is None:
            return None
        return self.change if self.lower_is_better else -self.change

    @property
    def verdict(self) -> str:
        if self.change is None:
            return "n/a"
        if self.significant is None:
            return "no samples"
        if not self.significant:
            return "same (noise)"
        return "slower" if (self.slowdown or 0) > 0 else "faster"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict
        d["slowdown"] = self.slowdown
        return d


def samples_for(store: Store, run: RunResult, metric: str) -> list[float] | None:
    """Per-request (per-step for throughput) samples of ``metric``, or ``None`` if none stored."""
    if metric not in SAMPLED_METRICS:
        return None
    if "requests" in run.series:
        rows = store.read_series(run.run_id, "requests")
        if metric == "output_tokens_per_s":
            steps: dict[Any, list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                steps[r["step"]].append(r)
            out = []
            for reqs in steps.values():
                dur = max(r["e2e_s"] for r in reqs)
                if dur > 0:
                    out.append(sum(r["output_tokens"] for r in reqs) / dur)
            return out or None
        vals = [float(r[metric]) for r in rows if r.get(metric) is not None]
        return vals or None
    if "token_times" in run.series:  # older runs: one sample per step (the batch's slowest request)
        by_step: dict[Any, list[float]] = defaultdict(list)
        for r in store.read_series(run.run_id, "token_times"):
            by_step[r["step"]].append(float(r["t_s"]))
        out = []
        for ts in by_step.values():
            ts.sort()
            if metric == "ttft_s":
                out.append(ts[0])
            elif metric == "e2e_s":
                out.append(ts[-1])
            elif metric == "tpot_s" and len(ts) > 1:
                out.append((ts[-1] - ts[0]) / (len(ts) - 1))
        return out or None
    return None


def _scalar(row: dict[str, Any], metric: str, stat: str) -> float | None:
    key = metric
    if metric in SAMPLED_METRICS and metric != "output_tokens_per_s":
        key = f"collectors.latency.{metric}.{stat}"
    elif metric == "output_tokens_per_s":
        key = "collectors.latency.output_tokens_per_s"
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        return None
    return float(v)


def _lower_is_better(metric: str) -> bool | None:
    if metric in SAMPLED_METRICS:
        return SAMPLED_METRICS[metric]
    last = metric.rsplit(".", 2)
    name = ".".join(last[-2:])
    if "per_s" in name or "accuracy" in name or "exact_match" in name or "f1" in name or "mfu" in name:
        return False
    if any(u in name for u in ("_s", "_bytes", "_j", "_w", "perplexity")):
        return True
    return None


def compare_runs(store: Store, baseline: RunResult, candidate: RunResult, metrics: Sequence[str] = DEFAULT_METRICS,
                 *, stat: str = "mean", n_boot: int = 2000, seed: int = 0, point: str | None = None) -> list[MetricComparison]:
    """Compare ``candidate`` with ``baseline`` on every metric."""
    ra, rb = run_row(baseline), run_row(candidate)
    out = []
    for m in metrics:
        sa, sb = samples_for(store, baseline, m), samples_for(store, candidate, m)
        lib = _lower_is_better(m)
        if sa and sb:
            f = _stat_fn(stat)
            va, vb = float(f(np.asarray(sa))), float(f(np.asarray(sb)))
            if m == "output_tokens_per_s":  # the headline throughput is tokens / wall time
                va = _scalar(ra, m, stat) or va
                vb = _scalar(rb, m, stat) or vb
            try:
                change, lo, hi = bootstrap_change(sa, sb, stat=stat, n_boot=n_boot, seed=seed)
            except CompareError:
                out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb, None, None, None, None, lib,
                                            (len(sa), len(sb)), point))
                continue
            out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb, change, lo, hi,
                                        not (lo <= 0 <= hi), lib, (len(sa), len(sb)), point))
        else:
            va, vb = _scalar(ra, m, stat), _scalar(rb, m, stat)
            change = (vb / va - 1.0) if va not in (None, 0) and vb is not None else None
            out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb, change, None, None, None, lib,
                                        None, point))
    return out


def resolve(store: Store, ident: str) -> tuple[str, list[RunResult]]:
    """A run id or a sweep id -> ("run" | "sweep", runs). Sweep runs: finished ones only."""
    try:
        return "run", [store.get(ident)]
    except StoreError:
        pass
    runs = store.list_runs(tags={"sweep_id": ident}) if store.runs_dir.is_dir() else []
    if runs:
        return "sweep", [r for r in runs if r.status in ("ok", "partial")]
    raise CompareError(f"{ident}: no run or sweep with this id in {store.root}")


def compare(store: Store, ids: Sequence[str], metrics: Sequence[str] = DEFAULT_METRICS, *, stat: str = "mean",
            n_boot: int = 2000, seed: int = 0) -> list[MetricComparison]:
    """Compare every id after the first with the first. Runs compare directly; sweeps compare
    point by point (points matched by their axis values)."""
    if len(ids) < 2:
        raise CompareError("compare needs at least two ids")
    resolved = [resolve(store, i) for i in ids]
    kinds = {k for k, _ in resolved}
    if len(kinds) > 1:
        raise CompareError("compare either runs or sweeps, not a mix")
    out: list[MetricComparison] = []
    base_kind, base_runs = resolved[0]
    if base_kind == "run":
        for _, runs in resolved[1:]:
            out += compare_runs(store, base_runs[0], runs[0], metrics, stat=stat, n_boot=n_boot, seed=seed)
        return out
    base_by_point = _latest_by_point(base_runs)
    for _, runs in resolved[1:]:
        for pid, run in sorted(_latest_by_point(runs).items()):
            if pid in base_by_point:
                out += compare_runs(store, base_by_point[pid], run, metrics, stat=stat, n_boot=n_boot, seed=seed,
                                    point=_point_label(run))
    if not out:
        raise CompareError("the sweeps have no points in common (same axis values)")
    return out


def _latest_by_point(runs: list[RunResult]) -> dict[str, RunResult]:
    by: dict[str, RunResult] = {}
    for r in sorted(runs, key=lambda r: r.run_id):
        by[r.tags.get("sweep_point", r.run_id)] = r
    return by


def _point_label(run: RunResult) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in run.tags.items() if k not in ("sweep_id", "sweep_point"))


def slower_than(results: Sequence[MetricComparison], threshold: float) -> list[MetricComparison]:
    """Comparisons where B is significantly worse than A by more than ``threshold`` (a fraction):
    the estimated slowdown exceeds it and the 95 % interval excludes zero."""
    return [c for c in results if c.significant and c.slowdown is not None and c.slowdown > threshold]


def parse_threshold(text: str) -> float:
    """``5%`` -> 0.05; ``0.05`` -> 0.05."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise CompareError(f"--fail-if-slower {text!r}: expected a percentage like 5% or a fraction like 0.05") from None

"""Compare runs (or sweeps point by point): relative change with a bootstrap confidence interval.

Samples are per request (the latency collector's ``requests`` series: ``ttft_s``, ``tpot_s``,
``e2e_s``), or per step for throughput (output tokens of the step over its duration). The
requests of one batch share their prefill and are not independent, so the bootstrap resamples
whole steps (a cluster bootstrap); a side with fewer than two steps gets no significance. Runs
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
from perfsdk.store import RunNotFound, Store, StoreError

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


class TooFewSamples(CompareError):
    """Fewer than two independent samples (steps) on one side: no interval can be given."""


Samples = Sequence[float] | Sequence[Sequence[float]]


def _clusters(x: Samples) -> list[np.ndarray]:
    if len(x) and isinstance(x[0], (list, tuple, np.ndarray)):
        return [np.asarray(c, dtype=float) for c in x if len(c)]  # type: ignore[arg-type]
    return [np.asarray([v], dtype=float) for v in x]  # type: ignore[list-item]


def bootstrap_change(a: Samples, b: Samples, *, stat: str = "mean", n_boot: int = 2000,
                     seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """Relative change (B − A) / A of ``stat``, with a bootstrap ``confidence`` interval.

    ``a`` and ``b`` are flat lists of independent samples, or lists of groups (e.g. the requests
    of one batch, which share a prefill and are not independent): groups are resampled whole
    (a cluster bootstrap) and the statistic is taken over the pooled values. Returns
    ``(change, ci_low, ci_high)`` as fractions (0.1 = +10 %). Fewer than two samples or groups
    on a side raises :class:`TooFewSamples`.
    """
    ca, cb = _clusters(a), _clusters(b)
    if len(ca) < 2 or len(cb) < 2:
        raise TooFewSamples(f"need at least two independent samples per side (have {len(ca)} and {len(cb)})")
    f = _stat_fn(stat)
    xa, xb = np.concatenate(ca), np.concatenate(cb)
    base = float(f(xa))
    if base == 0:
        raise CompareError("baseline statistic is zero: relative change undefined")
    change = float(f(xb)) / base - 1.0
    rng = np.random.default_rng(seed)
    flat = all(c.size == 1 for c in ca) and all(c.size == 1 for c in cb)
    if flat or stat == "mean":
        changes = np.empty(n_boot)
        sums_a, cnt_a = np.array([c.sum() for c in ca]), np.array([c.size for c in ca])
        sums_b, cnt_b = np.array([c.sum() for c in cb]), np.array([c.size for c in cb])
        chunk = max(1, min(n_boot, 2_000_000 // max(len(ca), len(cb))))  # bounded memory for large sets
        for start in range(0, n_boot, chunk):
            k = min(chunk, n_boot - start)
            ia = rng.integers(0, len(ca), size=(k, len(ca)))
            ib = rng.integers(0, len(cb), size=(k, len(cb)))
            if stat == "mean":
                sa = sums_a[ia].sum(axis=1) / cnt_a[ia].sum(axis=1)
                sb = sums_b[ib].sum(axis=1) / cnt_b[ib].sum(axis=1)
            else:
                sa, sb = f(sums_a[ia], axis=1), f(sums_b[ib], axis=1)
            changes[start:start + k] = sb / sa - 1.0
    else:  # percentiles of pooled groups: one resample at a time
        changes = np.empty(n_boot)
        for k in range(n_boot):
            ra = np.concatenate([ca[i] for i in rng.integers(0, len(ca), size=len(ca))])
            rb = np.concatenate([cb[i] for i in rng.integers(0, len(cb), size=len(cb))])
            changes[k] = float(f(rb)) / float(f(ra)) - 1.0
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
    note: str | None = None

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
            return self.note or "no samples"
        if not self.significant:
            return "same (noise)"
        return "slower" if (self.slowdown or 0) > 0 else "faster"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict
        d["slowdown"] = self.slowdown
        return d


def grouped_samples_for(store: Store, run: RunResult, metric: str) -> list[list[float]] | None:
    """Samples of ``metric`` grouped by step (the requests of one batch), or ``None``.

    Per request from the ``requests`` series; throughput is one sample per step (its output
    tokens over its duration). Runs without that series fall back to ``token_times``: one
    sample per step (the batch's slowest request).
    """
    if metric not in SAMPLED_METRICS:
        return None
    if "requests" in run.series:
        steps: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for r in store.read_series(run.run_id, "requests"):
            steps[r["step"]].append(r)
        groups: list[list[float]] = []
        for reqs in steps.values():
            if metric == "output_tokens_per_s":
                dur = max(r["e2e_s"] for r in reqs)
                if dur > 0:
                    groups.append([sum(r["output_tokens"] for r in reqs) / dur])
            else:
                vals = [float(r[metric]) for r in reqs if r.get(metric) is not None]
                if vals:
                    groups.append(vals)
        return groups or None
    if "token_times" in run.series:
        by_step: dict[Any, list[float]] = defaultdict(list)
        for r in store.read_series(run.run_id, "token_times"):
            by_step[r["step"]].append(float(r["t_s"]))
        groups = []
        for ts in by_step.values():
            ts.sort()
            if metric == "ttft_s":
                groups.append([ts[0]])
            elif metric == "e2e_s":
                groups.append([ts[-1]])
            elif metric == "tpot_s" and len(ts) > 1:
                groups.append([(ts[-1] - ts[0]) / (len(ts) - 1)])
        return groups or None
    return None


def samples_for(store: Store, run: RunResult, metric: str) -> list[float] | None:
    """:func:`grouped_samples_for`, pooled into one list."""
    groups = grouped_samples_for(store, run, metric)
    return [v for g in groups for v in g] if groups else None


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
        va: float | None
        vb: float | None
        change: float | None
        ga, gb = grouped_samples_for(store, baseline, m), grouped_samples_for(store, candidate, m)
        lib = _lower_is_better(m)
        if ga and gb:
            sa, sb = [v for g in ga for v in g], [v for g in gb for v in g]
            f = _stat_fn(stat)
            va, vb = float(f(np.asarray(sa))), float(f(np.asarray(sb)))
            if m == "output_tokens_per_s":  # the headline throughput is tokens / wall time
                va = _scalar(ra, m, stat) or va
                vb = _scalar(rb, m, stat) or vb
            try:
                change, lo, hi = bootstrap_change(ga, gb, stat=stat, n_boot=n_boot, seed=seed)
            except TooFewSamples:
                out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb,
                                            vb / va - 1.0 if va else None, None, None, None, lib, (len(sa), len(sb)),
                                            point, note="too few steps"))
                continue
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
    except RunNotFound:
        pass
    except StoreError as err:  # a damaged run is named as damaged, not as unknown
        raise CompareError(str(err)) from None
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

"""Compare runs (or sweeps point by point): relative change with a bootstrap confidence interval.

Sampled metrics come from the collectors that declare them (``Collector.compare_metrics``; the
latency collector gives ``ttft_s``, ``tpot_s``, ``e2e_s`` per request and ``output_tokens_per_s``
per step), grouped by step: the requests of one batch share their prefill and are not
independent, so the bootstrap resamples whole steps (a cluster bootstrap); a side with fewer
than two steps gets no significance. Any other metric is a flattened result field compared
without an interval. The change of a statistic (mean by default) from A to B is bootstrapped: both sample sets
are resampled with replacement, the relative change computed each time, and the 2.5/97.5
percentiles give a 95 % interval. A change is significant when the interval excludes zero.

Each figure has one estimator: the values shown, the change and its interval all come from the
same samples and statistic (``MetricComparison.estimator`` says which), so the change is always
``candidate / baseline - 1``. Throughput compared this way is the mean of per-step rates, not
the run's tokens over its wall time that the run summary shows; the output says so.
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

def sampled_metrics() -> dict[str, tuple[Any, bool]]:
    """Metric -> (owning collector class, lower is better), from the installed collectors."""
    from perfsdk.plugins import installed_registry, ordered_collectors

    reg = installed_registry()
    out: dict[str, tuple[Any, bool]] = {}
    for name in ordered_collectors(reg.collectors, reg):
        cls = reg.collectors[name]
        for metric, lower in cls.compare_metrics().items():
            out.setdefault(metric, (cls, lower))
    return out


def default_metrics() -> list[str]:
    """Every sampled metric of the installed collectors (latency's four first)."""
    return list(sampled_metrics())


#: The built-in latency collector's metrics, compared when none are named.
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
    baseline_verdict: str | None = None  # the runs' validity verdicts (None: stored before verdicts)
    candidate_verdict: str | None = None
    #: Where the values, the change and the interval all come from: ``per-request samples``,
    #: ``per-step samples`` (the statistic of the samples, bootstrapped) or ``run totals``
    #: (each run's stored figure, no interval).
    estimator: str | None = None

    @property
    def judged(self) -> bool:
        """False when either run is ``invalid``: such a comparison passes no judgement."""
        return "invalid" not in (self.baseline_verdict, self.candidate_verdict)

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
        d["judged"] = self.judged
        return d


def grouped_samples_for(store: Store, run: RunResult, metric: str) -> list[list[float]] | None:
    """Samples of ``metric`` grouped by step, from the collector that declares it, or ``None``."""
    owner = sampled_metrics().get(metric)
    if owner is None:
        return None
    if run._store_root is None:
        run._store_root = str(store.root)
    return owner[0].metric_samples(run, metric)


def samples_for(store: Store, run: RunResult, metric: str) -> list[float] | None:
    """:func:`grouped_samples_for`, pooled into one list."""
    groups = grouped_samples_for(store, run, metric)
    return [v for g in groups for v in g] if groups else None


def _scalar(run: RunResult, row: dict[str, Any], metric: str, stat: str) -> float | None:
    owner = sampled_metrics().get(metric)
    if owner is not None:
        res = owner[0].result_of(run)
        v = owner[0].metric_value(res, metric, stat) if res is not None else None
    else:
        v = row.get(metric)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        return None
    return float(v)


def _lower_is_better(metric: str) -> bool | None:
    owner = sampled_metrics().get(metric)
    if owner is not None:
        return owner[1]
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
    out = _compare_runs(store, baseline, candidate, metrics, stat=stat, n_boot=n_boot, seed=seed, point=point)
    va, vb = verdict_of(baseline), verdict_of(candidate)
    for c in out:
        c.baseline_verdict, c.candidate_verdict = va, vb
    return out


def verdict_of(run: RunResult) -> str | None:
    """The run's validity verdict, ``None`` for runs stored before verdicts existed."""
    return run.validity.verdict if run.validity is not None else None


def validity_notes(runs: Sequence[RunResult]) -> list[str]:
    """One line per run that is not ``valid``: its verdict and reasons."""
    out = []
    for r in runs:
        if r.validity is None:
            out.append(f"{r.run_id}: no validity verdict (stored before runs had one)")
        elif r.validity.verdict != "valid":
            out.append(f"{r.run_id} is {r.validity.verdict}: " + ("; ".join(r.validity.reasons) or "-"))
    return out


def _compare_runs(store: Store, baseline: RunResult, candidate: RunResult, metrics: Sequence[str],
                  *, stat: str, n_boot: int, seed: int, point: str | None) -> list[MetricComparison]:
    ra, rb = run_row(baseline), run_row(candidate)
    out = []
    for m in metrics:
        va: float | None
        vb: float | None
        change: float | None
        ga, gb = grouped_samples_for(store, baseline, m), grouped_samples_for(store, candidate, m)
        lib = _lower_is_better(m)
        if ga and gb:
            # values, change and interval: one estimator, the statistic of these samples (a
            # collector's headline figure, e.g. throughput as tokens / wall time, is another one)
            sa, sb = [v for g in ga for v in g], [v for g in gb for v in g]
            f = _stat_fn(stat)
            va, vb = float(f(np.asarray(sa))), float(f(np.asarray(sb)))
            est = _estimator(ga, gb)
            try:
                change, lo, hi = bootstrap_change(ga, gb, stat=stat, n_boot=n_boot, seed=seed)
            except TooFewSamples:
                out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb,
                                            vb / va - 1.0 if va else None, None, None, None, lib, (len(sa), len(sb)),
                                            point, note="too few steps", estimator=est))
                continue
            except CompareError:
                out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb, None, None, None, None, lib,
                                            (len(sa), len(sb)), point, estimator=est))
                continue
            out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb, change, lo, hi,
                                        not (lo <= 0 <= hi), lib, (len(sa), len(sb)), point, estimator=est))
        else:
            va, vb = _scalar(baseline, ra, m, stat), _scalar(candidate, rb, m, stat)
            change = (vb / va - 1.0) if va not in (None, 0) and vb is not None else None
            out.append(MetricComparison(m, baseline.run_id, candidate.run_id, va, vb, change, None, None, None, lib,
                                        None, point, estimator=RUN_TOTAL))
    return out


#: How a compared figure is estimated (``MetricComparison.estimator``).
PER_REQUEST = "per-request samples"
PER_STEP = "per-step samples"
RUN_TOTAL = "run totals"


def _estimator(ga: list[list[float]], gb: list[list[float]]) -> str:
    """Samples of one value per step (throughput: the step's tokens over its duration) or several
    (one per request of the step)."""
    return PER_STEP if all(len(g) == 1 for g in ga + gb) else PER_REQUEST


def estimator_notes(results: Sequence[MetricComparison], stat: str = "mean") -> list[str]:
    """One line per estimator used: which metrics it gives, and how the values were formed."""
    by: dict[str, list[str]] = defaultdict(list)
    for c in results:
        if c.estimator and c.metric not in by[c.estimator]:
            by[c.estimator].append(c.metric)
    how = {PER_REQUEST: f"{stat} of the per-request samples, steps resampled whole",
           PER_STEP: f"{stat} of one sample per step (a rate is each step's own, not the run's total over "
                     "its wall time)",
           RUN_TOTAL: "the figure stored with each run; no samples, no interval"}
    return [f"{est}: {', '.join(ms)}: {how[est]}" for est, ms in by.items()]


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
    point by point (points matched by their axis values).

    ``metrics`` are resolved against what the runs contain (see :mod:`perfsdk.metric_names`):
    ``gencount.output_tokens`` is ``collectors.gencount.output_tokens``; an unknown or
    ambiguous name raises :class:`CompareError`.
    """
    if len(ids) < 2:
        raise CompareError("compare needs at least two ids")
    resolved = [resolve(store, i) for i in ids]
    kinds = {k for k, _ in resolved}
    if len(kinds) > 1:
        raise CompareError("compare either runs or sweeps, not a mix")
    metrics = resolve_metric_names(metrics, [r for _, runs in resolved for r in runs])
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


def resolve_metric_names(metrics: Sequence[str], runs: Sequence[RunResult]) -> list[str]:
    """``metrics`` as sampled metric names or full result columns of ``runs``."""
    from perfsdk.metric_names import MetricNameError, resolve_metrics

    try:
        return resolve_metrics(metrics, runs)
    except MetricNameError as err:
        raise CompareError(str(err)) from None


def unjudgeable(results: Sequence[MetricComparison]) -> list[MetricComparison]:
    """Comparisons a ``--fail-if-slower`` gate cannot judge although both runs may be judged:
    no value, no samples or too few steps, so no interval. A gate over them must not pass."""
    return [c for c in results if c.judged and c.significant is None]


def _latest_by_point(runs: list[RunResult]) -> dict[str, RunResult]:
    by: dict[str, RunResult] = {}
    for r in sorted(runs, key=lambda r: r.run_id):
        by[r.tags.get("sweep_point", r.run_id)] = r
    return by


def _point_label(run: RunResult) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in run.tags.items() if k not in ("sweep_id", "sweep_point"))


def slower_than(results: Sequence[MetricComparison], threshold: float) -> list[MetricComparison]:
    """Comparisons where B is significantly worse than A by more than ``threshold`` (a fraction):
    the estimated slowdown exceeds it and the 95 % interval excludes zero. Comparisons with an
    ``invalid`` run are never judged (see :attr:`MetricComparison.judged`)."""
    return [c for c in results if c.judged and c.significant and c.slowdown is not None and c.slowdown > threshold]


def parse_threshold(text: str) -> float:
    """``5%`` -> 0.05; ``0.05`` -> 0.05."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise CompareError(f"--fail-if-slower {text!r}: expected a percentage like 5% or a fraction like 0.05") from None

"""Capacity: a served model swept from a low load up through saturation (``workload.load:
{mode: sweep}``).

Rate sweeps (``sweep: rate``, the default):

1. **Saturation.** ``max_rate_per_s`` when given; else a short burst — a closed loop of
   ``probe_concurrency`` users over ``num_prompts`` requests — and its achieved requests/s.
2. **Levels.** ``steps`` offered rates evenly from 10 % to 130 % of saturation, lowest first,
   each a full measured point: an open-loop run at that rate (arrivals as ``load.arrival``),
   stored as an ordinary run tagged ``sweep_id`` and ``sweep_point``.
3. **Stopping.** After each point above the lowest, two one-sided tests at level ``alpha``:
   - *latency diverges*: within the point, the TTFT from the scheduled send rises with the send
     order (Mann-Kendall trend test over all its requests) and the median of the last third is at
     least 1.5 times that of the first third: the server's queue grew while the point ran, so
     the offered rate is above what it holds (a burst of Poisson arrivals raises a few requests'
     latency, not the trend of the whole point);
   - *errors diverge*: the point's error rate is larger than the lowest level's (two-proportion
     z test).
   The sweep stops after the first point where either holds (that point is kept and marked).
4. **Results.** The throughput–latency curve; the **knee** — the level farthest below the
   chord from the first to the last point of (offered rate, p50 e2e latency from schedule),
   both scaled to [0, 1] (where latency starts to climb); and the **SLO-limited rate** — the
   highest level before divergence whose p99 TTFT, TPOT and e2e (from the scheduled send) meet
   ``workload.slo``, measured ``repeats`` more times, with the spread of those measurements.

Concurrency sweeps (``sweep: concurrency``) double the users from 1 (1, 2, 4, …) up to
``4 × probe_concurrency``, and stop when a level's achieved requests/s is not larger than the
previous level's by the same one-sided test on the requests' completion gaps; the same knee
and SLO limit follow.

The sweep's manifest (``<store>/sweeps/<sweep_id>.json``, ``kind: load``) lists the points;
``perfsdk report`` draws the curves.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field

from perfsdk.stats import mann_kendall_increasing, mann_whitney_greater, proportion_greater

LATENCY_RATIO = 1.5


class LoadPoint(BaseModel):
    """One measured level of a load sweep."""

    level: float = Field(description="offered requests/s (rate sweeps) or users (concurrency sweeps)")
    run_id: str
    status: str
    repeat: int = 0
    achieved_rate_per_s: float | None = None
    output_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    goodput: float | None = None
    goodput_share: float | None = None
    errors: int = 0
    requests: int = 0
    verdict: str | None = None
    diverged: str | None = None
    meets_slo: bool | None = None


def _p(values: list[float], q: float) -> float | None:
    from perfsdk.stats import summarize

    st = summarize(values)
    return getattr(st, f"p{q}") if st.count else None


def point_of(session: Any, level: float, repeat: int = 0) -> tuple[LoadPoint, list[Any]]:
    """A point from a finished session's result and its requests (in send order)."""
    from perfsdk.collectors.latency import LatencyCollector

    res = session.result
    lat = LatencyCollector.result_of(res)
    served = sorted((s for s in session.steps if s.served is not None and not s.warmup),
                    key=lambda s: s.served.scheduled_ns)
    ok = [s for s in served if s.error is None and s.token_times_ns]
    ttft = [(s.token_times_ns[0] - s.served.scheduled_ns) / 1e9 for s in ok]
    e2e = [(s.token_times_ns[-1] - s.served.scheduled_ns) / 1e9 for s in ok]
    tpot = [(s.token_times_ns[-1] - s.token_times_ns[0]) / 1e9 / (s.output_tokens[0] - 1)
            for s in ok if s.output_tokens and s.output_tokens[0] > 1]
    pt = LoadPoint(level=level, run_id=res.run_id, status=res.status, repeat=repeat,
                   achieved_rate_per_s=lat.requests_per_s if lat else None,
                   output_tokens_per_s=lat.output_tokens_per_s if lat else None,
                   ttft_p50_s=_p(ttft, 50), ttft_p99_s=_p(ttft, 99), tpot_p50_s=_p(tpot, 50), tpot_p99_s=_p(tpot, 99),
                   e2e_p50_s=_p(e2e, 50), e2e_p99_s=_p(e2e, 99), goodput=lat.goodput if lat else None,
                   goodput_share=lat.goodput_share if lat else None, errors=lat.errors if lat else 0,
                   requests=len(served), verdict=res.validity.verdict if res.validity else None)
    return pt, served


def latency_diverges(served: list[Any], alpha: float) -> str | None:
    """``latency diverges: …`` when the queue grew within the point (see the module doc)."""
    ttft = [(s.token_times_ns[0] - s.served.scheduled_ns) / 1e9 for s in served
            if s.error is None and s.token_times_ns]
    k = len(ttft) // 3
    if k < 3:
        return None
    first, last = ttft[:k], ttft[-k:]
    p = mann_kendall_increasing(ttft)
    m1, m3 = statistics.median(first), statistics.median(last)
    if p is not None and p < alpha and m3 >= LATENCY_RATIO * m1:
        return (f"latency diverges: TTFT from schedule rose from {m1 * 1e3:.1f} ms (first third) to "
                f"{m3 * 1e3:.1f} ms (last third) within the point (p = {p:.2g})")
    return None


def errors_diverge(pt: LoadPoint, base: LoadPoint, alpha: float) -> str | None:
    """``errors diverge: …`` when the point fails significantly more often than the lowest level."""
    if pt.errors == 0:
        return None
    p = proportion_greater(pt.errors, max(pt.requests, 1), base.errors, max(base.requests, 1))
    if p is not None and p < alpha:
        return f"errors diverge: {pt.errors} of {pt.requests} requests failed (lowest level {base.errors}, p = {p:.2g})"
    return None


def knee_index(points: list[LoadPoint]) -> int | None:
    """The knee of (level, p50 e2e from schedule): the point farthest below the chord, both
    scaled to [0, 1]; None with fewer than 3 points."""
    pts = [(p.level, p.e2e_p50_s) for p in points if p.e2e_p50_s is not None]
    if len(pts) < 3:
        return None
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    diffs = [(x - min(xs)) / dx - (y - min(ys)) / dy for x, y in pts]
    best = max(range(len(diffs)), key=lambda i: diffs[i])
    return best if diffs[best] > 0 else None


def meets_slo(pt: LoadPoint, slo: Any) -> bool | None:
    """Whether a point's p99 latencies (from the scheduled send) meet every objective."""
    if slo is None:
        return None
    for limit, value in ((slo.ttft_s, pt.ttft_p99_s), (slo.tpot_s, pt.tpot_p99_s), (slo.e2e_s, pt.e2e_p99_s)):
        if limit is not None and (value is None or value > limit):
            return False
    return pt.errors == 0


class LoadSweep:
    """Runs a load sweep for a config whose ``workload.load.mode`` is ``sweep``."""

    def __init__(self, config: Any, store: str, progress: Callable[[str], None] | None = None) -> None:
        from perfsdk.session import new_run_id

        self.config = config
        self.store = store
        self.load = config.workload.load
        self.sweep_id = f"{config.name}-load-{new_run_id()}"
        self.progress = progress or (lambda _msg: None)
        self.points: list[LoadPoint] = []
        self.repeats: list[LoadPoint] = []
        self.saturation: float | None = None
        self.probe_run: str | None = None
        self.stopped: str | None = None
        self.created_at = datetime.now(timezone.utc).isoformat()

    def _run(self, load: dict[str, Any], tag: str, progress: Callable[[int, int], None] | None = None) -> Any:
        import perfsdk
        from perfsdk.models.runner import run_workload

        base = {k: v for k, v in self.load.model_dump().items()
                if k in ("arrival", "gamma_cv", "max_concurrency", "duration_s", "client_processes")}
        workload = self.config.workload.model_copy(update={"load": type(self.load)(**{**base, **load})})
        tags = {**self.config.tags, "sweep_id": self.sweep_id, "sweep_point": tag}
        cfg = self.config.model_copy(update={"workload": workload, "tags": tags})
        with perfsdk.session(cfg, store=self.store) as s:
            run_workload(s, progress=progress)
        return s

    def _saturation(self) -> float:
        if self.load.max_rate_per_s:
            return float(self.load.max_rate_per_s)
        self.progress(f"saturation burst: {self.load.probe_concurrency} users")
        s = self._run({"mode": "concurrency", "concurrency": self.load.probe_concurrency}, "probe")
        from perfsdk.collectors.latency import LatencyCollector

        self.probe_run = s.result.run_id
        lat = LatencyCollector.result_of(s.result)
        rate = lat.requests_per_s if lat is not None else None
        if not rate:
            raise RuntimeError("the saturation burst measured no request: is the server answering?")
        return float(rate)

    def levels(self) -> list[float]:
        if self.load.sweep == "concurrency":
            out, c = [], 1
            while c <= 4 * self.load.probe_concurrency:
                out.append(float(c))
                c *= 2
            return out
        assert self.saturation is not None
        n = self.load.steps
        return [round(self.saturation * (0.1 + 1.2 * i / (n - 1)), 4) for i in range(n)]

    def _point(self, level: float, repeat: int = 0) -> tuple[LoadPoint, list[Any]]:
        if self.load.sweep == "concurrency":
            load = {"mode": "concurrency", "concurrency": int(level)}
            tag = f"users-{int(level)}"
        else:
            load = {"mode": "rate", "rate_per_s": level}
            tag = f"rate-{level:g}"
        s = self._run(load, tag + (f"-repeat-{repeat}" if repeat else ""))
        return point_of(s, level, repeat)

    def _concurrency_stalls(self, pt: LoadPoint, served: list[Any], prev: tuple[LoadPoint, list[Any]] | None) -> str | None:
        if prev is None:
            return None
        gaps = _completion_gaps(served)
        prev_gaps = _completion_gaps(prev[1])
        p = mann_whitney_greater(prev_gaps, gaps)  # shorter gaps now = more throughput
        if p is None or p >= self.load.alpha:
            return (f"throughput saturates: {pt.achieved_rate_per_s or 0:.3g} requests/s with {int(pt.level)} users is "
                    f"not significantly more than {prev[0].achieved_rate_per_s or 0:.3g} with {int(prev[0].level)}")
        return None

    def run(self) -> dict[str, Any]:
        """Run the sweep (stores every point); returns its manifest."""
        from perfsdk.experiments.sweep.manifest import write_manifest
        from perfsdk.store import Store

        alpha = self.load.alpha
        slo = self.config.workload.slo
        if self.load.sweep == "rate":
            self.saturation = self._saturation()
        prev: tuple[LoadPoint, list[Any]] | None = None
        self.status = "running"
        for level in self.levels():
            self.progress(f"level {level:g}")
            pt, served = self._point(level)
            if not self.points:  # the lowest level is the baseline of the tests
                why = None
            elif self.load.sweep == "rate":
                why = latency_diverges(served, alpha)
            else:
                why = self._concurrency_stalls(pt, served, prev)
            why = why or (errors_diverge(pt, self.points[0], alpha) if self.points else None)
            pt.diverged = why
            pt.meets_slo = meets_slo(pt, slo)
            self.points.append(pt)
            write_manifest(Store(self.store), self.sweep_id, self.manifest())
            prev = (pt, served)
            if why:
                self.stopped = why
                break
        limit = self.slo_limit_index()
        if limit is not None and self.load.repeats:
            level = self.points[limit].level
            for r in range(1, self.load.repeats + 1):
                self.progress(f"repeat {r} of level {level:g}")
                pt, _ = self._point(level, r)
                pt.meets_slo = meets_slo(pt, slo)
                self.repeats.append(pt)
        self.status = "finished"
        write_manifest(Store(self.store), self.sweep_id, self.manifest())
        return self.manifest()

    def slo_limit_index(self) -> int | None:
        """The highest level before divergence that met every SLO."""
        best = None
        for i, p in enumerate(self.points):
            if p.diverged:
                break
            if p.meets_slo:
                best = i
        return best

    def manifest(self) -> dict[str, Any]:
        limit = self.slo_limit_index()
        knee = knee_index(self.points)
        slo = self.config.workload.slo
        limit_info = None
        if limit is not None:
            pts = [self.points[limit], *self.repeats]
            p99 = [p.ttft_p99_s for p in pts if p.ttft_p99_s is not None]
            good = [p.goodput for p in pts if p.goodput is not None]
            limit_info = {"level": self.points[limit].level, "measurements": len(pts),
                          "met": sum(1 for p in pts if p.meets_slo),
                          "ttft_p99_s": {"min": min(p99), "max": max(p99)} if p99 else None,
                          "goodput": {"min": min(good), "max": max(good)} if good else None,
                          "runs": [p.run_id for p in pts]}
        return {
            "kind": "load", "sweep_id": self.sweep_id, "name": self.config.name,
            "status": getattr(self, "status", "running"), "created_at": self.created_at,
            "updated_at": datetime.now(timezone.utc).isoformat(), "sweep": self.load.sweep,
            "arrival": self.load.arrival, "saturation_rate_per_s": self.saturation, "probe_run": self.probe_run,
            "slo": slo.model_dump() if slo is not None else None, "alpha": self.load.alpha,
            "points": [p.model_dump() for p in self.points], "repeats": [p.model_dump() for p in self.repeats],
            "knee": self.points[knee].level if knee is not None else None,
            "slo_limit": limit_info, "stopped": self.stopped,
        }


def _completion_gaps(served: list[Any]) -> list[float]:
    ends = sorted(s.end_ns for s in served if s.error is None and s.end_ns is not None)
    return [(b - a) / 1e9 for a, b in zip(ends, ends[1:])]


def print_load_sweep(manifest: dict[str, Any], console: Any) -> None:
    """The table of points and the sweep's findings."""
    from rich.table import Table

    from perfsdk.fmt import fmt_num

    rate = manifest["sweep"] == "rate"
    t = Table(title=f"Load sweep {manifest['sweep_id']}", show_edge=False)
    cols = ["offered/s" if rate else "users", "achieved/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
            "goodput/s", "errors", "mark"]
    for c in cols:
        t.add_column(c, justify="right" if c != "mark" else "left")
    limit = (manifest.get("slo_limit") or {}).get("level")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    for p in manifest["points"]:
        marks = []
        if p["level"] == manifest.get("knee"):
            marks.append("knee")
        if p["level"] == limit:
            marks.append("SLO limit")
        if p["diverged"]:
            marks.append("diverged")
        t.add_row(fmt_num(p["level"]), fmt_num(p["achieved_rate_per_s"]), ms(p["ttft_p50_s"]), ms(p["ttft_p99_s"]),
                  ms(p["tpot_p50_s"]), fmt_num(p["goodput"]), str(p["errors"]), ", ".join(marks))
    console.print(t)
    if manifest.get("saturation_rate_per_s"):
        console.print(f"saturation (burst of {manifest.get('probe_run') and 'probe run ' + manifest['probe_run'] or 'given'}): "
                      f"{fmt_num(manifest['saturation_rate_per_s'])} requests/s")
    if manifest.get("stopped"):
        console.print(f"stopped: {manifest['stopped']}")
    lim = manifest.get("slo_limit")
    if manifest.get("slo") is None:
        console.print("SLO-limited rate: no workload.slo set")
    elif lim is None:
        console.print("SLO-limited rate: no level met every objective")
    else:
        spread = lim.get("ttft_p99_s")
        console.print(f"SLO-limited {'rate' if rate else 'users'}: {fmt_num(lim['level'])} "
                      f"(met in {lim['met']} of {lim['measurements']} measurements"
                      + (f"; TTFT p99 {spread['min'] * 1e3:.1f}–{spread['max'] * 1e3:.1f} ms" if spread else "") + ")")
    if manifest.get("knee") is not None:
        console.print(f"knee: {fmt_num(manifest['knee'])} {'requests/s offered' if rate else 'users'}")

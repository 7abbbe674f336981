"""Latency and throughput: TTFT, TPOT, ITL, e2e, prefill, decode, load and tokenize times.

Definitions (per request, on the session clock; warm-up steps excluded):

- TTFT = step start -> first generated position ready (encode and prefill).
- e2e = step start -> this request's last real token ready (EOS included, padding excluded).
- TPOT = (e2e - TTFT) / (output tokens - 1), for requests with at least 2 tokens.
- ITL = every gap between consecutive tokens of a request, pooled over requests.
- encode = step start -> end of the encoder / vision or audio tower and projector, for models
  that have one (:mod:`perfsdk.models.encode`); prefill = TTFT - encode (TTFT when there is no
  encode phase); decode = e2e - TTFT.
- vision tokens = the real number of vision (or audio) tokens each request got, read from the
  features the tower and projector produced (not from the placeholder tokens in the prompt).
- Throughput = tokens / wall time of the timed steps (first timed start -> last timed end,
  less the time of any instrumented step inside that span), not tokens / mean latency.

Steps that a collector instrumented (``step.instrumented_by``: FLOPs counting, forward hooks,
the profiler) are left out of every figure and counted in ``instrumented_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult, RankShare, ReportFigure, ReportSection, html_table
from perfsdk.events import Step
from perfsdk.plugins import hookimpl
from perfsdk.series import BoundedSeries
from perfsdk.stats import Stats, summarize


class LatencyConfig(CollectorConfig):
    """Settings of the latency collector."""

    store_token_times: bool = Field(default=True, description="store per-token timestamps as a time series")


class LatencyResult(CollectorResult):
    """Latency statistics (seconds) and throughput over wall time."""

    ttft_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    encode_s: Stats = Field(default_factory=Stats,
                            description="encoder / vision or audio tower and projector, per request; "
                            "count 0 for models without one")
    prefill_s: Stats
    decode_s: Stats
    forward_s: Stats
    step_s: Stats
    load_s: float | None = None
    tokenize_s: Stats
    stages: dict[str, Stats] = Field(default_factory=dict)
    output_tokens_per_s: float | None = None
    total_tokens_per_s: float | None = None
    input_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    vision_tokens: int = Field(default=0, description="real vision (or audio) tokens over the measured requests")
    vision_tokens_per_request: Stats = Field(default_factory=Stats)
    steps: int = 0
    warmup_steps: int = 0
    instrumented_steps: int = Field(default=0, description="Steps instrumented by a collector, left out of every figure.")
    failed_steps: int = 0
    eos_stopped_requests: int = 0
    wall_s: float | None = None
    busy_s: float | None = None
    # -- requests to a served model (zero / empty for in-process runs) --
    ttft_from_scheduled_s: Stats = Field(
        default_factory=Stats, description="served: scheduled send -> first token (client queueing included)")
    e2e_from_scheduled_s: Stats = Field(default_factory=Stats, description="served: scheduled send -> last token")
    queue_s: Stats = Field(default_factory=Stats, description="served: scheduled send -> actual send, per request")
    errors: int = Field(default=0, description="served: measured requests that failed (timeouts, HTTP errors, "
                                               "malformed events, dropped connections)")
    error_rate: float | None = Field(default=None, description="served: failed / sent measured requests")
    first_error: str | None = None
    goodput: float | None = Field(
        default=None, description="requests per second that met every objective of workload.slo (over the same "
                                  "wall time as requests_per_s)")
    goodput_share: float | None = Field(default=None, description="share of measured requests that met every SLO")
    slo: dict[str, float] = Field(default_factory=dict)
    concurrency_max: int | None = Field(default=None, description="served: requests in flight at most")
    concurrency_mean: float | None = Field(
        default=None, description="served: requests in flight on average (request time over wall time)")
    client_send_lag_s: Stats = Field(default_factory=Stats, description="served: each send's lag behind its schedule")
    client_loop_lag_s: Stats = Field(default_factory=Stats, description="served: the client's event-loop delay")
    client_cpu_s_per_token: float | None = Field(
        default=None, description="served: the client process's CPU time over the measured requests per streamed token")
    token_source: str | None = Field(
        default=None, description="served: where output token counts came from: usage, tokenizer, chunks or mixed")
    multi_token_chunks: int = Field(default=0, description="served: stream events that carried several tokens")
    usage_mismatches: int = Field(
        default=0, description="served: requests whose usage count differs from the tokens counted in the stream")


def request_latencies(step: Step) -> list[dict[str, Any]]:
    """Per-request TTFT/e2e/TPOT/ITLs (seconds) of one generate step."""
    out: list[dict[str, Any]] = []
    times = step.token_times_ns
    if not times or step.output_tokens is None:
        return out
    ttft = (times[0] - step.start_ns) / 1e9
    encode = step.encode_s
    vision = step.vision_tokens
    for i, n in enumerate(step.output_tokens):
        if n <= 0:
            continue
        last = times[min(n, len(times)) - 1]
        e2e = (last - step.start_ns) / 1e9
        itls = [(times[k] - times[k - 1]) / 1e9 for k in range(1, min(n, len(times)))]
        out.append(
            {
                "request": i,
                "input_tokens": step.input_tokens[i] if i < len(step.input_tokens) else 0,
                "output_tokens": n,
                "ttft_s": ttft,
                "encode_s": encode,
                "prefill_s": ttft - encode if encode is not None else ttft,
                "vision_tokens": vision[i] if vision is not None and i < len(vision) else None,
                "e2e_s": e2e,
                "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else None,
                "itl_s": itls,
            }
        )
    return out


def _meets(r: dict[str, Any], slo: Any) -> bool:
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        limit = getattr(slo, key, None)
        if limit is None:
            continue
        value = r.get(key)
        if value is None and key == "tpot_s":
            continue  # a one-token answer has no TPOT to miss
        if value is None or value > limit:
            return False
    return True


def served_figures(session: Any, steps: list[Step], wall: float | None) -> dict[str, Any]:
    """The served-model fields of a latency result (goodput also for in-process runs)."""
    from perfsdk.stats import summarize

    out: dict[str, Any] = {}
    slo = getattr(session.config.workload, "slo", None)
    reqs = [r for st in steps if st.kind == "generate" for r in request_latencies(st)]
    if slo is not None and reqs:
        met = sum(1 for r in reqs if _meets(r, slo))
        out["goodput"] = met / wall if wall else None
        out["goodput_share"] = met / len(reqs)
        out["slo"] = {k: v for k, v in slo.model_dump().items() if v is not None}
    served = [st for st in steps if st.served is not None]
    failed = [st for st in session.steps if st.served is not None and st.error is not None and not st.warmup]
    if not served and not failed:
        return out
    ttft_s, e2e_s, queue = [], [], []
    for st in served:
        sched = st.served.scheduled_ns  # type: ignore[union-attr]
        queue.append((st.start_ns - sched) / 1e9)
        if st.token_times_ns and st.output_tokens:
            ttft_s.append((st.token_times_ns[0] - sched) / 1e9)
            last = st.token_times_ns[min(st.output_tokens[0], len(st.token_times_ns)) - 1]
            e2e_s.append((last - sched) / 1e9)
    sources = {st.served.token_source for st in served if st.served and st.served.token_source}  # type: ignore[union-attr]
    busy = sum(st.duration_s or 0.0 for st in served)
    stats = getattr(session, "client_stats", None)
    out.update(
        ttft_from_scheduled_s=summarize(ttft_s), e2e_from_scheduled_s=summarize(e2e_s), queue_s=summarize(queue),
        errors=len(failed), error_rate=len(failed) / (len(failed) + len(served)),
        first_error=failed[0].served.error if failed and failed[0].served else None,
        concurrency_max=stats.max_in_flight if stats is not None else None,
        concurrency_mean=busy / wall if wall else None,
        client_send_lag_s=summarize(v / 1e9 for v in stats.send_lag_ns) if stats is not None else summarize([]),
        client_loop_lag_s=summarize(v / 1e9 for v in stats.loop_lag_ns) if stats is not None else summarize([]),
        token_source=(sources.pop() if len(sources) == 1 else "mixed") if sources else None,
        client_cpu_s_per_token=(stats.cpu_s / max(1, sum(st.output_tokens[0] for st in served if st.output_tokens))
                                if stats is not None and stats.cpu_s is not None else None),
        multi_token_chunks=sum(st.served.multi_token_chunks for st in served if st.served),
        usage_mismatches=sum(1 for st in served if st.served and st.served.usage_mismatch),
    )
    return out


class LatencyCollector(Collector):
    """Per-token latency from timestamps taken inside ``generate``, plus throughput."""

    name = "latency"
    title = "Latency"
    Config = LatencyConfig
    Result = LatencyResult
    default_enabled = True
    description = "TTFT, TPOT, ITL, e2e, encode/prefill/decode, tokens/s"
    key_columns = ("output_tokens_per_s", "ttft_s.p50", "ttft_s.p95", "tpot_s.p50", "tpot_s.p95", "e2e_s.p50",
                   "itl_s.p50", "total_tokens_per_s", "requests_per_s")

    @hookimpl(trylast=True)
    def perfsdk_before_generate(self, session: Any, step: Step) -> None:
        # Nothing to arm: the session stamps the start right after the last before-hook,
        # and this one runs last so that nothing sits between it and the measured call.
        return None

    @hookimpl(tryfirst=True)
    def perfsdk_after_generate(self, session: Any, step: Step) -> None:
        return None

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> LatencyResult:
        steps = session.measured_steps
        ttft, tpot, itl, e2e, decode, fwd, step_s = [], [], [], [], [], [], []
        encode: list[float] = []
        prefill: list[float] = []
        vision: list[int] = []
        in_tok = out_tok = requests = eos_stops = 0
        # bounded while they are built: a million-token run must not hold a million rows
        rows = BoundedSeries()
        req_rows = BoundedSeries()
        for st in steps:
            step_s.append(st.duration_s or 0.0)
            in_tok += sum(st.input_tokens)
            if st.kind == "forward":
                fwd.append(st.duration_s or 0.0)
                requests += st.batch_size
                continue
            max_new = st.gen_kwargs.get("max_new_tokens")
            for r in request_latencies(st):
                requests += 1
                out_tok += r["output_tokens"]
                if max_new is not None and r["output_tokens"] < max_new:
                    eos_stops += 1
                ttft.append(r["ttft_s"])
                prefill.append(r["prefill_s"])
                if r["encode_s"] is not None:
                    encode.append(r["encode_s"])
                if r["vision_tokens"] is not None:
                    vision.append(r["vision_tokens"])
                e2e.append(r["e2e_s"])
                decode.append(r["e2e_s"] - r["ttft_s"])
                if r["tpot_s"] is not None:
                    tpot.append(r["tpot_s"])
                itl.extend(r["itl_s"])
                req_rows.append({"step": st.index, "request": r["request"], "input_tokens": r["input_tokens"],
                                 "output_tokens": r["output_tokens"], "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"],
                                 "e2e_s": r["e2e_s"], "encode_s": r["encode_s"], "prefill_s": r["prefill_s"],
                                 "vision_tokens": r["vision_tokens"]})
            if self.config.store_token_times:  # type: ignore[attr-defined]
                for k, t in enumerate(st.token_times_ns):
                    rows.append({"step": st.index, "position": k, "t_s": (t - st.start_ns) / 1e9,
                                 "t_session_s": session.clock.since_origin_s(t)})
        wall = None
        instrumented = [s for s in session.steps if s.instrumented_by]
        if steps:
            first, last = min(s.start_ns for s in steps), max(s.end_ns for s in steps)
            inside = sum(s.duration_s or 0.0 for s in instrumented if first <= s.start_ns < last)
            wall = (last - first) / 1e9 - inside
        per_s = (lambda n: n / wall if wall and wall > 0 else None)
        stages: dict[str, list[float]] = {}
        for w in session.windows:
            if w.kind == "stage" and w.end_ns is not None and not w.warmup:
                stages.setdefault(w.name.split(":", 1)[1], []).append(w.duration_s or 0.0)
        if rows:
            session.add_series("token_times", rows)
        if req_rows:  # per-request samples, for bootstrap comparisons between runs
            session.add_series("requests", req_rows)
        load_s = session.load_event.load_s if session.load_event and session.load_event.source == "config" else None
        served = served_figures(session, steps, wall)
        return LatencyResult(
            **served,
            ttft_s=summarize(ttft),
            tpot_s=summarize(tpot),
            itl_s=summarize(itl),
            e2e_s=summarize(e2e),
            encode_s=summarize(encode),
            prefill_s=summarize(prefill),
            decode_s=summarize(decode),
            forward_s=summarize(fwd),
            step_s=summarize(step_s),
            load_s=load_s,
            tokenize_s=summarize(ev.tokenize_s for ev in session.tokenize_events),
            stages={k: summarize(v) for k, v in stages.items()},
            output_tokens_per_s=per_s(out_tok) if out_tok else None,
            total_tokens_per_s=per_s(in_tok + out_tok),
            input_tokens_per_s=per_s(in_tok),
            requests_per_s=per_s(requests),
            input_tokens=in_tok,
            output_tokens=out_tok,
            requests=requests,
            vision_tokens=sum(vision),
            vision_tokens_per_request=summarize(vision),
            steps=len(steps),
            warmup_steps=sum(1 for s in session.steps if s.warmup),
            instrumented_steps=len(instrumented),
            failed_steps=sum(1 for s in session.steps if s.error is not None),
            eos_stopped_requests=eos_stops,
            wall_s=wall,
            busy_s=sum(step_s) if steps else None,
        )


    # -- presentation -------------------------------------------------------------------------

    @classmethod
    def stat_rows(cls, res: LatencyResult) -> list[tuple[str, Stats]]:
        """(label, statistics) of every non-empty latency distribution, stages included."""
        out = [(label, getattr(res, key)) for key, label in STAT_FIELDS if getattr(res, key).count]
        out += [(f"stage:{name}", st) for name, st in res.stages.items() if st.count]
        return out

    @classmethod
    def summary_tables(cls, result: LatencyResult) -> list[Any]:
        from rich.table import Table

        from perfsdk.fmt import duration_unit, fmt_bare

        rows = cls.stat_rows(result)
        quantiles = ("mean", "p50", "p90", "p95", "p99", "max")
        unit, scale = duration_unit([getattr(st, q) for _, st in rows for q in quantiles])
        # one unit for the whole table, in the headers: cells hold bare numbers that never lose their unit
        t = Table(title="Latency", show_edge=False)
        t.add_column("metric", justify="left")
        t.add_column("count", justify="right")
        for q in quantiles:
            t.add_column(f"{q} {unit}", justify="right")
        for label, st in rows:
            flag = " *" if st.low_sample_count and not label.startswith("stage:") else ""
            t.add_row(label + flag, str(st.count), *(fmt_bare(getattr(st, q), scale) for q in quantiles))
        if any(getattr(result, k).count and getattr(result, k).low_sample_count for k in ("ttft_s", "tpot_s")):
            t.caption = "* fewer than 100 samples: tail percentiles (p95/p99) are extrapolations"
        return [t] if t.row_count else []

    @classmethod
    def summary_rows(cls, result: LatencyResult) -> list[tuple[str, str]]:
        from perfsdk.fmt import fmt_num, fmt_s

        r = result
        served: list[tuple[str, str]] = []
        if r.goodput is not None:
            limits = ", ".join(f"{k.removesuffix('_s')} <= {fmt_s(v)}" for k, v in r.slo.items())
            served.append(("goodput", f"{fmt_num(r.goodput)} req/s ({(r.goodput_share or 0) * 100:.1f} % met {limits})"))
        if r.error_rate is not None:
            err = f"{r.errors} ({r.error_rate * 100:.1f} %)"
            served.append(("errors", err + (f": {r.first_error}" if r.first_error else "")))
        if r.concurrency_max is not None:
            served.append(("concurrency reached", f"max {r.concurrency_max}, mean {fmt_num(r.concurrency_mean, 2)}"))
        if r.client_send_lag_s.count:
            served.append(("client lag p99", f"send {fmt_s(r.client_send_lag_s.p99)}, loop {fmt_s(r.client_loop_lag_s.p99)}"))
        if r.token_source is not None:
            served.append(("token counts from", r.token_source + (
                f" ({r.multi_token_chunks} multi-token chunks)" if r.multi_token_chunks else "")))
        return served + [
            ("output tokens/s", fmt_num(r.output_tokens_per_s)),
            ("total tokens/s", fmt_num(r.total_tokens_per_s)),
            ("requests/s", fmt_num(r.requests_per_s)),
            ("tokens in / out", f"{r.input_tokens} / {r.output_tokens}"),
            *([("vision tokens / request", fmt_num(r.vision_tokens_per_request.mean, 1))] if r.vision_tokens else []),
            ("steps (warm-up)", f"{r.steps} ({r.warmup_steps})"),
            ("load time", fmt_s(r.load_s)),
        ]

    @classmethod
    def report_section(cls, result: LatencyResult, run: Any) -> ReportSection:
        from perfsdk.experiments.report import latency_cdf, per_token_latency

        rows = [[label, st.count] + [(getattr(st, q) * 1e3 if getattr(st, q) is not None else None)
                                     for q in ("mean", "p50", "p90", "p95", "p99", "max")]
                for label, st in cls.stat_rows(result)]
        sec = ReportSection("Latency")
        if rows:
            sec.html.append(html_table(["latency", "count", "mean ms", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "max ms"], rows))
        reqs = run.read_series("requests")
        samples = {m: [float(x[m]) for x in reqs if x.get(m) is not None] for m in ("ttft_s", "tpot_s", "e2e_s")}
        cdf = latency_cdf({k: v for k, v in samples.items() if v})
        if cdf:
            sec.figures.append(ReportFigure("latency-cdf", "Latency CDF", cdf, "Empirical CDF per request; dotted: p50, dashed: p95."))
        else:
            sec.notes.append("No per-request latency samples stored with this run.")
        tok = per_token_latency(run.read_series("token_times"))
        if tok:
            sec.figures.append(ReportFigure("per-token-latency", "Per-token latency", tok,
                                            "Position 0 is the time to first token; later positions are inter-token gaps."))
        return sec

    # -- what other modules ask of a latency result ----------------------------------------------

    @classmethod
    def step_timings(cls, run: Any, requests: list[dict[str, Any]] | None = None) -> list[StepTiming]:
        """Measured prefill and decode times of a stored run, one entry per distinct (batch,
        input tokens, output tokens), repeats combined by the median.

        From the ``requests`` series (read from the run's store when not given): the rows of a
        ``generate`` call give its batch size (rows), prompt length (the longest: prompts are
        padded to it), generated length (the longest), TTFT and decode time (the slowest request's
        ``e2e - ttft``). Without that series, the result's median TTFT and TPOT with the workload's
        batch size and the mean prompt and output lengths.
        """
        import statistics

        rows = requests if requests is not None else run.read_series("requests")
        out: list[StepTiming] = []
        if rows:
            by_step: dict[Any, list[dict[str, Any]]] = {}
            for r in rows:
                by_step.setdefault(r.get("step"), []).append(r)
            groups: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
            for rs in by_step.values():
                ttft = rs[0].get("ttft_s")
                if ttft is None:
                    continue
                n_out = max(int(r.get("output_tokens") or 0) for r in rs)
                n_in = max(int(r.get("input_tokens") or 0) for r in rs)
                if n_out < 1 or n_in < 1:
                    continue
                decode = 0.0
                for r in rs:
                    if r.get("e2e_s") is not None:
                        decode = max(decode, float(r["e2e_s"]) - float(ttft))
                    elif r.get("tpot_s") is not None:
                        decode = max(decode, float(r["tpot_s"]) * (int(r["output_tokens"]) - 1))
                groups.setdefault((len(rs), n_in, n_out), []).append((float(ttft), decode))
            for (b, n_in, n_out), vals in sorted(groups.items()):
                out.append(StepTiming(batch_size=b, input_tokens=n_in, output_tokens=n_out,
                                      ttft_s=statistics.median(v[0] for v in vals),
                                      decode_s=statistics.median(v[1] for v in vals), repeats=len(vals)))
            return out
        res: LatencyResult | None = cls.result_of(run)
        if res is None or res.ttft_s.p50 is None or not res.requests or not res.input_tokens:
            return out
        batch = (run.workload.batch_size if run.workload and run.workload.batch_size else None) or 1
        n_out = max(1, round(res.output_tokens / res.requests))
        tpot = res.tpot_s.p50
        decode = tpot * (n_out - 1) if n_out > 1 and tpot is not None else 0.0
        out.append(StepTiming(batch_size=batch, input_tokens=max(1, round(res.input_tokens / res.requests)),
                              output_tokens=n_out if decode > 0 else 1, ttft_s=float(res.ttft_s.p50),
                              decode_s=decode, repeats=max(1, res.steps)))
        return out

    # -- sweep figures --------------------------------------------------------------------------

    @classmethod
    def phase_columns(cls) -> list[tuple[str, str]]:
        """(label, export column) of each phase's median latency, for sweep figures (the vision-token
        panels plot them against :meth:`vision_token_columns`)."""
        return [("encode p50 (ms)", "collectors.latency.encode_s.p50"),
                ("prefill p50 (ms)", "collectors.latency.prefill_s.p50"),
                ("decode p50 (ms)", "collectors.latency.decode_s.p50"),
                ("TTFT p50 (ms)", "collectors.latency.ttft_s.p50")]

    @classmethod
    def vision_token_columns(cls) -> tuple[str, ...]:
        """Export columns holding the real vision tokens per request, most specific last."""
        return ("collectors.latency.vision_tokens_per_request.mean",)

    # -- comparisons ----------------------------------------------------------------------------

    @classmethod
    def compare_metrics(cls) -> dict[str, bool]:
        return {"ttft_s": True, "tpot_s": True, "e2e_s": True, "output_tokens_per_s": False}

    @classmethod
    def metric_samples(cls, run: Any, metric: str) -> list[list[float]] | None:
        """Per request from the ``requests`` series, grouped by step; throughput is one sample
        per step (its output tokens over its duration). Runs without that series fall back to
        ``token_times``: one sample per step (the batch's slowest request)."""
        from collections import defaultdict

        if metric not in cls.compare_metrics():
            return None
        reqs = run.read_series("requests")
        if reqs:
            steps: dict[Any, list[dict[str, Any]]] = defaultdict(list)
            for r in reqs:
                steps[r["step"]].append(r)
            groups: list[list[float]] = []
            for rs in steps.values():
                if metric == "output_tokens_per_s":
                    # rows without latency columns (another collector's per-request fields) are skipped
                    timed = [r for r in rs if r.get("e2e_s") is not None]
                    dur = max((r["e2e_s"] for r in timed), default=0.0)
                    if dur > 0:
                        groups.append([sum(r.get("output_tokens") or 0 for r in timed) / dur])
                else:
                    vals = [float(r[metric]) for r in rs if r.get(metric) is not None]
                    if vals:
                        groups.append(vals)
            return groups or None
        times = run.read_series("token_times")
        if times:
            by_step: dict[Any, list[float]] = defaultdict(list)
            for r in times:
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

    @classmethod
    def metric_value(cls, result: LatencyResult, metric: str, stat: str) -> float | None:
        if metric == "output_tokens_per_s":  # the headline throughput is tokens / wall time
            return result.output_tokens_per_s
        st = getattr(result, metric, None)
        return getattr(st, stat, None) if isinstance(st, Stats) else None

    # -- distributed runs -----------------------------------------------------------------------

    def rank_payload(self, session: Any) -> dict[str, Any]:
        """The raw samples rank 0 pools: per-request latencies and per-step wall times."""
        samples: dict[str, list[float]] = {k: [] for k in POOLED_SAMPLES}
        step_s: list[float] = []
        for st in session.measured_steps:
            # steps are matched across ranks by their order among measured steps
            step_s.append(st.duration_s or 0.0)
            if st.kind == "forward":
                samples["forward_s"].append(st.duration_s or 0.0)
                continue
            for r in request_latencies(st):
                samples["ttft_s"].append(r["ttft_s"])
                samples["prefill_s"].append(r["prefill_s"])
                if r["encode_s"] is not None:
                    samples["encode_s"].append(r["encode_s"])
                if r["vision_tokens"] is not None:
                    samples["vision_tokens"].append(r["vision_tokens"])
                samples["e2e_s"].append(r["e2e_s"])
                samples["decode_s"].append(r["e2e_s"] - r["ttft_s"])
                if r["tpot_s"] is not None:
                    samples["tpot_s"].append(r["tpot_s"])
                samples["itl_s"].extend(r["itl_s"])
        samples["tokenize_s"] = [ev.tokenize_s for ev in session.tokenize_events]
        return {"samples": samples, "step_s": step_s}

    @classmethod
    def merge_ranks(cls, shares: list[RankShare]) -> LatencyResult:
        """Percentiles from the pooled samples of all ranks (never averaged percentiles); tokens
        and requests summed; step ``k``'s wall time is the slowest rank's; throughput is total
        tokens over the slowest rank's wall time; stages keep the slowest rank's summary."""
        results: list[LatencyResult] = [s.result for s in shares]
        pooled: dict[str, list[float]] = {}
        steps_by_rank: list[list[float]] = []
        for sh in shares:
            pay = sh.payload or {}
            for key, vals in (pay.get("samples") or {}).items():
                pooled.setdefault(key, []).extend(vals)
            steps_by_rank.append(list(pay.get("step_s") or []))
        if "prefill_s" not in pooled:  # shares without the encode split: prefill was TTFT
            pooled["prefill_s"] = pooled.get("ttft_s", [])
        upd: dict[str, Any] = {fld: summarize(pooled.get(key, [])) for fld, key in POOLED_FIELDS.items()}
        for fld in SUMMED_FIELDS:
            upd[fld] = sum(int(getattr(r, fld)) for r in results)
        n_steps = max((len(s) for s in steps_by_rank), default=0)
        slowest = [max(s[k] for s in steps_by_rank if k < len(s)) for k in range(n_steps)]
        upd["step_s"] = summarize(slowest)
        upd["steps"] = n_steps
        upd["busy_s"] = sum(slowest) if slowest else None
        walls = [r.wall_s for r in results if r.wall_s is not None]
        wall = max(walls) if walls else None
        upd["wall_s"] = wall

        def per_s(n: int) -> float | None:
            return n / wall if wall and wall > 0 else None

        in_tok, out_tok, reqs = upd["input_tokens"], upd["output_tokens"], upd["requests"]
        upd["output_tokens_per_s"] = per_s(out_tok) if out_tok else None
        upd["input_tokens_per_s"] = per_s(in_tok)
        upd["total_tokens_per_s"] = per_s(in_tok + out_tok)
        upd["requests_per_s"] = per_s(reqs)
        stages: dict[str, Stats] = {}
        for r in results:
            for name, st in r.stages.items():
                prev = stages.get(name)
                if prev is None or (st.max or 0.0) > (prev.max or 0.0):
                    stages[name] = st
        upd["stages"] = stages
        return results[0].model_copy(update=upd)


@dataclass(frozen=True)
class StepTiming:
    """Measured times of generate calls of one shape (see :meth:`LatencyCollector.step_timings`)."""

    batch_size: int
    input_tokens: int
    output_tokens: int
    ttft_s: float
    decode_s: float
    repeats: int


#: Latency distributions shown in tables, in order: (result field, label).
STAT_FIELDS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "e2e"), ("encode_s", "encode"),
               ("prefill_s", "prefill"), ("decode_s", "decode"), ("forward_s", "forward"),
               ("ttft_from_scheduled_s", "TTFT from schedule"), ("queue_s", "client queue"))
#: Raw samples each rank ships for pooling.
POOLED_SAMPLES = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "encode_s", "prefill_s", "decode_s", "forward_s",
                  "vision_tokens")
#: Result fields recomputed from pooled samples (field -> sample key).
POOLED_FIELDS = {"ttft_s": "ttft_s", "tpot_s": "tpot_s", "itl_s": "itl_s", "e2e_s": "e2e_s", "encode_s": "encode_s",
                 "prefill_s": "prefill_s", "decode_s": "decode_s", "forward_s": "forward_s",
                 "tokenize_s": "tokenize_s", "vision_tokens_per_request": "vision_tokens"}
#: Counters summed over ranks.
SUMMED_FIELDS = ("input_tokens", "output_tokens", "requests", "vision_tokens", "warmup_steps", "failed_steps", "instrumented_steps",
                 "eos_stopped_requests")


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(LatencyCollector)

"""Latency and throughput: TTFT, TPOT, ITL, e2e, prefill, decode, load and tokenize times.

Definitions (per request, on the session clock; warm-up steps excluded):

- TTFT = step start -> first generated position ready (the prefill).
- e2e = step start -> this request's last real token ready (EOS included, padding excluded).
- TPOT = (e2e - TTFT) / (output tokens - 1), for requests with at least 2 tokens.
- ITL = every gap between consecutive tokens of a request, pooled over requests.
- prefill = TTFT; decode = e2e - TTFT.
- Throughput = tokens / wall time of the timed steps (first timed start -> last timed end,
  less the time of any instrumented step inside that span), not tokens / mean latency.

Steps that a collector instrumented (``step.instrumented_by``: FLOPs counting, forward hooks,
the profiler) are left out of every figure and counted in ``instrumented_steps``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
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
    steps: int = 0
    warmup_steps: int = 0
    instrumented_steps: int = Field(default=0, description="Steps instrumented by a collector, left out of every figure.")
    failed_steps: int = 0
    eos_stopped_requests: int = 0
    wall_s: float | None = None
    busy_s: float | None = None


def request_latencies(step: Step) -> list[dict[str, Any]]:
    """Per-request TTFT/e2e/TPOT/ITLs (seconds) of one generate step."""
    out: list[dict[str, Any]] = []
    times = step.token_times_ns
    if not times or step.output_tokens is None:
        return out
    ttft = (times[0] - step.start_ns) / 1e9
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
                "e2e_s": e2e,
                "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else None,
                "itl_s": itls,
            }
        )
    return out


class LatencyCollector(Collector):
    """Per-token latency from timestamps taken inside ``generate``, plus throughput."""

    name = "latency"
    Config = LatencyConfig
    Result = LatencyResult
    default_enabled = True
    description = "TTFT, TPOT, ITL, e2e, prefill/decode, tokens/s"

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
                e2e.append(r["e2e_s"])
                decode.append(r["e2e_s"] - r["ttft_s"])
                if r["tpot_s"] is not None:
                    tpot.append(r["tpot_s"])
                itl.extend(r["itl_s"])
                req_rows.append({"step": st.index, "request": r["request"], "input_tokens": r["input_tokens"],
                                 "output_tokens": r["output_tokens"], "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"],
                                 "e2e_s": r["e2e_s"]})
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
        return LatencyResult(
            ttft_s=summarize(ttft),
            tpot_s=summarize(tpot),
            itl_s=summarize(itl),
            e2e_s=summarize(e2e),
            prefill_s=summarize(ttft),
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
            steps=len(steps),
            warmup_steps=sum(1 for s in session.steps if s.warmup),
            instrumented_steps=len(instrumented),
            failed_steps=sum(1 for s in session.steps if s.error is not None),
            eos_stopped_requests=eos_stops,
            wall_s=wall,
            busy_s=sum(step_s) if steps else None,
        )


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(LatencyCollector)

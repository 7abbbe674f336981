"""The server's own view of a served run: its Prometheus ``/metrics`` read before and after.

vLLM, SGLang and TGI publish their queue, KV-cache and prefix-cache figures in the Prometheus
text format. This collector reads the endpoint right before and after the measured requests
(warm-up left out; the whole session for other runs), while they run (every ``interval_s``, for
the peaks of gauges), and stores, under names common
to every server:

- ``deltas``: what counters grew by over the run (requests, preemptions, prefix-cache hits and
  queries, prompt and generated tokens);
- ``peaks`` and ``after``: gauges (requests running and waiting, KV-cache usage);
- ``raw_deltas``: every counter the server publishes (``*_total``), by its own name.

Off by default (``collectors: {server_metrics: {}}``); for a served model its URL defaults to
the endpoint's host with ``/metrics``.
"""

from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import urlparse

from pydantic import Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.plugins import hookimpl

#: Server metric names (Prometheus) -> the common name perfsdk stores them under.
KNOWN: dict[str, str] = {
    # vLLM
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:request_success_total": "requests_finished",
    # SGLang
    "sglang:num_running_reqs": "requests_running",
    "sglang:num_queue_reqs": "requests_waiting",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate",
    "sglang:num_retracted_reqs": "preemptions",
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:num_requests_total": "requests_finished",
    # TGI
    "tgi_queue_size": "requests_waiting",
    "tgi_batch_current_size": "requests_running",
    "tgi_request_count": "requests_finished",
    "tgi_request_success": "requests_finished",
}
GAUGES = {"requests_running", "requests_waiting", "kv_cache_usage", "prefix_cache_hit_rate"}

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eEInfNa]+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each metric over its label sets (``# HELP``/``# TYPE`` lines and histogram
    buckets left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line.strip())
        if m is None:
            continue
        name = m["name"]
        if name.endswith(("_bucket", "_created")):
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def common_names(raw: dict[str, float]) -> dict[str, float]:
    """The figures of :data:`KNOWN` a server published, under their common names."""
    out: dict[str, float] = {}
    for name, value in raw.items():
        key = KNOWN.get(name) or KNOWN.get(name.removesuffix("_total"))
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out


class ServerMetricsConfig(CollectorConfig):
    """Where the server publishes its metrics, and how often they are read during the run."""

    url: str | None = Field(default=None, description="the /metrics URL (default: the endpoint's host + /metrics)")
    interval_s: float = Field(default=1.0, ge=0, description="read gauges this often during the run (0: only "
                                                             "before and after)")
    timeout_s: float = Field(default=2.0, gt=0)


class ServerMetricsResult(CollectorResult):
    """The server's figures over the run: counter deltas, gauge peaks, and the raw counters."""

    status: str = "ok"
    reason: str | None = None
    url: str | None = None
    deltas: dict[str, float] = Field(default_factory=dict)
    peaks: dict[str, float] = Field(default_factory=dict)
    after: dict[str, float] = Field(default_factory=dict)
    raw_deltas: dict[str, float] = Field(default_factory=dict)
    readings: int = 0


class ServerMetricsCollector(Collector):
    """Reads a served model's Prometheus /metrics before, during and after the run."""

    name = "server_metrics"
    title = "Server metrics"
    Config = ServerMetricsConfig
    Result = ServerMetricsResult
    default_enabled = False
    description = "the server's own /metrics (vLLM, SGLang, TGI): queue, KV-cache usage, preemptions, prefix cache"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.cfg: ServerMetricsConfig = self.config  # type: ignore[assignment]
        self.url: str | None = None
        self.before: dict[str, float] | None = None
        self.peaks: dict[str, float] = {}
        self.readings = 0
        self.error: str | None = None
        self._lock = threading.Lock()

    def _read(self) -> dict[str, float] | None:
        import urllib.request

        assert self.url is not None
        try:
            with urllib.request.urlopen(self.url, timeout=self.cfg.timeout_s) as resp:
                text = resp.read().decode("utf-8", "replace")
        except Exception as exc:
            self.error = f"{self.url}: {getattr(exc, 'reason', None) or exc}"
            return None
        raw = parse_prometheus(text)
        with self._lock:
            self.readings += 1
            for k, v in common_names(raw).items():
                if k in GAUGES:
                    self.peaks[k] = max(self.peaks.get(k, v), v)
        return raw

    @hookimpl
    def perfsdk_session_start(self, session: Any) -> None:
        endpoint = getattr(session.config.model, "endpoint", None)
        if self.cfg.url:
            self.url = self.cfg.url
        elif endpoint:
            p = urlparse(endpoint)
            self.url = f"{p.scheme}://{p.netloc}/metrics"
        if self.url is None:
            self.error = "no server: set collectors.server_metrics.url, or model.endpoint"
            return
        self.before = self._read()
        if self.before is not None and self.cfg.interval_s > 0:
            session.sampler.add_probe("server_metrics", lambda _t: self._read(), self.cfg.interval_s)

    # the measured requests of a served run: read right before and after them (warm-up left out)
    @hookimpl
    def perfsdk_window_open(self, session: Any, window: Any) -> None:
        from perfsdk.events import SERVED_WINDOW

        if window.name == SERVED_WINDOW and self.before is not None:
            self.before = self._read() or self.before
            with self._lock:
                self.peaks.clear()

    @hookimpl
    def perfsdk_window_close(self, session: Any, window: Any) -> None:
        from perfsdk.events import SERVED_WINDOW

        if window.name == SERVED_WINDOW and self.before is not None:
            self.after_reading = self._read()

    after_reading: dict[str, float] | None = None

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> ServerMetricsResult:
        if self.url is None or self.before is None:
            return ServerMetricsResult(status="unavailable", reason=f"unavailable: {self.error}", url=self.url)
        after = self.after_reading or self._read()
        if after is None:
            return ServerMetricsResult(status="unavailable", reason=f"unavailable: {self.error}", url=self.url,
                                       readings=self.readings)
        raw_deltas = {k: after[k] - self.before.get(k, 0.0) for k in after
                      if k.endswith("_total") or k in KNOWN and KNOWN[k] not in GAUGES}
        common_after = common_names(after)
        common_before = common_names(self.before)
        deltas = {k: v - common_before.get(k, 0.0) for k, v in common_after.items() if k not in GAUGES}
        return ServerMetricsResult(url=self.url, deltas=deltas, peaks=dict(self.peaks),
                                   after={k: v for k, v in common_after.items() if k in GAUGES},
                                   raw_deltas=raw_deltas, readings=self.readings)

    @classmethod
    def summary_rows(cls, result: ServerMetricsResult) -> list[tuple[str, str]]:
        from perfsdk.fmt import fmt_num

        if result.status != "ok":
            return [("server metrics", result.reason or "unavailable")]
        rows = [(f"{k} (delta)", fmt_num(v)) for k, v in sorted(result.deltas.items())]
        rows += [(f"{k} (peak)", fmt_num(v)) for k, v in sorted(result.peaks.items())]
        return rows or [("server metrics", f"{result.readings} readings, no known figure")]


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(ServerMetricsCollector)

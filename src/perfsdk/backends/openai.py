"""The ``openai`` backend: a model served behind an OpenAI-compatible HTTP endpoint.

vLLM, SGLang, TGI, llama.cpp's server and ``transformers serve`` all answer
``/v1/completions`` and ``/v1/chat/completions`` with a stream of server-sent events. Each
request of the workload becomes one step (batch 1) of the session: the before-hooks run, the
send time is stamped on the session clock, every event that carries text is timestamped as it
arrives, and the after-hooks get the token times and the real token counts. Collectors see the
same events as for a model in this process.

Counting. Output tokens come from the server's ``usage`` when it sends one (``stream_options:
include_usage``), else from the model's tokenizer over the streamed text, else one per event;
the step says which (``ServedRequest.token_source``). An event that carries several tokens (as
the tokenizer counts its text) has its tokens spread evenly over the gap since the previous
event, and is counted as a multi-token chunk. TTFT is the first event that carries text: a
role-only first event of the chat API is not a token.

Load. ``workload.load`` offers the requests: ``concurrency`` (a closed loop of N users) or
``rate`` (an open loop at ``rate_per_s`` with constant, Poisson or gamma gaps, scheduled ahead
of time so that a slow server cannot slow the schedule: latency is also kept from the scheduled
send time, and the wait between schedule and send is the client's own queueing). The client
measures itself: the lag of each send behind its schedule and the event loop's delay.

Failures (timeouts, HTTP errors, malformed events, dropped connections) end the request, not
the run: the step carries the error, the run becomes ``partial``, and every request measured
until then is kept.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import structlog

from perfsdk.backends.base import Backend
from perfsdk.backends.client_pool import processes_for, send_on_schedule
from perfsdk.config import ConfigError
from perfsdk.plugins import hookimpl

log = structlog.get_logger("perfsdk.backends.openai")


class RequestFailed(RuntimeError):
    """A request to the served model failed (its text is the first error of the request)."""


class RequestsFailed(RuntimeError):
    """Some requests of a served run failed; the run is partial."""


# -- what one request returns ---------------------------------------------------------------


@dataclass
class StreamRecord:
    """The raw record of one streamed request: event times and texts, usage, error."""

    chunk_ns: list[int] = field(default_factory=list)
    chunk_text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


def _chunk_text(api: str, event: dict[str, Any]) -> str | None:
    choices = event.get("choices") or []
    if not choices:
        return None
    c = choices[0]
    if api == "chat":
        delta = c.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content") or None
    return c.get("text") or None


def parse_event(api: str, data: str, rec: StreamRecord, t_ns: int) -> bool:
    """Apply one SSE ``data:`` payload to ``rec``; False at ``[DONE]``.

    Raises ``ValueError`` for a payload that is not a JSON object (a malformed event)."""
    data = data.strip()
    if data == "[DONE]":
        return False
    event = json.loads(data)
    if not isinstance(event, dict):
        raise ValueError(f"malformed event: {data[:80]!r}")
    if "error" in event and not event.get("choices"):
        err = event["error"]
        raise RuntimeError(f"server error event: {err.get('message') if isinstance(err, dict) else err}")
    text = _chunk_text(api, event)
    if text:
        rec.chunk_ns.append(t_ns)
        rec.chunk_text.append(text)
    choices = event.get("choices") or []
    if choices and choices[0].get("finish_reason"):
        rec.finish_reason = str(choices[0]["finish_reason"])
    usage = event.get("usage")
    if isinstance(usage, dict):
        if usage.get("completion_tokens") is not None:
            rec.completion_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(usage["prompt_tokens"])
    return True


def token_times(chunk_ns: list[int], per_chunk: list[int]) -> list[int]:
    """Token-ready times from event times: an event of k tokens spreads them evenly over the
    gap since the previous event (the first event's tokens all arrive with it)."""
    out: list[int] = []
    for i, (t, k) in enumerate(zip(chunk_ns, per_chunk)):
        if k <= 1 or i == 0:
            out.extend([t] * max(k, 1))
            continue
        prev = chunk_ns[i - 1]
        out.extend(prev + (t - prev) * j // k for j in range(1, k + 1))
    return out


def _token_count(tokenizer: Any, text: str) -> int:
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    try:
        return len(tok(text, add_special_tokens=False)["input_ids"])
    except Exception:
        return 1


def tokens_per_chunk(texts: list[str], total: int | None, tokenizer: Any = None) -> list[int]:
    """How many tokens each streamed event carried.

    ``total`` is the server's count (``usage``); without it, the tokenizer's count of the whole
    streamed text, else one per event. Events carry one token each unless the total is larger:
    the extra tokens go to the events whose text the tokenizer reads as several tokens (in
    proportion), or evenly when there is no tokenizer to tell.
    """
    n = len(texts)
    if n == 0:
        return []
    if total is None:
        total = max(n, _token_count(tokenizer, "".join(texts))) if tokenizer is not None else n
    extra = total - n
    if extra <= 0:
        return [1] * n
    weights = [max(0, _token_count(tokenizer, t) - 1) for t in texts] if tokenizer is not None else [0] * n
    if sum(weights) == 0:
        weights = [1] * n
    share = [extra * w / sum(weights) for w in weights]
    out = [1 + int(x) for x in share]
    # largest remainders take what rounding down left
    for i in sorted(range(n), key=lambda i: share[i] - int(share[i]), reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


async def stream_request(http: Any, url: str, body: dict[str, Any], headers: dict[str, str], api: str,
                         timeout_s: float) -> StreamRecord:
    """POST one streaming request and record its events on the monotonic clock (shared by every
    process of this machine); a failure is recorded in ``error``, never raised."""
    import time as _time

    import aiohttp

    rec = StreamRecord()
    try:
        async with http.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                raise RequestFailed(f"HTTP {resp.status}: {text}")
            buf = b""
            done = False
            async for raw in resp.content:
                t = _time.perf_counter_ns()
                buf += raw
                if not buf.endswith(b"\n"):
                    continue
                line, buf = buf.decode("utf-8", "replace").strip(), b""
                if not line or line.startswith(":") or not line.startswith("data:"):
                    continue
                try:
                    if not parse_event(api, line[5:], rec, t):
                        done = True
                        break
                except (ValueError, json.JSONDecodeError) as exc:
                    raise RequestFailed(f"malformed event: {line[:120]!r} ({exc})") from None
            if not done and rec.finish_reason is None:
                raise RequestFailed("the stream ended before the response was complete")
    except asyncio.TimeoutError:
        rec.error = f"timeout after {timeout_s:g} s"
    except RequestFailed as exc:
        rec.error = str(exc)
    except aiohttp.ClientError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    except RuntimeError as exc:
        rec.error = str(exc)
    return rec


# -- the schedule ----------------------------------------------------------------------------


def arrival_gaps(arrival: str, rate_per_s: float, seed: int, gamma_cv: float = 2.0) -> Iterator[float]:
    """Seconds between scheduled sends: ``constant`` 1/R, ``poisson`` exponential with mean 1/R,
    ``gamma`` with mean 1/R and coefficient of variation ``gamma_cv`` (bursty above 1)."""
    rng = random.Random(seed)
    mean = 1.0 / rate_per_s
    shape = 1.0 / (gamma_cv ** 2)
    while True:
        if arrival == "constant":
            yield mean
        elif arrival == "poisson":
            yield rng.expovariate(rate_per_s)
        else:
            yield rng.gammavariate(shape, mean / shape)


# -- the backend -----------------------------------------------------------------------------


class OpenAIBackend(Backend):
    """Requests to an OpenAI-compatible endpoint (``model.endpoint``), streamed."""

    name = "openai"
    description = "an OpenAI-compatible HTTP endpoint (vLLM, SGLang, TGI, llama.cpp, transformers serve)"
    in_process = False

    @classmethod
    def handles(cls, config: Any) -> bool:
        return bool(config.model.endpoint)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.endpoint: str = config.model.endpoint or ""
        self.tokenizer: Any = None
        self.tokenizer_note: str | None = None
        self._model_name: str | None = None

    @property
    def model_name(self) -> str:
        """The name requests give the model: ``model.id``; an embedded model (``builtin:…``)
        is named by its cached folder, the path ``transformers serve`` loads it from."""
        if self._model_name is None:
            mid = self.config.model.id
            self._model_name = mid
            if mid.startswith("builtin:"):
                try:
                    from perfsdk.models.tiny import ensure_tiny_llama

                    self._model_name = str(ensure_tiny_llama(mid.split(":", 1)[1]))
                except Exception:
                    pass
        return self._model_name

    # -- checks and loading ------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        var = self.config.model.api_key_env
        if var:
            key = os.environ.get(var)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        return headers

    def check(self) -> None:
        """The endpoint answers (``GET /models``): a refused connection or a wrong URL is an
        exit-2 error before anything runs. The API key variable, when named, must be set."""
        import urllib.error
        import urllib.request

        cfg = self.config.model
        if not self.endpoint:
            raise ConfigError("model.endpoint: not set")
        load = self.config.workload.load
        if load is not None and load.mode == "replay" and load.trace:
            from perfsdk.backends.trace import read_trace

            read_trace(load.trace)  # bad rows stop the run before anything is sent
        if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
            raise ConfigError(f"model.api_key_env: the environment variable {cfg.api_key_env} is not set")
        url = f"{self.endpoint}/models"
        req = urllib.request.Request(url, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=min(10.0, cfg.request_timeout_s)) as resp:
                body = resp.read(65536)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:  # the server is there; its model list failed (some list the Hub's)
                log.warning("the endpoint's model list failed; going on", url=url, status=exc.code)
                return
            hint = " (the endpoint usually ends in /v1)" if exc.code == 404 else ""
            raise ConfigError(f"model.endpoint: {url} answered HTTP {exc.code} {exc.reason}{hint}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError(f"model.endpoint: cannot reach {self.endpoint}: {reason}") from None
        try:
            data = json.loads(body)
        except ValueError:
            raise ConfigError(f"model.endpoint: {url} did not answer with JSON: is it an OpenAI-compatible "
                              f"server (the endpoint usually ends in /v1)?") from None
        names = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)] if isinstance(data, dict) else []
        if names and self.model_name not in names:
            log.warning("model.id is not among the served models", model=self.model_name, served=names[:10])

    def _find_tokenizer(self) -> Any:
        from pathlib import Path

        cfg = self.config.model
        where = cfg.tokenizer or self.model_name
        if cfg.tokenizer is None and not Path(os.path.expanduser(where)).is_dir():
            self.tokenizer_note = "no tokenizer: set model.tokenizer to count prompt tokens and streams without usage"
            return None
        try:
            from transformers import AutoTokenizer

            from perfsdk.models.tiny import quiet_transformers

            with quiet_transformers():
                return AutoTokenizer.from_pretrained(os.path.expanduser(where),
                                                     local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1")
        except Exception as exc:
            if cfg.tokenizer is not None:
                raise ConfigError(f"model.tokenizer: {cfg.tokenizer}: cannot load a tokenizer: {exc}") from None
            self.tokenizer_note = f"no tokenizer could be loaded from {where}: {type(exc).__name__}"
            return None

    def load(self, session: Any) -> tuple[Any, Any]:
        self.tokenizer = self._find_tokenizer()
        return None, self.tokenizer

    def model_info(self) -> Any:
        from perfsdk.schemas import ModelInfo

        info: dict[str, Any] = {"model_id": self.config.model.id, "model_class": f"served ({self.name})",
                                "device": self.endpoint}
        arch = self.served_config()
        if arch is not None:
            info.update(model_type=getattr(arch, "model_type", None),
                        num_layers=getattr(arch, "num_hidden_layers", None),
                        hidden_size=getattr(arch, "hidden_size", None),
                        num_attention_heads=getattr(arch, "num_attention_heads", None),
                        num_key_value_heads=getattr(arch, "num_key_value_heads", None),
                        vocab_size=getattr(arch, "vocab_size", None))
        return ModelInfo(**info)

    def served_config(self) -> Any:
        """The ``transformers`` config of the served model, when a local folder has it
        (``model.tokenizer`` or ``model.id``): what FLOPs and the simulation count from."""
        from pathlib import Path

        cfg = self.config.model
        for where in (cfg.tokenizer, self.model_name):
            if not where:
                continue
            p = Path(os.path.expanduser(where))
            if (p / "config.json").is_file():
                try:
                    from perfsdk.models.resolve import resolve_config

                    return resolve_config(str(p))[0]
                except Exception:
                    return None
        return None

    def is_local(self) -> bool:
        """Whether the endpoint is on this machine (loopback or one of its own addresses)."""
        host = urlparse(self.endpoint).hostname or ""
        if host in ("localhost", "::1") or host.startswith("127."):
            return True
        try:
            import socket

            import psutil

            own = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
            return socket.gethostbyname(host) in own
        except Exception:
            return False

    def server_pids(self) -> list[int]:
        """The processes listening on the endpoint's port, when it is on this machine."""
        if not self.is_local():
            return []
        parsed = urlparse(self.endpoint)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            import psutil

            return sorted({c.pid for c in psutil.net_connections(kind="tcp")
                           if c.pid and c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN})
        except Exception:
            return []

    # -- running ----------------------------------------------------------------------------

    def run_workload(self, session: Any, progress: Callable[[int, int], None] | None = None) -> None:
        from perfsdk.models.runner import plan_workload
        from perfsdk.models.prompts import load_workload_examples

        workload = session.config.workload
        if workload.task != "generate":
            raise ConfigError("workload.task: a served model generates text (task: generate)")
        _model, tokenizer = session.load() if session.load_event is None else (None, session.tokenizer)
        if tokenizer is not None:
            plan = plan_workload(workload, tokenizer)
            prompts, labels, lengths = plan.prompts, plan.labels, plan.lengths
            filtered = plan.filtered
        else:
            examples, _ = load_workload_examples(workload)
            prompts = [e.prompt for e in examples]
            labels = [e.label for e in examples]
            lengths = [0] * len(prompts)
            filtered = 0
        client = _Client(self, session, tokenizer)
        asyncio.run(client.run(prompts, labels, lengths, progress))
        self._set_workload_info(session, client, prompts, lengths, filtered)
        failed = [s for s in session.steps if s.served is not None and s.error is not None and not s.warmup]
        if failed:
            first = failed[0].served.error if failed[0].served else str(failed[0].error)
            session.record_error(f"backend:{self.name}", "requests",
                                 RequestsFailed(f"{len(failed)} of {client.sent} requests failed; first: {first}"))

    def _set_workload_info(self, session: Any, client: _Client, prompts: list[str], lengths: list[int],
                           filtered: int) -> None:
        from perfsdk.schemas import WorkloadInfo

        workload = session.config.workload
        load = workload.load
        known = [n for n in lengths if n]
        pattern = "concurrency" if load is None else (
            f"rate {load.arrival}" if load.mode == "rate" else load.mode)
        session.set_workload_info(WorkloadInfo(
            prompts_source=workload.dataset.path if workload.dataset else workload.prompts,
            num_prompts=len(prompts), prompts_filtered=filtered, max_input_tokens=workload.max_input_tokens,
            batch_size=1, num_batches=client.sent, max_new_tokens=workload.generate.max_new_tokens,
            warmup_runs=client.warmup_sent, timed_runs=client.sent, iterations=1,
            input_tokens_mean=(sum(known) / len(known)) if known else None,
            input_tokens_max=max(known) if known else None, arrival_pattern=pattern,
        ))


class _Client:
    """One asyncio loop with its own connection pool, sending the workload's requests."""

    def __init__(self, backend: OpenAIBackend, session: Any, tokenizer: Any) -> None:
        self.backend = backend
        self.session = session
        self.cfg = session.config
        self.tokenizer = tokenizer
        self.api = self.cfg.model.api
        self.url = f"{backend.endpoint}/{'chat/completions' if self.api == 'chat' else 'completions'}"
        self.sent = 0
        self.warmup_sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.loop_lag_ns: list[int] = []
        self.send_lag_ns: list[int] = []
        self.cpu_s: float | None = None
        self.worker_cpu_s = 0.0
        self.clock_uncertainty_ns: int | None = None
        self._stop = False

    def payload(self, prompt: str, max_tokens: int | None = None) -> dict[str, Any]:
        gen = self.cfg.workload.generate
        body: dict[str, Any] = {"model": self.backend.model_name, "max_tokens": max_tokens or gen.max_new_tokens,
                                "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if gen.do_sample:
            body["temperature"] = gen.temperature
            if gen.top_p is not None:
                body["top_p"] = gen.top_p
        else:
            body["temperature"] = 0.0
        body["seed"] = self.cfg.workload.seed
        return body

    async def request(self, http: Any, prompt: str, label: str | None, n_in: int, scheduled_ns: int,
                      warmup: bool, max_tokens: int | None = None) -> None:
        import aiohttp

        s = self.session
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        ctx = s.warmup() if warmup else _null()
        with ctx:
            step = s.begin_request(input_tokens=n_in, scheduled_ns=scheduled_ns, inputs={"prompt": prompt},
                                   gen_kwargs={"max_new_tokens": max_tokens or self.cfg.workload.generate.max_new_tokens},
                                   in_flight=self.in_flight)
        step.labels = [label] if label is not None else None
        if not warmup:
            self.send_lag_ns.append(max(0, step.start_ns - scheduled_ns))
        try:
            rec = await stream_request(http, self.url, self.payload(prompt, max_tokens), self.backend._headers(),
                                       self.api, self.cfg.model.request_timeout_s)
        finally:
            self.in_flight -= 1
        self._finish(step, rec)

    def _finish(self, step: Any, rec: StreamRecord, end_ns: int | None = None) -> None:
        s = self.session
        served = step.served
        step.end_ns = end_ns if end_ns is not None else s.clock.now_ns()
        if rec.error is not None:
            served.error = rec.error
            step.error = RequestFailed(rec.error)
        per_chunk = tokens_per_chunk(rec.chunk_text, rec.completion_tokens, self.tokenizer)
        if rec.completion_tokens is not None:
            n_out, source = rec.completion_tokens, "usage"
            served.usage_mismatch = n_out < len(rec.chunk_ns)
        else:
            n_out, source = sum(per_chunk), "tokenizer" if self.tokenizer is not None else "chunks"
        if rec.prompt_tokens is not None:
            step.input_tokens = [rec.prompt_tokens]
        served.chunks = len(rec.chunk_ns)
        served.multi_token_chunks = sum(1 for k in per_chunk if k > 1)
        served.token_source = source
        step.token_times_ns = token_times(rec.chunk_ns, per_chunk)
        step.output_tokens = [n_out]
        step.outputs = ["".join(rec.chunk_text)]
        s.end_request(step)

    async def _loop_lag(self) -> None:
        interval = 0.005
        clock = self.session.clock
        while not self._stop:
            t = clock.now_ns()
            await asyncio.sleep(interval)
            self.loop_lag_ns.append(max(0, clock.now_ns() - t - int(interval * 1e9)))

    async def run(self, prompts: list[str], labels: list[str | None], lengths: list[int],
                  progress: Callable[[int, int], None] | None) -> None:
        import aiohttp

        cfg = self.cfg
        workload = cfg.workload
        load = workload.load
        mode = load.mode if load is not None else "concurrency"
        if mode == "sweep":
            raise ConfigError("workload.load.mode: sweep runs several points: run it with perfsdk run (it stores one "
                              "run per point)")
        schedule: list[tuple[float, int, int | None]] = []
        if mode == "replay":
            prompts, labels, lengths, schedule = self._replay_requests(prompts)
        total = workload.num_prompts if mode != "replay" else len(schedule)
        order = [i % len(prompts) for i in range(total)]
        if mode == "rate":
            schedule = self._rate_schedule(prompts, labels, lengths, order)
        timeout = aiohttp.ClientTimeout(total=cfg.model.request_timeout_s)
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
            for k in range(workload.warmup_runs):
                i = k % len(prompts)
                await self.request(http, prompts[i], labels[i], lengths[i], self.session.clock.now_ns(), True)
                self.warmup_sent += 1
                if progress is not None:
                    progress(k + 1, workload.warmup_runs + total)
            lag_task = asyncio.create_task(self._loop_lag())
            done = [0]

            def tick() -> None:
                done[0] += 1
                if progress is not None:
                    progress(workload.warmup_runs + done[0], workload.warmup_runs + total)

            processes = processes_for(load)
            pids = self.backend.server_pids()
            if pids:
                self.session.validity_monitor.include_processes(pids, f"the local server at {self.backend.endpoint}")
            cpu0 = time.process_time()
            # a full collection in the middle of a schedule stalls every send for tens of ms:
            # collect once now, and not while the measured requests run
            gc_was_enabled = gc.isenabled()
            gc.collect()
            gc.disable()
            try:
                with self.session.measured_load():
                    if processes > 1:
                        self._pooled(processes, mode, prompts, labels, lengths, order, schedule, load, tick)
                    elif mode == "concurrency":
                        await self._closed_loop(http, prompts, labels, lengths, order,
                                                load.concurrency if load is not None else 1, tick)
                    else:
                        await self._open_loop(http, prompts, labels, lengths, schedule, tick)
            finally:
                if gc_was_enabled:
                    gc.enable()
                self._stop = True
                await lag_task
                self.cpu_s = time.process_time() - cpu0 + self.worker_cpu_s
        from perfsdk.events import ClientStats

        self.session.client_stats = ClientStats(send_lag_ns=self.send_lag_ns, loop_lag_ns=self.loop_lag_ns,
                                                max_in_flight=self.max_in_flight, sent=self.sent,
                                                warmup=self.warmup_sent, cpu_s=self.cpu_s,
                                                clock_uncertainty_ns=self.clock_uncertainty_ns)

    def _pooled(self, processes: int, mode: str, prompts: list[str], labels: list[str | None], lengths: list[int],
                order: list[int], schedule: list[tuple[float, int, int | None]], load: Any,
                tick: Callable[[], None]) -> None:
        """Send the measured requests from ``processes`` worker processes, then report each one
        to the session as a step, in send order (:mod:`perfsdk.backends.client_pool`)."""
        from perfsdk.backends.client_pool import run_pool

        plan: list[tuple[int, float | None, int | None]]
        if mode == "concurrency":
            plan = [(i, None, None) for i in order]
        else:
            plan = [(i, off, mt) for off, i, mt in schedule]
        requests: list[tuple[int, float | None, dict[str, Any]]] = [
            (k, off, self.payload(prompts[i], mt)) for k, (i, off, mt) in enumerate(plan)]
        job = {"url": self.url, "headers": self.backend._headers(), "api": self.api,
               "timeout_s": self.cfg.model.request_timeout_s, "mode": "concurrency" if mode == "concurrency" else "rate",
               "users": load.concurrency if load is not None else 1}
        if load is not None and load.client_executor == "ray":
            from perfsdk.backends.client_pool import run_ray_pool

            records, loop_lag, cpu, self.clock_uncertainty_ns = run_ray_pool(processes, job, requests,
                                                                             load.ray_address)
        else:
            records, loop_lag, cpu = run_pool(processes, job, requests)
        self.loop_lag_ns.extend(loop_lag)
        self.worker_cpu_s = cpu
        ends = []
        for r in records:
            i, _, mt = plan[r["k"]]
            step = self.session.begin_request(
                input_tokens=lengths[i], scheduled_ns=r["scheduled_ns"], inputs={"prompt": prompts[i]},
                gen_kwargs={"max_new_tokens": mt or self.cfg.workload.generate.max_new_tokens}, start_ns=r["send_ns"])
            step.labels = [labels[i]] if labels[i] is not None else None
            self.sent += 1
            self.send_lag_ns.append(max(0, r["send_ns"] - r["scheduled_ns"]))
            rec = StreamRecord(**{k: r[k] for k in ("chunk_ns", "chunk_text", "prompt_tokens", "completion_tokens",
                                                     "finish_reason", "error")})
            self._finish(step, rec, end_ns=r["end_ns"])
            ends.append((r["send_ns"], 1))
            ends.append((r["end_ns"], -1))
            tick()
        depth = 0
        for _, d in sorted(ends):
            depth += d
            self.max_in_flight = max(self.max_in_flight, depth)

    def _replay_requests(self, corpus: list[str]) -> tuple[list[str], list[str | None], list[int],
                                                           list[tuple[float, int, int | None]]]:
        """The prompts and schedule of a trace: one prompt of its length per request."""
        from perfsdk.backends.trace import prompt_of_length, read_trace

        load = self.cfg.workload.load
        assert load is not None and load.trace
        reqs = read_trace(load.trace)
        prompts = [prompt_of_length(r.input_tokens, corpus, self.tokenizer) for r in reqs]
        schedule: list[tuple[float, int, int | None]] = [
            (r.time_s * load.time_scale, k, r.output_tokens) for k, r in enumerate(reqs)]
        return prompts, [None] * len(reqs), [r.input_tokens for r in reqs], schedule

    def _deadline(self) -> int | None:
        load = self.cfg.workload.load
        if load is None or load.duration_s is None:
            return None
        return self.session.clock.now_ns() + int(load.duration_s * 1e9)

    async def _closed_loop(self, http: Any, prompts: list[str], labels: list[str | None], lengths: list[int],
                           order: list[int], users: int, tick: Callable[[], None]) -> None:
        queue = list(reversed(order))
        deadline = self._deadline()
        clock = self.session.clock

        async def user() -> None:
            scheduled = clock.now_ns()
            while queue and not (deadline is not None and clock.now_ns() >= deadline):
                i = queue.pop()
                self.sent += 1
                await self.request(http, prompts[i], labels[i], lengths[i], scheduled, False)
                tick()
                scheduled = clock.now_ns()  # a closed-loop user sends as soon as its last request ended

        await asyncio.gather(*(user() for _ in range(users)))

    def _rate_schedule(self, prompts: list[str], labels: list[str | None], lengths: list[int],
                       order: list[int]) -> list[tuple[float, int, int | None]]:
        """(offset_s, prompt index, max tokens) of each request of a rate load."""
        load = self.cfg.workload.load
        assert load is not None and load.rate_per_s is not None
        gaps = arrival_gaps(load.arrival, load.rate_per_s, self.cfg.workload.seed, load.gamma_cv)
        at = 0.0
        out: list[tuple[float, int, int | None]] = []
        for n, i in enumerate(order):
            if n:
                at += next(gaps)
            out.append((at, i, None))
        return out

    async def _open_loop(self, http: Any, prompts: list[str], labels: list[str | None], lengths: list[int],
                         schedule: list[tuple[float, int, int | None]], tick: Callable[[], None]) -> None:
        """Send each request at its scheduled offset, whether or not earlier ones finished."""
        load = self.cfg.workload.load
        clock = self.session.clock
        limit = asyncio.Semaphore(load.max_concurrency) if load is not None and load.max_concurrency else None
        deadline = self._deadline()
        start = clock.now_ns()

        async def one(i: int, scheduled: int, max_tokens: int | None) -> None:
            if limit is not None:
                async with limit:
                    await self.request(http, prompts[i], labels[i], lengths[i], scheduled, False, max_tokens)
            else:
                await self.request(http, prompts[i], labels[i], lengths[i], scheduled, False, max_tokens)
            tick()

        async def start_one(item: tuple[int, int | None], scheduled: int) -> None:
            self.sent += 1
            await one(item[0], scheduled, item[1])

        await send_on_schedule([(start + int(off * 1e9), (i, mt)) for off, i, mt in schedule], start_one, deadline)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


@hookimpl
def perfsdk_register_backends(register: Any) -> None:
    register(OpenAIBackend)

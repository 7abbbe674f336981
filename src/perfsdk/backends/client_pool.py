"""Load from several client processes (``workload.load.client_processes``), on this machine or
on a Ray cluster (``workload.load.client_executor: ray``).

One asyncio loop in one Python process sends a few hundred to a few thousand streamed requests
per second (``benchmarks/client_capacity.py``); past that the client, not the server, sets the
latency. With ``client_processes: N`` the schedule is computed once, in the session's process,
and split round-robin over N worker processes (closed-loop users are split the same way). Each
worker has its own event loop and connection pool, sends its requests at their scheduled times
and records every event on the monotonic clock the whole machine shares
(``time.perf_counter_ns``), so all timestamps are on the session's clock. The session's process
then turns the records into steps in send order: collectors get each request's
``perfsdk_before_generate``/``perfsdk_after_generate`` after the fact, with the times the
workers took.

On a Ray cluster each client process is an actor placed by Ray; its monotonic clock is aligned
to the session's by the reading with the shortest round trip (the offset's uncertainty, half
that trip, is reported), and its times are brought back to the session's clock.

``auto`` uses one process unless the offered load needs more (one per
:data:`REQUESTS_PER_PROCESS` requests/s or :data:`USERS_PER_PROCESS` users), at most one less
than the machine's cores.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

#: Requests per second one client process sustains with its send lag under 1 ms at p99,
#: measured on a 2-core machine (docs/serving.md, "The client's capacity").
REQUESTS_PER_PROCESS = 800.0
#: Concurrent closed-loop users per client process.
USERS_PER_PROCESS = 256


def processes_for(load: Any) -> int:
    """How many client processes ``load`` asks for (``auto`` resolved; on a Ray cluster ``auto``
    is as many as the load needs, this machine's cores aside)."""
    want = load.client_processes if load is not None else 1
    if want != "auto":
        return int(want)
    if load.client_executor == "ray":
        if load.mode == "rate" and load.rate_per_s:
            return max(1, math.ceil(load.rate_per_s / REQUESTS_PER_PROCESS))
        return max(1, math.ceil(load.concurrency / USERS_PER_PROCESS)) if load.mode == "concurrency" else 1
    cores = os.cpu_count() or 1
    if load.mode == "rate" and load.rate_per_s:
        need = math.ceil(load.rate_per_s / REQUESTS_PER_PROCESS)
    elif load.mode == "concurrency":
        need = math.ceil(load.concurrency / USERS_PER_PROCESS)
    else:
        need = 1
    return max(1, min(need, cores - 1))


#: While a schedule runs: how long a thread may hold the GIL before the scheduler thread gets
#: it (Python's default is 5 ms, far more than the send lag perfsdk allows itself).
SWITCH_INTERVAL_S = 0.0002


async def send_on_schedule(items: list[tuple[int, Any]], start: Callable[[Any, int], Awaitable[None]],
                           deadline_ns: int | None = None) -> int:
    """Start ``start(item, scheduled_ns)`` for each ``(scheduled_ns, item)`` at its time and wait
    for all of them; returns how many were started (those scheduled past ``deadline_ns`` are not).

    A thread sleeps precisely (nanosleep) to each scheduled time and hands the start to the
    event loop: the loop's own timers wake up to a millisecond late (epoll's resolution). The
    GIL switch interval is lowered meanwhile, so that the thread runs on time.
    """
    loop = asyncio.get_running_loop()
    tasks: list[Any] = []
    all_started = asyncio.Event()
    stop = threading.Event()

    def launch(item: Any, scheduled: int) -> None:
        tasks.append(asyncio.ensure_future(start(item, scheduled)))

    def scheduler() -> None:
        try:
            for scheduled, item in items:
                if stop.is_set() or (deadline_ns is not None and scheduled >= deadline_ns):
                    break
                wait = (scheduled - time.perf_counter_ns()) / 1e9
                if wait > 0:
                    time.sleep(wait)
                loop.call_soon_threadsafe(launch, item, scheduled)
        finally:
            loop.call_soon_threadsafe(all_started.set)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, SWITCH_INTERVAL_S))
    threading.Thread(target=scheduler, name="perfsdk-schedule", daemon=True).start()
    try:
        await all_started.wait()
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        sys.setswitchinterval(previous)
    return len(tasks)


async def send_share(job: dict[str, Any]) -> dict[str, Any]:
    """Send one worker's share of the requests (``job``); returns their records, the loop's
    lag samples and the CPU time it took. Times are this machine's ``time.perf_counter_ns``."""
    import aiohttp

    from perfsdk.backends.openai import stream_request

    out: list[dict[str, Any]] = []
    loop_lag: list[int] = []
    stop = False

    async def lag() -> None:
        while not stop:
            t = time.perf_counter_ns()
            await asyncio.sleep(0.005)
            loop_lag.append(max(0, time.perf_counter_ns() - t - 5_000_000))

    async def one(http: Any, k: int, scheduled: int, body: dict[str, Any]) -> None:
        send = time.perf_counter_ns()
        rec = await stream_request(http, job["url"], body, job["headers"], job["api"], job["timeout_s"])
        out.append({"k": k, "scheduled_ns": scheduled, "send_ns": send, "end_ns": time.perf_counter_ns(),
                    **asdict(rec)})

    cpu0 = time.process_time()
    gc.collect()
    gc.disable()  # no full collection in the middle of the schedule (this process ends after it)
    timeout = aiohttp.ClientTimeout(total=job["timeout_s"])
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        lag_task = asyncio.create_task(lag())
        if job["mode"] == "concurrency":
            queue = list(reversed(job["requests"]))

            async def user() -> None:
                while queue:
                    k, _, body = queue.pop()
                    await one(http, k, time.perf_counter_ns(), body)

            await asyncio.gather(*(user() for _ in range(job["users"])))
        else:
            async def start(item: tuple[int, dict[str, Any]], scheduled: int) -> None:
                await one(http, item[0], scheduled, item[1])

            await send_on_schedule([(sch, (k, body)) for k, sch, body in job["requests"]], start)
        stop = True
        await lag_task
    return {"records": out, "loop_lag_ns": loop_lag, "cpu_s": time.process_time() - cpu0}


def _worker_main() -> None:
    """A worker process (``python -m perfsdk.backends.client_pool``): says it is ready, reads its
    job (one JSON line on standard input), sends the requests, writes the records (JSON)."""
    import json

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    job: dict[str, Any] = json.loads(sys.stdin.readline())
    result = asyncio.run(send_share(job))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


class RayClient:
    """A client process on a Ray cluster (an actor): its clock and its share of the requests."""

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        return asyncio.run(send_share(job))


def clock_offset(remote_now: Callable[[], int], samples: int = 7) -> tuple[int, int]:
    """(offset, uncertainty) of a remote monotonic clock against this one, in ns: the reading
    with the shortest round trip, placed at its midpoint; the uncertainty is half that trip."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        remote = remote_now()
        t1 = time.perf_counter_ns()
        trip = t1 - t0
        if best is None or trip < best[1] * 2:
            best = (remote - (t0 + t1) // 2, trip // 2)
    assert best is not None
    return best


def run_ray_pool(processes: int, base_job: dict[str, Any], requests: list[tuple[int, float | None, dict[str, Any]]],
                 address: str | None = None, lead_s: float = 0.5) -> tuple[list[dict[str, Any]], list[int], float, int]:
    """:func:`run_pool` on a Ray cluster: one actor per client process, wherever Ray places it.
    Each actor's clock is aligned to this one (:func:`clock_offset`) and every time it reports
    brought back; returns also the largest alignment uncertainty (ns)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("workload.load.client_executor ray needs ray: pip install 'perfsdk[ray]'") from None
    started_here = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        started_here = True
    try:
        actor: Any = ray.remote(num_cpus=1)(RayClient)
        actors: list[Any] = [actor.remote() for _ in range(processes)]
        def reader(a: Any) -> Callable[[], int]:
            return lambda: int(ray.get(a.now_ns.remote()))

        offsets = [clock_offset(reader(a)) for a in actors]
        start = time.perf_counter_ns() + int(lead_s * 1e9)
        refs = []
        users = base_job.get("users", 1)
        for w, (a, (off, _)) in enumerate(zip(actors, offsets)):
            job = dict(base_job, users=max(1, users // processes + (1 if w < users % processes else 0)),
                       requests=[(k, start + off + int(o * 1e9) if o is not None else 0, body)
                                 for k, o, body in requests[w::processes]])
            refs.append(a.run.remote(job))
        records: list[dict[str, Any]] = []
        lags: list[int] = []
        cpu = 0.0
        for ref, (off, _) in zip(refs, offsets):
            got = ray.get(ref)
            for r in got["records"]:
                for key in ("scheduled_ns", "send_ns", "end_ns"):
                    r[key] -= off
                r["chunk_ns"] = [t - off for t in r["chunk_ns"]]
            records += got["records"]
            lags += got["loop_lag_ns"]
            cpu += got["cpu_s"]
        for a in actors:
            ray.kill(a)
    finally:
        if started_here:
            ray.shutdown()
    return (sorted(records, key=lambda r: (r["scheduled_ns"], r["send_ns"])), lags, cpu,
            max(u for _, u in offsets))


def run_pool(processes: int, base_job: dict[str, Any], requests: list[tuple[int, float | None, dict[str, Any]]],
             lead_s: float = 0.2) -> tuple[list[dict[str, Any]], list[int], float]:
    """Run ``requests`` — (index, offset seconds or None for closed loop, request body) — over
    ``processes`` worker processes; returns (records, loop lags, the workers' CPU seconds).

    Workers are plain child processes of this interpreter talking JSON over their standard
    streams (no helper process outlives the run)."""
    import json
    import subprocess

    cmd = [sys.executable, "-m", "perfsdk.backends.client_pool"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a client process did not start (exit {proc.poll()})")
        start = time.perf_counter_ns() + int(lead_s * 1e9)  # every worker is up: one schedule for all
        users = base_job.get("users", 1)
        for w, proc in enumerate(procs):
            job = dict(base_job, users=max(1, users // processes + (1 if w < users % processes else 0)),
                       requests=[(k, start + int(off * 1e9) if off is not None else 0, body)
                                 for k, off, body in requests[w::processes]])
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.close()
        records: list[dict[str, Any]] = []
        lags: list[int] = []
        cpu = 0.0
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a client process ended without its records (exit {proc.wait()})")
            got = json.loads(line)
            records += got["records"]
            lags += got["loop_lag_ns"]
            cpu += got["cpu_s"]
            proc.wait(30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sorted(records, key=lambda r: (r["scheduled_ns"], r["send_ns"])), lags, cpu


if __name__ == "__main__":
    _worker_main()

"""One background sampler thread shared by all collectors.

Collectors add *probes* (cheap callables) with their own interval; the single daemon thread
sleeps on an event (no busy-waiting) until the next probe is due. Its own CPU time is measured
with ``time.thread_time`` so the overhead of sampling is visible in the result.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import structlog

log = structlog.get_logger("perfsdk.sampler")


@dataclass
class _Probe:
    name: str
    fn: Callable[[int], None]
    interval_ns: int
    next_ns: int = 0
    calls: int = 0
    errors: int = 0
    last_error: str | None = None
    start_now: bool = True
    last_ns: int | None = None
    max_gap_ns: int = 0


class Sampler:
    """Calls registered probes at their intervals from one thread.

    ``start()`` and ``stop()`` are idempotent; ``stop()`` joins the thread, so none is left
    behind. A probe that raises is counted and skipped; it never kills the thread.
    """

    def __init__(self, clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock_ns = clock_ns
        self._probes: list[_Probe] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_time_s = 0.0
        self.started_ns: int | None = None
        self.stopped_ns: int | None = None

    def add_probe(self, name: str, fn: Callable[[int], None], interval_s: float, *, start_now: bool = True) -> None:
        """Call ``fn(t_ns)`` every ``interval_s`` seconds while the sampler runs.

        The first call comes when the sampler starts, or one interval later with
        ``start_now=False`` (for probes such as counter polls that the window edges already read).
        Each probe's longest gap between two calls is kept (:meth:`stats`): a starved sampler
        thread shows there.
        """
        if interval_s <= 0:
            raise ValueError(f"sampler probe {name}: interval_s must be > 0")
        with self._lock:
            self._probes.append(_Probe(name, fn, int(interval_s * 1e9), start_now=start_now))

    @property
    def probes(self) -> list[str]:
        return [p.name for p in self._probes]

    @property
    def intervals_s(self) -> dict[str, float]:
        """Each probe's interval, in seconds."""
        return {p.name: p.interval_ns / 1e9 for p in self._probes}

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running or not self._probes:
            return
        self._stop.clear()
        now = self._clock_ns()
        self.started_ns = now
        for p in self._probes:
            p.next_ns = now if p.start_now else now + p.interval_ns
            p.last_ns = now
        self._thread = threading.Thread(target=self._run, name="perfsdk-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        self.stopped_ns = self._clock_ns()

    def sample_now(self) -> None:
        """Call every probe once from the calling thread (used at window edges and at stop)."""
        now = self._clock_ns()
        for p in list(self._probes):
            self._call(p, now)

    def _call(self, p: _Probe, now: int) -> None:
        if p.last_ns is not None and now - p.last_ns > p.max_gap_ns:
            p.max_gap_ns = now - p.last_ns
        p.last_ns = now
        try:
            p.fn(now)
            p.calls += 1
        except Exception as exc:  # a failing probe must not stop the others
            p.errors += 1
            p.last_error = repr(exc)
            if p.errors == 1:
                log.warning("sampler probe failed", probe=p.name, error=repr(exc))

    def _run(self) -> None:
        # The thread keeps the default priority on purpose: it takes the GIL for each probe,
        # and a low-priority thread preempted while holding the GIL would stall the model's
        # thread (priority inversion) far more than its own few microseconds cost.
        t0 = time.thread_time()
        try:
            while not self._stop.is_set():
                now = self._clock_ns()
                next_due = None
                for p in list(self._probes):
                    if now >= p.next_ns:
                        self._call(p, now)
                        # schedule from the due time to avoid drift, but never in the past
                        p.next_ns = max(p.next_ns + p.interval_ns, now + p.interval_ns // 2)
                    next_due = p.next_ns if next_due is None else min(next_due, p.next_ns)
                wait_s = max(0.0, ((next_due or now) - self._clock_ns()) / 1e9)
                self._stop.wait(wait_s)
        finally:
            self.cpu_time_s += time.thread_time() - t0

    def stats(self) -> dict[str, dict[str, object]]:
        return {p.name: {"calls": p.calls, "errors": p.errors, "last_error": p.last_error,
                         "interval_s": p.interval_ns / 1e9, "max_gap_s": p.max_gap_ns / 1e9} for p in self._probes}

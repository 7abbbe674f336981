"""The ``pyruntime`` collector: GC pauses, context switches and threads during a run."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import psutil
from pydantic import Field

import perfsdk


class PyRuntimeConfig(perfsdk.CollectorConfig):
    """Settings for the pyruntime collector."""

    track_gc: bool = Field(default=True, description="time garbage-collector pauses via gc.callbacks")


class PyRuntimeResult(perfsdk.CollectorResult):
    """Runtime costs over the session (GC pauses in seconds)."""

    gc_collections: int
    gc_collections_by_generation: dict[str, int]
    gc_pause_s: float
    gc_pause_max_s: float
    gc_collected_objects: int
    ctx_switches_voluntary: int
    ctx_switches_involuntary: int
    threads_peak: int


class PyRuntimeCollector(perfsdk.Collector):
    """Times every garbage collection and counts context switches between session start and end."""

    name = "pyruntime"
    title = "Python runtime"
    Config = PyRuntimeConfig
    Result = PyRuntimeResult
    default_enabled = False
    description = "GC pauses, context switches, threads"
    #: lead the CSV / markdown exports, after perfsdk's run-level columns
    key_columns = ("gc_pause_s", "gc_collections")

    @classmethod
    def summary_rows(cls, result: PyRuntimeResult) -> list[tuple[str, str]]:
        return [
            ("GC collections (gen 0/1/2)", f"{result.gc_collections} "
             f"({'/'.join(str(result.gc_collections_by_generation.get(g, 0)) for g in '012')})"),
            ("GC pause total / max", f"{result.gc_pause_s * 1e3:.3f} ms / {result.gc_pause_max_s * 1e3:.3f} ms"),
            ("context switches (vol./invol.)", f"{result.ctx_switches_voluntary} / {result.ctx_switches_involuntary}"),
            ("threads (peak)", str(result.threads_peak)),
        ]

    @classmethod
    def merge_ranks(cls, shares: list[perfsdk.RankShare]) -> PyRuntimeResult:
        """Every rank is its own process: counts and pauses add up, maxima are the largest."""
        rs: list[PyRuntimeResult] = [s.result for s in shares]
        by_gen: dict[str, int] = {}
        for r in rs:
            for g, n in r.gc_collections_by_generation.items():
                by_gen[g] = by_gen.get(g, 0) + n
        return PyRuntimeResult(
            gc_collections=sum(r.gc_collections for r in rs),
            gc_collections_by_generation=by_gen,
            gc_pause_s=sum(r.gc_pause_s for r in rs),
            gc_pause_max_s=max(r.gc_pause_max_s for r in rs),
            gc_collected_objects=sum(r.gc_collected_objects for r in rs),
            ctx_switches_voluntary=sum(r.ctx_switches_voluntary for r in rs),
            ctx_switches_involuntary=sum(r.ctx_switches_involuntary for r in rs),
            threads_peak=max(r.threads_peak for r in rs),
        )

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._proc = psutil.Process()
        self._gc_start: float | None = None
        self.pauses: list[float] = []
        self.by_gen = {"0": 0, "1": 0, "2": 0}
        self.collected = 0
        self._ctx0: Any = None
        self.threads_peak = threading.active_count()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.pauses.append(time.perf_counter() - self._gc_start)
            self._gc_start = None
            gen = str(info.get("generation", 0))
            self.by_gen[gen] = self.by_gen.get(gen, 0) + 1
            self.collected += int(info.get("collected", 0))

    @perfsdk.hookimpl
    def perfsdk_session_start(self, session: Any) -> None:
        self._ctx0 = self._proc.num_ctx_switches()
        if self.config.track_gc:
            gc.callbacks.append(self._on_gc)

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        self.threads_peak = max(self.threads_peak, threading.active_count())

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> PyRuntimeResult:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        ctx = self._proc.num_ctx_switches()
        return PyRuntimeResult(
            gc_collections=len(self.pauses),
            gc_collections_by_generation=dict(self.by_gen),
            gc_pause_s=sum(self.pauses),
            gc_pause_max_s=max(self.pauses, default=0.0),
            gc_collected_objects=self.collected,
            ctx_switches_voluntary=ctx.voluntary - self._ctx0.voluntary,
            ctx_switches_involuntary=ctx.involuntary - self._ctx0.involuntary,
            threads_peak=max(self.threads_peak, threading.active_count()),
        )


@perfsdk.hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(PyRuntimeCollector)

"""Memory: peak RSS of the process tree (sampled), CUDA peaks, weights and KV-cache bytes."""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult, RankShare, ReportSection, html_table
from perfsdk.events import Step, Window
from perfsdk.plugins import hookimpl


#: Windows with a per-phase peak (RSS and CUDA allocated).
_PHASES = ("encode", "prefill", "decode")


class MemoryConfig(CollectorConfig):
    """Settings of the memory collector."""

    interval_s: float = Field(default=0.2, gt=0, description="RSS sampling interval on the shared sampler (window edges are sampled too)")


class MemoryResult(CollectorResult):
    """Peak memory figures in bytes."""

    rss_peak_bytes: int | None = None
    rss_start_bytes: int | None = None
    rss_end_bytes: int | None = None
    rss_peak_by_phase_bytes: dict[str, int] = Field(default_factory=dict)
    cuda_peak_allocated_bytes: int | None = None
    cuda_peak_reserved_bytes: int | None = None
    cuda_peak_allocated_by_phase_bytes: dict[str, int] = Field(default_factory=dict)
    cuda_status: str = "unavailable: model not on CUDA"
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_bytes_per_token: int | None = None
    kv_cache_context_tokens: int | None = None
    kv_cache_batch_size: int | None = None
    kv_cache_source: str | None = Field(
        default=None, description="'cache tensors': the bytes of the KV cache the model built, read after its "
                                  "last forward; 'architecture': computed from the described architecture")
    samples: int = 0


def process_tree_rss(proc: Any, children: list[Any] | None = None) -> int:
    """RSS of a process and all its children (bytes); ``children`` may be a cached listing."""
    total = proc.memory_info().rss
    for child in proc.children(recursive=True) if children is None else children:
        try:
            total += child.memory_info().rss
        except Exception:  # child exited between listing and reading
            pass
    return int(total)


class _StatmReader:
    """Reads this process's RSS from ``/proc/self/statm`` without reopening the file (Linux)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.page = os.sysconf("SC_PAGE_SIZE")

    @classmethod
    def open(cls) -> _StatmReader | None:
        try:
            return cls(os.open("/proc/self/statm", os.O_RDONLY))
        except (OSError, AttributeError, ValueError):
            return None

    def rss(self) -> int | None:
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) * self.page
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


#: Listing child processes walks /proc (about a millisecond); it is refreshed at most this often.
CHILDREN_REFRESH_NS = 1_000_000_000


class MemoryCollector(Collector):
    """Samples RSS on the shared sampler and at window edges; reads CUDA allocator peaks."""

    name = "memory"
    title = "Memory"
    key_columns = ("rss_peak_bytes",)
    Config = MemoryConfig
    Result = MemoryResult
    default_enabled = True
    description = "peak RSS (process tree), CUDA peaks, weights, KV cache"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        import psutil

        self._proc = psutil.Process()
        self.peak = 0
        self.start: int | None = None
        self.end: int | None = None
        self.by_phase: dict[str, int] = {}
        self.cuda_by_phase: dict[str, int] = {}
        self.samples = 0
        self.session: Any = None
        self.max_kv: tuple[int, int, int] | None = None  # (batch, decoder context, encoder positions)
        self._arch: Any = None  # the generating model's Architecture (None: not a described architecture)
        self._arch_of: int | None = None
        # the KV cache the model really builds: (bytes, batch, decoder context) of the largest one seen
        self.measured_kv: tuple[int, int, int] | None = None
        self._cache_seen: Any = None
        self._cache_hook: Any = None
        self._statm = _StatmReader.open()
        self._children_cache: list[Any] = []
        self._children_at = -CHILDREN_REFRESH_NS

    def _children(self, t_ns: int) -> list[Any]:
        if t_ns - self._children_at >= CHILDREN_REFRESH_NS:
            try:
                self._children_cache = self._proc.children(recursive=True)
            except Exception:
                self._children_cache = []
            self._children_at = t_ns
        return self._children_cache

    def _sample(self, t_ns: int = 0, tree: bool = True, phase: str | None = None) -> None:
        rss = process_tree_rss(self._proc, self._children(t_ns)) if tree else int(self._proc.memory_info().rss)
        self.samples += 1
        if rss > self.peak:
            self.peak = rss
        if phase is None:
            phase = self.session.phase if self.session is not None else "idle"
        if rss > self.by_phase.get(phase, 0):
            self.by_phase[phase] = rss

    def _cuda(self) -> Any:
        dev = getattr(self.session, "device", None)
        if dev is None or getattr(dev, "type", None) != "cuda":
            return None
        import torch

        return torch.cuda

    @hookimpl
    def perfsdk_session_start(self, session: Any) -> None:
        self.session = session
        self.start = process_tree_rss(self._proc)
        self.peak = self.start
        session.sampler.add_probe("memory.rss", self._sample, self.config.interval_s)  # type: ignore[attr-defined]

    def _edge_sample(self, phase: str) -> None:
        """Own RSS at a window edge: /proc/self/statm through a kept-open descriptor (a few µs)."""
        rss = self._statm.rss() if self._statm is not None else None
        if rss is None:
            rss = int(self._proc.memory_info().rss)
        self.samples += 1
        if rss > self.peak:
            self.peak = rss
        if rss > self.by_phase.get(phase, 0):
            self.by_phase[phase] = rss

    @hookimpl
    def perfsdk_window_open(self, session: Any, window: Window) -> None:
        if window.kind in _PHASES:
            cuda = self._cuda()
            if cuda is not None:
                cuda.reset_peak_memory_stats(session.device)

    @hookimpl
    def perfsdk_window_close(self, session: Any, window: Window) -> None:
        # RSS only grows within a phase or is caught by the sampler, so reading it when each
        # phase closes is enough for per-phase peaks and keeps the measured path light.
        if window.kind in _PHASES or window.kind in ("step", "stage"):
            self._edge_sample(window.name if window.kind == "stage" else window.kind)
            cuda = self._cuda()
            if cuda is not None and window.kind in _PHASES:
                peak = int(cuda.max_memory_allocated(session.device))
                self.cuda_by_phase[window.kind] = max(peak, self.cuda_by_phase.get(window.kind, 0))

    @hookimpl
    def perfsdk_before_generate(self, session: Any, step: Step) -> None:
        """Watch the top module's forwards for the KV cache ``generate`` hands it (found by type)."""
        if step.kind != "generate" or step.warmup or not hasattr(step.model, "register_forward_pre_hook"):
            return
        from perfsdk.models.internals import find_cache

        def seen(_mod: Any, args: Any, kwargs: Any) -> None:
            cache = find_cache(args, kwargs)
            if cache is not None:
                self._cache_seen = cache

        self._cache_seen = None
        self._cache_hook = step.model.register_forward_pre_hook(seen, with_kwargs=True)

    def _take_cache(self, step: Step) -> None:
        if self._cache_hook is None:
            return
        self._cache_hook.remove()
        self._cache_hook = None
        cache, self._cache_seen = self._cache_seen, None
        if cache is None:
            return
        from perfsdk.models.internals import cache_bytes, cache_length

        size = cache_bytes(cache)
        if size and (self.measured_kv is None or size > self.measured_kv[0]):
            self.measured_kv = (size, step.batch_size, cache_length(cache) or 0)

    @hookimpl
    def perfsdk_after_generate(self, session: Any, step: Step) -> None:
        if step.kind != "generate" or step.warmup:
            return
        self._take_cache(step)
        ids = step.inputs.get("input_ids")
        padded = int(ids.shape[1]) if ids is not None and hasattr(ids, "shape") else max(step.input_tokens or [0])
        arch = self._architecture(step.model)
        if arch is not None and arch.is_encoder_decoder:
            # the decoder caches its own positions; cross-attention caches the encoder's
            cand = (step.batch_size, len(step.token_times_ns), padded)
        else:
            cand = (step.batch_size, padded + len(step.token_times_ns), 0)
        if self.max_kv is None or cand[0] * (cand[1] + cand[2]) > self.max_kv[0] * (self.max_kv[1] + self.max_kv[2]):
            self.max_kv = cand

    def _architecture(self, model: Any) -> Any:
        if model is None or id(model) == self._arch_of:
            return self._arch
        from perfsdk.models.arch import UnsupportedArchitecture, architecture_from_config

        self._arch_of = id(model)
        cfg = getattr(model, "config", None)
        try:
            self._arch = architecture_from_config(cfg) if cfg is not None else None
        except (UnsupportedArchitecture, TypeError, ValueError):
            self._arch = None
        return self._arch

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> MemoryResult:
        self.end = process_tree_rss(self._proc)
        if self._statm is not None:
            self._statm.close()
            self._statm = None
        self.peak = max(self.peak, self.end)
        info = session.model_info
        cuda = self._cuda()
        kv = kv_tok = None
        kv_source = None
        kv_ctx = self.max_kv[1] if self.max_kv else None
        kv_batch = self.max_kv[0] if self.max_kv else None
        if self.measured_kv is not None:
            kv, kv_batch, kv_ctx = self.measured_kv
            kv_source = "cache tensors"
            if self._arch is not None:  # per new position, from the description (windows, cross-attention)
                elem = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(
                    (info.dtype if info else None) or "float32", 4)
                kv_tok = self._arch.kv_cache_bytes(1, 1, elem)
            elif kv_ctx and kv_batch:  # the average over the cached positions
                kv_tok = kv // (kv_ctx * kv_batch)
        elif self._arch is not None and self.max_kv is not None:
            # KV cache from the architecture: per-layer sliding windows, GQA/MQA heads, latent
            # attention, cross-attention; in the model's dtype
            elem = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get((info.dtype if info else None)
                                                                                 or "float32", 4)
            b, ctx, enc = self.max_kv
            kv = self._arch.kv_cache_bytes(b, ctx, elem, encoder_tokens=enc)
            kv_tok = self._arch.kv_cache_bytes(1, 1, elem)
            kv_source = "architecture"
        return MemoryResult(
            rss_peak_bytes=max(self.peak, self.end),
            rss_start_bytes=self.start,
            rss_end_bytes=self.end,
            rss_peak_by_phase_bytes=dict(self.by_phase),
            cuda_peak_allocated_bytes=int(cuda.max_memory_allocated(session.device)) if cuda else None,
            cuda_peak_reserved_bytes=int(cuda.max_memory_reserved(session.device)) if cuda else None,
            cuda_peak_allocated_by_phase_bytes=dict(self.cuda_by_phase),
            cuda_status="ok" if cuda else "unavailable: model not on CUDA",
            weights_bytes=info.weights_bytes if info else None,
            kv_cache_bytes=kv,
            kv_cache_bytes_per_token=kv_tok,
            kv_cache_context_tokens=kv_ctx,
            kv_cache_batch_size=kv_batch,
            kv_cache_source=kv_source,
            samples=self.samples,
        )


    # -- presentation ---------------------------------------------------------------------------

    @classmethod
    def summary_rows(cls, result: MemoryResult) -> list[tuple[str, str]]:
        from perfsdk.fmt import fmt_bytes

        rows = [("peak RSS", fmt_bytes(result.rss_peak_bytes)), ("weights", fmt_bytes(result.weights_bytes)),
                ("KV cache (largest batch)", fmt_bytes(result.kv_cache_bytes))]
        if result.cuda_peak_allocated_bytes is not None:
            rows.append(("CUDA peak allocated", fmt_bytes(result.cuda_peak_allocated_bytes)))
        return rows

    @classmethod
    def report_section(cls, result: MemoryResult, run: Any) -> ReportSection:
        sec = ReportSection("Memory")
        rows: list[tuple[str, int | None]] = [
            ("peak RSS", result.rss_peak_bytes), ("RSS at start", result.rss_start_bytes),
            ("RSS at end", result.rss_end_bytes), ("weights", result.weights_bytes),
            ("KV cache (largest batch)", result.kv_cache_bytes),
            ("CUDA peak allocated", result.cuda_peak_allocated_bytes),
            ("CUDA peak reserved", result.cuda_peak_reserved_bytes)]
        sec.html.append(html_table(["figure", "MiB"], [[k, _mib(v)] for k, v in rows], "kv"))
        phases = sorted(set(result.rss_peak_by_phase_bytes) | set(result.cuda_peak_allocated_by_phase_bytes))
        if phases:
            sec.html.append(html_table(
                ["phase", "peak RSS MiB", "CUDA peak allocated MiB"],
                [[p, _mib(result.rss_peak_by_phase_bytes.get(p)), _mib(result.cuda_peak_allocated_by_phase_bytes.get(p))]
                 for p in phases]))
        if result.cuda_status != "ok":
            sec.notes.append(f"CUDA memory {result.cuda_status}")
        return sec

    # -- distributed runs -----------------------------------------------------------------------

    @classmethod
    def merge_ranks(cls, shares: list[RankShare]) -> MemoryResult:
        """Peaks are the largest rank's (each rank is its own process tree); every rank's own
        figures stay in the run's ``ranks`` entries."""
        results: list[MemoryResult] = [s.result for s in shares]

        def mx(vals: list[int | None]) -> int | None:
            got = [v for v in vals if v is not None]
            return max(got) if got else None

        def mx_dict(dicts: list[dict[str, int]]) -> dict[str, int]:
            out: dict[str, int] = {}
            for d in dicts:
                for k, v in d.items():
                    out[k] = max(out.get(k, v), v)
            return out

        return results[0].model_copy(update={
            "rss_peak_bytes": mx([r.rss_peak_bytes for r in results]),
            "rss_peak_by_phase_bytes": mx_dict([r.rss_peak_by_phase_bytes for r in results]),
            "cuda_peak_allocated_bytes": mx([r.cuda_peak_allocated_bytes for r in results]),
            "cuda_peak_reserved_bytes": mx([r.cuda_peak_reserved_bytes for r in results]),
            "cuda_peak_allocated_by_phase_bytes": mx_dict([r.cuda_peak_allocated_by_phase_bytes for r in results]),
            "kv_cache_bytes": mx([r.kv_cache_bytes for r in results]),
            "samples": sum(r.samples for r in results),
        })


def _mib(v: int | None) -> float | None:
    return v / 2**20 if v is not None else None


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(MemoryCollector)

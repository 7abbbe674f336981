"""The one clock every collector shares, CUDA-aware.

``time.perf_counter_ns`` is monotonic and has sub-microsecond resolution. Before reading it at a
window edge on CUDA, the device is synchronized: a bare host timer around asynchronous kernels
measures launch time, not run time.
"""

from __future__ import annotations

import time
from typing import Any


class Clock:
    """Monotonic nanosecond clock; ``now_ns(sync=True)`` synchronizes CUDA first when in use."""

    def __init__(self) -> None:
        self.cuda_devices: set[int] = set()
        self.origin_ns = time.perf_counter_ns()

    def use_device(self, device: Any) -> None:
        """Remember that work runs on ``device`` so edges synchronize it."""
        try:
            import torch

            dev = torch.device(device)
        except Exception:
            return
        if dev.type == "cuda":
            self.cuda_devices.add(dev.index if dev.index is not None else torch.cuda.current_device())

    def synchronize(self) -> None:
        if not self.cuda_devices:
            return
        import torch

        for idx in self.cuda_devices:
            torch.cuda.synchronize(idx)

    def now_ns(self, sync: bool = False) -> int:
        if sync and self.cuda_devices:
            self.synchronize()
        return time.perf_counter_ns()

    def since_origin_s(self, t_ns: int) -> float:
        return (t_ns - self.origin_ns) / 1e9

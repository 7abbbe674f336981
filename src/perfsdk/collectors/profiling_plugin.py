"""Built-in plugin: the opt-in ``layers`` and ``torch_profiler`` collectors."""

from __future__ import annotations

from typing import Callable

from perfsdk.collectors.layers import LayersCollector
from perfsdk.collectors.torch_profiler import TorchProfilerCollector
from perfsdk.plugins import hookimpl


@hookimpl
def perfsdk_register_collectors(register: Callable[[type], None]) -> None:
    """Register the per-layer timing and operator profiling collectors."""
    register(LayersCollector)
    register(TorchProfilerCollector)

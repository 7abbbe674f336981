"""Built-in plugin: the opt-in ``layers`` and ``torch_profiler`` collectors, and the
``perfsdk layers`` command."""

from __future__ import annotations

from typing import Any, Callable

import click

from perfsdk.collectors.layers import LayersCollector
from perfsdk.collectors.torch_profiler import TorchProfilerCollector
from perfsdk.plugins import hookimpl


@hookimpl
def perfsdk_register_collectors(register: Callable[[type], None]) -> None:
    """Register the per-layer timing and operator profiling collectors."""
    register(LayersCollector)
    register(TorchProfilerCollector)


@hookimpl
def perfsdk_register_commands(cli: click.Group) -> None:
    """Add ``perfsdk layers RUN``."""
    from perfsdk.collectors.layers.cli import layers_command

    cli.add_command(layers_command)

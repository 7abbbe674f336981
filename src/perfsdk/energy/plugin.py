"""Built-in plugin registering the ``energy`` and ``utilization`` collectors."""

from __future__ import annotations

from collections.abc import Callable

from perfsdk.plugins import hookimpl


@hookimpl
def perfsdk_register_collectors(register: Callable[[type], None]) -> None:
    """Register the energy and utilization collectors."""
    from perfsdk.collectors.energy import EnergyCollector
    from perfsdk.collectors.utilization import UtilizationCollector

    register(EnergyCollector)
    register(UtilizationCollector)

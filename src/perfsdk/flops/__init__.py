"""FLOPs: exact counts of real runs, weightless counts on the meta device, and the analytic model.

- :mod:`perfsdk.flops.analytic` — the transformer formula from the model's
  :class:`~perfsdk.models.arch.Architecture` (read from its ``transformers`` config).
- :mod:`perfsdk.flops.counter` — the ``torch`` (dispatch-level), ``ptflops``, ``fvcore`` and
  ``analytic`` backends and their common :class:`~perfsdk.flops.counter.FlopsCount`.
- :mod:`perfsdk.flops.meta` — architectures on the meta device (local, built-in, bundled configs).
- :mod:`perfsdk.flops.count` — counting a configuration by name (``perfsdk flops``); the opt-in
  ``flops`` collector is :mod:`perfsdk.collectors.flops`.

The counting convention is stated once in :mod:`perfsdk.capture` (``CONVENTION``).
"""

from __future__ import annotations

from perfsdk.capture import CONVENTION
from perfsdk.flops.analytic import analytic_forward, analytic_generate
from perfsdk.flops.counter import FlopsCount, count_forward, count_generate

__all__ = [
    "CONVENTION",
    "FlopsCount",
    "analytic_forward",
    "analytic_generate",
    "count_forward",
    "count_generate",
]

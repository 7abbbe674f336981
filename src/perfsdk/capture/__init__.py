"""Operation capture and the operation record.

- :mod:`perfsdk.capture.ops` — :class:`OpRecord`, one captured tensor operation with its cost
  drivers (FLOPs, MACs, bytes, elements), module path, phase and step;
- :mod:`perfsdk.capture.recorder` — :class:`OperationCapture`, which records them from a real or
  meta-device run, and the counting convention shared by FLOPs and simulation;
- :mod:`perfsdk.capture.totals` — sums over records (per phase, category, module, forward).
"""

from perfsdk.capture.ops import OpCategory, OpRecord, Phase
from perfsdk.capture.recorder import (CONVENTION, PHASE_ORDER, OperationCapture, attention_macs, attention_scores,
                                      broadcast_attention_extra, capture_generate, matmul_macs)
from perfsdk.capture.totals import (
    forwards_summary,
    iter_records,
    totals_by_category,
    totals_by_module,
    totals_by_module_type,
    totals_by_phase,
)

__all__ = [
    "CONVENTION",
    "OpCategory",
    "OpRecord",
    "OperationCapture",
    "PHASE_ORDER",
    "Phase",
    "attention_macs",
    "attention_scores",
    "broadcast_attention_extra",
    "capture_generate",
    "forwards_summary",
    "iter_records",
    "matmul_macs",
    "totals_by_category",
    "totals_by_module",
    "totals_by_module_type",
    "totals_by_phase",
]

"""Per-function accounting: matmul, attention, softmax, activation and normalization operations,
counted and timed through the shared operation capture (``perfsdk.capture``).

The capture sees every ATen operation the model runs, with the module it ran in; given a clock
it also times each operation (the clock read right before and right after it, synchronizing
CUDA when the model runs there). Rows are grouped per module and kind, per kind, and per
operation (``aten.softmax``, ``aten.linear`` ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfsdk.collectors.layers.hooks import ROOT_PATH
from perfsdk.collectors.layers.result import FunctionOpRow, FunctionRow, FunctionTotalRow

#: Operation kinds counted by per-function accounting (``attention`` is a fused QK^T/softmax/PV
#: kernel, or the matrix products of an eager attention; ``norm`` includes the elementwise
#: operations inside a normalization module such as Llama's RMSNorm).
FUNCTION_CATEGORIES = ("matmul", "attention", "softmax", "activation", "norm")

#: How each kind is named in tables.
CATEGORY_LABELS = {"matmul": "matmul", "attention": "attention", "softmax": "softmax", "activation": "activation",
                   "norm": "normalization"}


def open_capture(model: Any, kind: str, step_index: int, clock: Callable[[], int] | None = None) -> Any:
    """Start the shared operation capture on ``model`` for one step (timing each op on ``clock``)."""
    from perfsdk.capture import OperationCapture

    cap = OperationCapture(model, auto_phase=kind == "generate", phase="forward", step=step_index, op_clock=clock)
    cap.__enter__()
    return cap


def close_capture(cap: Any) -> list[Any]:
    """Stop the capture (removing its hooks) and return its operation records."""
    cap.__exit__(None, None, None)
    return list(cap.records)


def _add_time(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None else a + b


def function_rows(ops: list[Any], step_time_s: float) -> dict[str, Any]:
    """``per_function``, ``per_function_totals`` and ``per_function_ops`` from capture records."""
    agg: dict[tuple[str, str | None, str, str], list[Any]] = {}
    tot: dict[tuple[str, str], list[Any]] = {}
    by_op: dict[tuple[str, str, str], list[Any]] = {}
    for op in ops:
        cat = op.category
        if cat not in FUNCTION_CATEGORIES:
            continue
        nbytes = int(op.bytes_read) + int(op.bytes_written)
        phase = str(op.phase)
        for acc in (agg.setdefault((op.module_path or ROOT_PATH, op.module_type, phase, cat), [0, 0, 0, 0, None]),
                    tot.setdefault((phase, cat), [0, 0, 0, 0, None])):
            acc[0] += 1
            acc[1] += int(op.flops)
            acc[2] += int(op.elements)
            acc[3] += nbytes
            acc[4] = _add_time(acc[4], op.time_s)
        o = by_op.setdefault((phase, cat, op.op), [0, None, 0, [list(s) for s in op.input_shapes]])
        o[0] += 1
        o[1] = _add_time(o[1], op.time_s)
        o[2] += int(op.flops)

    def share(t: float | None) -> float | None:
        return t / step_time_s * 100.0 if t is not None and step_time_s > 0 else None

    order = {c: i for i, c in enumerate(FUNCTION_CATEGORIES)}
    rows = [FunctionRow(path=p, module_type=mt, phase=ph, category=c, ops=v[0], flops=v[1], elements=v[2], bytes=v[3],
                        time_s=v[4]) for (p, mt, ph, c), v in agg.items()]
    rows.sort(key=lambda r: (r.phase, r.path, r.category))
    totals = [FunctionTotalRow(phase=ph, category=c, ops=v[0], flops=v[1], elements=v[2], bytes=v[3], time_s=v[4],
                               share_pct=share(v[4]))
              for (ph, c), v in sorted(tot.items(), key=lambda kv: (kv[0][0], order[kv[0][1]]))]
    op_rows = [FunctionOpRow(phase=ph, category=c, op=name, calls=v[0], time_s=v[1],
                             mean_s=v[1] / v[0] if v[1] is not None else None, share_pct=share(v[1]), flops=v[2],
                             input_shapes=v[3])
               for (ph, c, name), v in by_op.items()]
    op_rows.sort(key=lambda r: (r.phase, -(r.time_s or 0.0), r.op))
    return {"per_function": rows, "per_function_totals": totals, "per_function_ops": op_rows}

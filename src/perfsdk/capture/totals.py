"""Sums over captured operations: per phase, category, module, module type and forward pass."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from perfsdk.capture.ops import OpRecord
from perfsdk.capture.recorder import PHASE_ORDER


def _empty() -> dict[str, int]:
    return {"flops": 0, "macs": 0, "bytes_read": 0, "bytes_written": 0, "weight_bytes": 0, "kv_bytes": 0,
            "elements": 0, "ops": 0}


def _add(acc: dict[str, int], r: OpRecord) -> None:
    acc["flops"] += r.flops
    acc["macs"] += r.macs
    acc["bytes_read"] += r.bytes_read
    acc["bytes_written"] += r.bytes_written
    acc["weight_bytes"] += r.weight_bytes
    acc["kv_bytes"] += r.kv_bytes
    acc["elements"] += r.elements
    acc["ops"] += 1


def totals_by_phase(records: Iterable[OpRecord]) -> dict[str, dict[str, int]]:
    """Sums per phase (``encode``/``prefill``/``decode``/``forward``) plus ``total``."""
    out: dict[str, dict[str, int]] = defaultdict(_empty)
    total = _empty()
    for r in records:
        _add(out[r.phase], r)
        _add(total, r)
    res = dict(out)
    res["total"] = total
    return res


def totals_by_category(records: Iterable[OpRecord]) -> dict[str, dict[str, int]]:
    """Sums per operation category."""
    out: dict[str, dict[str, int]] = defaultdict(_empty)
    for r in records:
        _add(out[r.category], r)
    return dict(out)


def totals_by_module(records: Iterable[OpRecord], top: int | None = None, key: str = "flops",
                     depth: int | None = None) -> list[tuple[str, dict[str, int]]]:
    """Sums per module path, largest ``key`` first (``top`` of them).

    ``depth`` truncates paths to that many dotted components (``model.layers.0`` for 3).
    """
    out: dict[str, dict[str, int]] = defaultdict(_empty)
    for r in records:
        path = r.module_path
        if depth is not None:
            path = ".".join(path.split(".")[:depth])
        _add(out[path], r)
    items = sorted(out.items(), key=lambda kv: (-kv[1][key], kv[0]))
    return items[:top] if top is not None else items


def totals_by_module_type(records: Iterable[OpRecord]) -> dict[str, dict[str, int]]:
    """Sums per module class name (``Linear``, ``LlamaAttention``, …)."""
    out: dict[str, dict[str, int]] = defaultdict(_empty)
    for r in records:
        _add(out[r.module_type or "?"], r)
    return dict(out)


def forwards_summary(records: Iterable[OpRecord]) -> list[dict[str, Any]]:
    """One row per (phase, step): FLOPs, MACs and context length of that forward pass."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        row = rows.setdefault((r.phase, r.step), {"phase": r.phase, "step": r.step, "context_len": r.context_len,
                                                  "flops": 0, "macs": 0})
        row["flops"] += r.flops
        row["macs"] += r.macs
    return sorted(rows.values(), key=lambda x: (PHASE_ORDER.get(x["phase"], len(PHASE_ORDER)), x["step"]))


def iter_records(records: Iterable[OpRecord], phase: str | None = None,
                 category: str | None = None) -> Iterator[OpRecord]:
    """Filter records by phase and/or category."""
    for r in records:
        if phase is not None and r.phase != phase:
            continue
        if category is not None and r.category != category:
            continue
        yield r

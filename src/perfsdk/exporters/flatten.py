"""Flatten runs into rows: nested fields joined with dots, key columns first."""

from __future__ import annotations

import json
from typing import Any

from perfsdk.schemas import RunResult

#: Columns that lead every tabular export, in this order (absent ones are skipped).
KEY_COLUMNS = [
    "run_id",
    "name",
    "status",
    "validity.verdict",
    "started_at",
    "model.model_id",
    "model.dtype",
    "model.quantization",
    "workload.batch_size",
    "workload.max_new_tokens",
    "collectors.latency.output_tokens_per_s",
    "collectors.latency.total_tokens_per_s",
    "collectors.latency.requests_per_s",
    "collectors.latency.ttft_s.p50",
    "collectors.latency.ttft_s.p95",
    "collectors.latency.tpot_s.p50",
    "collectors.latency.tpot_s.p95",
    "collectors.latency.itl_s.p50",
    "collectors.latency.e2e_s.p50",
    "collectors.memory.rss_peak_bytes",
    "collectors.energy.j_per_output_token",
]

#: Characters that make a spreadsheet treat a cell as a formula.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def flatten(data: Any, prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become JSON strings."""
    if out is None:
        out = {}
    if isinstance(data, dict):
        if not data and prefix:
            out[prefix] = None
        for k, v in data.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(data, (list, tuple)):
        out[prefix] = json.dumps(data, default=str, separators=(",", ":"))
    else:
        out[prefix] = data
    return out


def run_row(run: RunResult) -> dict[str, Any]:
    """One flat row for a run. Records become ``records.<name>`` columns."""
    data = run.model_dump(mode="json", exclude={"records", "series", "artifacts"})
    row = flatten(data)
    for rec in run.records:
        row[f"records.{rec.name}"] = rec.value
    return row


def ordered_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Key columns first (those present), then all others in sorted order."""
    present: set[str] = set()
    for r in rows:
        present.update(r)
    head = [c for c in KEY_COLUMNS if c in present]
    rest = sorted(present - set(head))
    return head + rest


def rows_for(runs: list[RunResult]) -> tuple[list[str], list[dict[str, Any]]]:
    rows = [run_row(r) for r in runs]
    return ordered_columns(rows), rows


def spreadsheet_safe(value: Any) -> Any:
    """Neutralize text that a spreadsheet would run as a formula by prefixing a quote."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value

"""Flatten runs into rows: nested fields joined with dots, key columns first."""

from __future__ import annotations

import json
from typing import Any

from perfsdk.schemas import RunResult

#: Run-level columns that lead every tabular export, in this order (absent ones are skipped).
#: Each collector's own ``key_columns`` follow them (see :func:`key_columns`).
RUN_KEY_COLUMNS = [
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
]


def key_columns(registry: Any = None) -> list[str]:
    """The leading columns: run-level ones, then each installed collector's declared
    ``key_columns`` as ``collectors.<name>.<path>`` (collectors in registration order)."""
    from perfsdk.plugins import installed_registry, ordered_collectors

    reg = registry or installed_registry()
    cols = list(RUN_KEY_COLUMNS)
    for name in ordered_collectors(reg.collectors, reg):
        cols += [f"collectors.{name}.{path}" for path in reg.collectors[name].key_columns]
    return cols


def __getattr__(name: str) -> Any:
    if name == "KEY_COLUMNS":  # the leading columns with the collectors installed now
        return key_columns()
    raise AttributeError(name)


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
    data = run.model_dump(mode="json", exclude={"records", "series", "artifacts", "collector_meta"})
    row = flatten(data)
    for cname, meta in run.collector_meta.items():  # only what changes how a value reads
        if meta.scope != "process":
            row[f"collector_meta.{cname}.scope"] = meta.scope
    for rec in run.records:
        row[f"records.{rec.name}"] = rec.value
    return row


def ordered_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Key columns first (those present), then all others in sorted order."""
    present: set[str] = set()
    for r in rows:
        present.update(r)
    head = [c for c in key_columns() if c in present]
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

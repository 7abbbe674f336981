"""Built-in exporters: json, jsonl, csv, markdown, parquet — registered like any plugin."""

from __future__ import annotations

import csv
import json
from typing import IO, Any, Callable

import structlog

from perfsdk.collector import Exporter
from perfsdk.exporters.flatten import rows_for, spreadsheet_safe
from perfsdk.plugins import hookimpl
from perfsdk.schemas import RunResult

log = structlog.get_logger("perfsdk.exporters")


def _guard(name: str, fn: Callable[[], None]) -> bool:
    try:
        fn()
        return True
    except Exception as exc:
        log.error("export failed", exporter=name, error=repr(exc))
        return False


class JsonExporter(Exporter):
    """A JSON array of full run results (a single object when exporting one run)."""

    name = "json"
    extension = "json"
    description = "full results as JSON"

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:
        def go() -> None:
            data = [r.model_dump(mode="json") for r in runs]
            json.dump(data[0] if len(data) == 1 else data, stream, indent=2)
            stream.write("\n")

        return _guard(self.name, go)


class JsonlExporter(Exporter):
    """One full run result per line."""

    name = "jsonl"
    extension = "jsonl"
    description = "full results, one JSON object per line"

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:
        def go() -> None:
            for r in runs:
                stream.write(r.model_dump_json())
                stream.write("\n")

        return _guard(self.name, go)


class CsvExporter(Exporter):
    """One row per run, nested fields flattened with dots, key columns first.

    Text cells that start with ``= + - @`` (or tab/CR) are prefixed with ``'`` so that a
    spreadsheet shows them instead of evaluating them; numbers are written as numbers.
    """

    name = "csv"
    extension = "csv"
    description = "one row per run, flattened, key columns first"

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:
        def go() -> None:
            cols, rows = rows_for(runs)
            # "\r\n" (RFC 4180): with "\n" alone, a field holding a bare "\r" is written unquoted and breaks readers
            w = csv.DictWriter(stream, fieldnames=cols, extrasaction="ignore", lineterminator="\r\n")
            w.writeheader()
            for row in rows:
                w.writerow({k: spreadsheet_safe(v) for k, v in row.items()})

        return _guard(self.name, go)


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


class MarkdownExporter(Exporter):
    """A Markdown table of the key columns, one row per run."""

    name = "markdown"
    extension = "md"
    description = "key columns as a Markdown table"

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:
        from perfsdk.exporters.flatten import key_columns

        def go() -> None:
            cols, rows = rows_for(runs)
            keys = [c for c in key_columns() if c in cols]
            stream.write("| " + " | ".join(keys) + " |\n")
            stream.write("|" + "|".join("---" for _ in keys) + "|\n")
            for row in rows:
                stream.write("| " + " | ".join(_fmt(row.get(k)) for k in keys) + " |\n")

        return _guard(self.name, go)


class ParquetExporter(Exporter):
    """One row per run, flattened like CSV, as Parquet (needs pyarrow: ``pip install perfsdk[parquet]``)."""

    name = "parquet"
    extension = "parquet"
    binary = True
    description = "one row per run, flattened (needs pyarrow)"

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            log.error("parquet export needs pyarrow: pip install 'perfsdk[parquet]'")
            return False

        def go() -> None:
            cols, rows = rows_for(runs)
            arrays = {}
            for c in cols:
                vals = [r.get(c) for r in rows]
                kinds = {type(v) for v in vals if v is not None}
                if kinds <= {int, float} and kinds:
                    vals = [float(v) if v is not None and kinds == {int, float} else v for v in vals]
                elif len(kinds) > 1:
                    vals = [None if v is None else str(v) for v in vals]
                arrays[c] = vals
            table = pa.table(arrays) if cols else pa.table({"run_id": []})
            pq.write_table(table, stream)

        return _guard(self.name, go)


BUILTIN_EXPORTERS = [JsonExporter, JsonlExporter, CsvExporter, MarkdownExporter, ParquetExporter]


@hookimpl
def perfsdk_register_exporters(register: Callable[[type], None]) -> None:
    for cls in BUILTIN_EXPORTERS:
        register(cls)

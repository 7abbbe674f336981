"""Exporters: CSV columns and order, flattening, JSON round-trip, Markdown, Parquet."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

import perfsdk

from perfsdk.exporters.builtin import CsvExporter, JsonExporter, JsonlExporter, MarkdownExporter, ParquetExporter
from perfsdk.exporters.flatten import KEY_COLUMNS, flatten, run_row
from perfsdk.schemas import Record, RunResult


def _run(i: int = 0, **kw) -> RunResult:
    data = dict(
        run_id=f"20260101T00000{i}-aaaaaaaaaaaa", name=f"bench{i}", status="ok",
        started_at=datetime(2026, 1, 1, tzinfo=timezone.utc), perfsdk_version="0.1.0",
        collectors={"latency": {"output_tokens_per_s": 100.0 + i, "ttft_s": {"p50": 0.01, "count": 4}},
                    "mything": {"value_j": 3, "items": [1, 2]}},
        records=[Record(name="accuracy", value=0.5, unit="ratio")],
    )
    data.update(kw)
    return RunResult(**data)


def test_flatten_nested_and_lists():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "l": [1, 2]}) == {"a.b": 1, "a.c.d": "x", "l": "[1,2]"}


def test_csv_one_row_per_run_key_columns_first():
    buf = io.StringIO()
    assert CsvExporter().export([_run(0), _run(1)], buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    header = buf.getvalue().splitlines()[0].split(",")
    assert header[:4] == ["run_id", "name", "status", "started_at"]
    present_keys = [c for c in KEY_COLUMNS if c in header]
    assert header[: len(present_keys)] == present_keys
    assert len(rows) == 2
    assert rows[1]["collectors.latency.output_tokens_per_s"] == "101.0"
    assert rows[0]["collectors.latency.ttft_s.p50"] == "0.01"
    assert rows[0]["collectors.mything.value_j"] == "3"
    assert rows[0]["collectors.mything.items"] == "[1,2]"
    assert rows[0]["records.accuracy"] == "0.5"


def test_csv_neutralizes_formulas():
    buf = io.StringIO()
    CsvExporter().export([_run(0, name="=HYPERLINK(\"x\")", tags={"a": "+1", "b": "@cmd", "c": "-2", "d": "plain"})], buf)
    row = next(csv.DictReader(io.StringIO(buf.getvalue())))
    assert row["name"] == "'=HYPERLINK(\"x\")"
    assert row["tags.a"] == "'+1" and row["tags.b"] == "'@cmd" and row["tags.c"] == "'-2"
    assert row["tags.d"] == "plain"


def test_json_and_jsonl_roundtrip():
    runs = [_run(0), _run(1)]
    buf = io.StringIO()
    JsonExporter().export(runs, buf)
    assert [RunResult.model_validate(d) for d in json.loads(buf.getvalue())] == runs
    one = io.StringIO()
    JsonExporter().export(runs[:1], one)
    assert RunResult.model_validate_json(one.getvalue()) == runs[0]
    jl = io.StringIO()
    JsonlExporter().export(runs, jl)
    assert [RunResult.model_validate_json(line) for line in jl.getvalue().splitlines()] == runs


def test_markdown_table():
    buf = io.StringIO()
    MarkdownExporter().export([_run(0)], buf)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("| run_id | name | status")
    assert lines[1].startswith("|---|")
    assert "| bench0 |" in lines[2]


def test_parquet_roundtrip():
    pq = pytest.importorskip("pyarrow.parquet")
    buf = io.BytesIO()
    assert ParquetExporter().export([_run(0), _run(1)], buf)
    table = pq.read_table(io.BytesIO(buf.getvalue()))
    assert table.num_rows == 2
    assert table.column("collectors.latency.output_tokens_per_s").to_pylist() == [100.0, 101.0]
    assert table.column_names[0] == "run_id"


def test_run_row_has_environment_and_config():
    row = run_row(_run(0, config={"workload": {"batching": {"batch_size": 4}}}))
    assert row["config.workload.batching.batch_size"] == 4
    assert "environment.python" in row


# -- exporters that send runs to a destination (a tracking server, a database) ---------------------

class _Sent(perfsdk.Exporter):
    """Records what it was given instead of sending it anywhere."""

    name = "sent"
    destination = True
    calls: list[tuple[list[str], str, str | None]] = []

    def export_to(self, runs, destination, store):
        type(self).calls.append(([r.run_id for r in runs], destination, str(store.root) if store else None))
        return destination != "refuse://"


class _SentPlugin:
    @perfsdk.hookimpl
    def perfsdk_register_exporters(self, register):
        register(_Sent)


@pytest.fixture
def sent(monkeypatch, tmp_path):
    import perfsdk.plugins
    from perfsdk.store import Store

    real = perfsdk.plugins.get_plugin_manager
    monkeypatch.setattr(perfsdk.plugins, "get_plugin_manager", lambda **kw: real(extra_plugins=[_SentPlugin()], **kw))
    _Sent.calls = []
    store = Store(tmp_path / "store")
    for i in (0, 1):
        store.save(_run(i))
    return store


def test_destination_exporter_gets_output_and_store(sent, perfsdk_cli):
    r = perfsdk_cli(["export", "--format", "sent", "--output", "tracker://x", "--store", str(sent.root),
                     "--run", "20260101T000001-aaaaaaaaaaaa"])
    assert r.exit_code == 0
    assert "exported 1 run(s) to tracker://x" in r.output
    assert _Sent.calls == [(["20260101T000001-aaaaaaaaaaaa"], "tracker://x", str(sent.root))]
    assert not list(Path.cwd().glob("tracker:*"))  # the destination is not opened as a file


def test_destination_exporter_needs_output_and_reports_failure(sent, perfsdk_cli):
    r = perfsdk_cli(["export", "--format", "sent", "--store", str(sent.root)])
    assert r.exit_code == 2
    assert "perfsdk: error: format sent sends runs to a destination: give it with --output" in r.output
    assert _Sent.calls == []
    r = perfsdk_cli(["export", "--format", "sent", "--output", "refuse://", "--store", str(sent.root)])
    assert r.exit_code == 1
    assert "perfsdk: error: exporter sent failed" in r.output
    assert _Sent.calls == [(["20260101T000000-aaaaaaaaaaaa", "20260101T000001-aaaaaaaaaaaa"], "refuse://",
                            str(sent.root))]


def test_destination_exporter_is_not_a_run_folder_export(sent):
    from perfsdk.store import StoreError

    with pytest.raises(StoreError, match="exporter sent sends runs to a destination, not into the run folder: "
                                         "use perfsdk export --format sent --output DESTINATION"):
        sent.write_export("20260101T000000-aaaaaaaaaaaa", _Sent())
    assert not list(sent.run_dir("20260101T000000-aaaaaaaaaaaa").glob("export.*"))

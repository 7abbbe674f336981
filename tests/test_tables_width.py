"""Readable at 80 columns and when piped: tables wrap, fold or turn vertical; no value ends in "…"."""

from __future__ import annotations

import io
import json

import pytest
from rich.table import Table

from perfsdk.terminal import TableConsole, fit_table

RUN_IDS = ["20261103T101500-abcdef012345", "20261103T101502-0123456789ab"]


def _console(width: int = 80) -> tuple[TableConsole, io.StringIO]:
    buf = io.StringIO()
    return TableConsole(file=buf, width=width, color_system=None), buf


def _check_80(out: str) -> None:
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.fixture
def narrow(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def test_a_table_that_fits_is_left_alone():
    con, buf = _console()
    t = Table("metric", "value")
    t.add_row("TTFT", "8.029 ms")
    assert fit_table(t, con) is t and [c.width for c in t.columns] == [None, None]
    con.print(t)
    assert "│ TTFT   │ 8.029 ms │" in buf.getvalue()


def test_keep_whole_columns_and_folding():
    con, buf = _console()
    t = Table("run", "note", "value", show_edge=False)
    t.columns[0].no_wrap = True
    long_note = "a note long enough to need several lines at eighty columns, " * 2
    for rid in RUN_IDS:
        t.add_row(rid, long_note, "x" * 30)
    con.print(t)
    out = buf.getvalue()
    _check_80(out)
    for rid in RUN_IDS:
        assert out.count(rid) == 1  # ids are never split over lines
    assert out.count("x" * 16) == 2 and "x" * 31 not in out  # a 30-character word folds rather than "…"


def test_too_wide_turns_vertical():
    con, buf = _console()
    t = Table(*[f"column_{i}" for i in range(10)], title="wide")
    t.add_row(*[f"value-number-{i}" for i in range(10)])
    t.add_row(*[str(i) for i in range(10)])
    con.print(t)
    out = buf.getvalue()
    _check_80(out)
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["wide"]
    assert lines[1:11] == [[f"column_{i}", f"value-number-{i}"] for i in range(10)]
    assert lines[12:22] == [[f"column_{i}", str(i)] for i in range(10)]


def test_sweep_summary_keeps_run_ids_whole():
    from perfsdk.cli.experiments import print_sweep_summary

    points = [{"values": {"workload.batching.batch_size": b}, "status": "ok", "objectives": {
        "collectors.latency.output_tokens_per_s": 968.23456 * b, "collectors.latency.ttft_s.p95": 0.0123456},
        "feasible": True, "pareto": b == 2, "run_id": rid, "error": None} for b, rid in zip((1, 2), RUN_IDS)]
    manifest = {"sweep_id": "batch-sweep-1a2b3c4d", "status": "finished", "axes": ["workload.batching.batch_size"],
                "objectives": [{"field": "collectors.latency.output_tokens_per_s", "direction": "maximize"},
                               {"field": "collectors.latency.ttft_s.p95", "direction": "minimize"}],
                "constraints": [], "points": points, "pareto": [points[1]]}
    con, buf = _console()
    print_sweep_summary(manifest, con)
    out = buf.getvalue()
    _check_80(out)
    for rid in RUN_IDS:
        assert rid in out
    assert "968.2" in out and "1936" in out and "0.01235" in out


def test_simulate_at_80_columns(perfsdk_cli, narrow):
    args = ["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--top", "3"]
    r = perfsdk_cli(args)
    assert r.exit_code == 0, r.output
    out = r.output
    _check_80(out)
    from perfsdk.fmt import fmt_s as _fmt_s

    res = json.loads(perfsdk_cli([*args, "--json"]).output)
    for name, ph in res["phases"].items():
        for value in (name, _fmt_s(ph["time_s"]), _fmt_s(ph["memory_s"]), _fmt_s(ph["compute_s"]), ph["bound"]):
            assert value in out, value
    assert f"yes ({res['memory_required_bytes'] / 1e9:.2f} GB needed)" in out


def test_plugins_names_in_full(perfsdk_cli, narrow):
    r = perfsdk_cli(["plugins", "--all"])
    assert r.exit_code == 0
    _check_80(r.output)
    for row in json.loads(perfsdk_cli(["plugins", "--all", "--json"]).output):
        assert row["name"] in r.output.split()


def test_hardware_list_at_80_columns(perfsdk_cli, narrow):
    r = perfsdk_cli(["hardware", "list"])
    assert r.exit_code == 0
    _check_80(r.output)
    for row in json.loads(perfsdk_cli(["hardware", "list", "--json"]).output):
        assert row["name"] in r.output.split()


def test_run_summary_at_80_columns(perfsdk_cli, narrow, tmp_path):
    r = perfsdk_cli(["run", "--store", str(tmp_path), "--set", "workload.num_prompts=2",
                     "--set", "workload.generate.max_new_tokens=2", "--set", "workload.warmup_runs=0",
                     "--set", "workload.min_iterations=1", "--set", "collectors.simulation={}"])
    assert r.exit_code == 0, r.output
    _check_80(r.output)
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name in r.output and "TTFT" in r.output and "peak RSS" in r.output

"""Readable at 80 columns and when piped: tables wrap between words, leave out optional columns
(with a note; ``--wide`` keeps them) or turn vertical; no value ends in "…" or loses its unit."""

from __future__ import annotations

import io
import json

import pytest
from rich.table import Table

from perfsdk.terminal import TableConsole, fit_table, optional_columns, words

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
    assert out.count("x" * 30) == 2  # a 30-character word stays whole while it fits on a line


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


def _words(out: str) -> set[str]:
    return {w.strip("│┃") for line in out.splitlines() for w in line.split()}


def test_a_number_keeps_its_unit_when_text_wraps():
    assert words("179.5 J, 0.0184 g CO2") == ["179.5 J,", "0.0184 g", "CO2"]
    con, buf = _console(40)
    t = Table("what", "value")
    t.add_row("goodput", "1.23 req/s (95.0 % met ttft <= 200.00 ms, tpot <= 50.00 ms, e2e <= 2.500 s)")
    con.print(t)
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 40
    for value in ("1.23 req/s", "200.00 ms,", "50.00 ms,", "2.500 s)"):
        assert value in out, out


def test_optional_columns_are_left_out_with_a_note():
    t = Table("run", "note", "shape", "value", show_edge=False)
    t.columns[0].no_wrap = True
    for rid in RUN_IDS:
        t.add_row(rid, "short", "(4, 354, 256), (4, 1, 354, 354)", "model.layers.0.self_attn.q_proj")
    optional_columns(t, "shape")
    con, buf = _console(75)
    con.print(t)
    out = buf.getvalue()
    assert "(4, 354, 256)" not in out and out.count("model.layers.0.self_attn.q_proj") == 2
    assert out.splitlines()[-1].strip() == "left out to fit 75 columns: shape (--wide shows it)"
    con, buf = TableConsole(file=io.StringIO(), width=75, color_system=None, wide=True), None
    con.print(t)
    wide = con.file.getvalue()  # type: ignore[attr-defined]
    assert "(4, 354, 256), (4, 1, 354, 354)" in wide and "left out" not in wide


def test_run_latency_table_has_units_in_headers(perfsdk_cli, narrow, tmp_path):
    """At 80 columns ``make run`` split ``515.35`` from ``ms`` in the latency table."""
    args = ["run", "--store", str(tmp_path), "--set", "workload.num_prompts=4", "--set", "workload.warmup_runs=0",
            "--set", "workload.generate.max_new_tokens=4", "--set", "collectors.energy=false"]
    r = perfsdk_cli(args)
    assert r.exit_code == 0, r.output
    _check_80(r.output)
    lines = r.output.splitlines()
    head = next(line for line in lines if line.lstrip().startswith("metric"))
    assert [h.strip() for h in head.split("┃")] == ["metric", "count", "mean ms", "p50 ms", "p90 ms", "p95 ms",
                                                    "p99 ms", "max ms"]
    from perfsdk.fmt import fmt_bare
    from perfsdk.store import Store

    (run,) = Store(tmp_path).list_runs()
    lat = run.collectors["latency"]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "e2e")):
        row = next(line for line in lines if line.split()[:1] == [label])
        cells = [c.strip() for c in row.split("│")]
        assert cells[2:] == [fmt_bare(lat[key][q], 1e-3) for q in ("mean", "p50", "p90", "p95", "p99", "max")]
    assert not any(line.strip("│ ") in ("ms", "s", "µs") for line in lines)


def test_hardware_list_keeps_each_peak_with_its_dtype(perfsdk_cli, narrow):
    """``hardware list`` printed one word per line (about 70 lines)."""
    r = perfsdk_cli(["hardware", "list"])
    out = r.output
    _check_80(out)
    rows = json.loads(perfsdk_cli(["hardware", "list", "--json"]).output)
    assert len(out.splitlines()) <= 5 + sum(len(row["peak_tflops"]) for row in rows)
    for row in rows:
        for dtype, peak in row["peak_tflops"].items():
            assert f"│ {dtype} {peak:g} " in out
    assert out.splitlines()[-1].strip() == "left out to fit 80 columns: origin (--wide shows it)"
    assert "builtin" in perfsdk_cli(["hardware", "list", "--wide"]).output


def test_doctor_keeps_names_whole(perfsdk_cli, narrow):
    """``doctor`` split setting names such as ``collectors.energy.rapl_root`` mid-word."""
    from perfsdk.doctor import run_checks

    r = perfsdk_cli(["doctor"])
    assert r.exit_code == 0
    _check_80(r.output)
    seen = _words(r.output)
    for c in run_checks():
        assert c.name in seen
        for word in f"{c.reason or ''} {c.fix or ''}".split():
            assert word in seen, word


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two stored runs of the embedded model (small), for the commands that read a store."""
    import perfsdk

    store = tmp_path_factory.mktemp("store80")
    ids = []
    for n in (2, 3):
        with perfsdk.session({"name": f"w{n}", "workload": {"num_prompts": 2},
                              "collectors": {"utilization": False, "energy": False}}, store=str(store)) as s:
            m, t = s.load()
            for _ in range(3):
                s.generate(m, **s.tokenize(t, ["hello there"]), max_new_tokens=n)
        ids.append(s.result.run_id)
    return store, ids


@pytest.mark.parametrize("command", ["compare", "flops", "store check", "runs", "export markdown", "served run"])
def test_more_commands_at_80_columns(perfsdk_cli, narrow, two_runs, command, tmp_path):
    """Each command's output fits 80 columns, and the values and names it prints stay whole."""
    store, ids = two_runs
    if command == "compare":
        r = perfsdk_cli(["compare", ids[0], ids[1], "--store", str(store), "--allow-different"])
        whole = [ids[0], ids[1]]
    elif command == "flops":
        r = perfsdk_cli(["flops", "llama-2-7b", "-t", "512", "-g", "128"])
        whole = ["flops_per_decode_token", "flops_per_output_token", "deviation_pct"]
    elif command == "store check":
        r = perfsdk_cli(["store", "check", "--store", str(store)])
        whole = ["2 run(s);"]
    elif command == "runs":
        r = perfsdk_cli(["runs", "--store", str(store)])
        whole = [ids[0][-12:], ids[1][-12:]]
    elif command == "export markdown":
        r = perfsdk_cli(["export", "--format", "markdown", "--store", str(store), "--output", "-"])
        assert r.exit_code == 0, r.output
        assert ids[0] in r.output  # a markdown table is data, not a terminal table: only whole ids
        return
    else:
        from servers import FakeServer, completion_events

        fake = FakeServer(lambda body: completion_events(["a", "b"], usage=2))
        try:
            r = perfsdk_cli(["run", "--set", f"model.endpoint={fake.url}", "--set", "model.id=fake-model",
                             "--set", "workload.num_prompts=3", "--set", "workload.slo={ttft_s: 1}",
                             "--set", "collectors.utilization=false", "--set", "collectors.energy=false",
                             "--store", str(tmp_path / "s")])
        finally:
            fake.stop()
        whole = ["goodput", "concurrency reached", "token counts from"]
    assert r.exit_code in (0, 1), r.output
    _check_80(r.output)
    for w in whole:
        assert w in r.output, (w, r.output)

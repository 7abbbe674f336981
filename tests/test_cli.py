"""The CLI end to end: run, export, plugins, schema, doctor, exit codes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["--set", "workload.num_prompts=4", "--set", "workload.batching.batch_size=2",
         "--set", "workload.generate.max_new_tokens=4", "--set", "workload.warmup_runs=1",
         "--set", "workload.min_iterations=1"]


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory):
    """One quickstart-style run stored through the real console script."""
    store = tmp_path_factory.mktemp("store")
    proc = subprocess.run([sys.executable, "-m", "perfsdk", "run", "--store", str(store), *SMALL],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return store, proc.stdout


def test_run_prints_summary_and_stores(stored_run):
    store, out = stored_run
    for needle in ("TTFT", "TPOT", "ITL", "output tokens/s", "peak RSS", "status ok", "stored in",
                   "CodeCarbon estimate (session)"):
        assert needle in out
    # measured energy where a counter exists, otherwise the reason
    assert "energy J/token (measured)" in out or "energy (measured)" in out and "unavailable:" in out
    runs = list((store / "runs").iterdir())
    assert len(runs) == 1
    result = json.loads((runs[0] / "result.json").read_text())
    lat = result["collectors"]["latency"]
    assert result["status"] == "ok" and result["name"] == "quickstart"
    assert lat["requests"] == 4 and lat["steps"] == 2 and lat["warmup_steps"] == 1
    assert lat["output_tokens"] <= 16 and lat["output_tokens"] >= 4
    assert result["model"]["model_id"] == "builtin:tiny-llama"
    assert result["workload"]["batch_size"] == 2
    assert (runs[0] / "export.json").is_file()  # the configured exporter ran


def test_export_csv_to_stdout(stored_run, perfsdk_cli):
    store, _ = stored_run
    r = perfsdk_cli(["export", "--format", "csv", "--store", str(store)])
    assert r.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(r.output)))
    assert len(rows) == 1
    header = r.output.splitlines()[0].split(",")
    assert header[:3] == ["run_id", "name", "status"]
    assert float(rows[0]["collectors.latency.output_tokens_per_s"]) > 0
    assert float(rows[0]["collectors.latency.ttft_s.p50"]) > 0
    assert int(rows[0]["collectors.memory.rss_peak_bytes"]) > 0


@pytest.mark.parametrize("fmt,check", [
    ("json", lambda p: json.loads(p.read_text())["status"] == "ok"),
    ("jsonl", lambda p: len(p.read_text().splitlines()) == 1),
    ("markdown", lambda p: p.read_text().startswith("| run_id")),
    ("parquet", lambda p: p.read_bytes()[:4] == b"PAR1"),
])
def test_export_formats_to_file(stored_run, perfsdk_cli, tmp_path, fmt, check):
    store, _ = stored_run
    out = tmp_path / f"out.{fmt}"
    r = perfsdk_cli(["export", "--format", fmt, "--store", str(store), "--output", str(out)])
    assert r.exit_code == 0
    assert check(out)


def test_export_unknown_format_lists_valid(stored_run, perfsdk_cli):
    store, _ = stored_run
    r = perfsdk_cli(["export", "--format", "xlsx", "--store", str(store)])
    assert r.exit_code == 2
    assert "unknown format 'xlsx'" in r.output and "csv" in r.output and "parquet" in r.output


def test_export_selected_run_and_missing_run(stored_run, perfsdk_cli):
    store, _ = stored_run
    rid = next((store / "runs").iterdir()).name
    r = perfsdk_cli(["export", "--format", "jsonl", "--store", str(store), "--run", rid])
    assert json.loads(r.output)["run_id"] == rid
    r = perfsdk_cli(["export", "--format", "jsonl", "--store", str(store), "--run", "20990101T000000-000000000000"])
    assert r.exit_code == 2 and "not found" in r.output


@pytest.mark.parametrize("args,needle", [
    (["--set", "workload.batching.batch_size=-3"], "workload.batching.batch_size"),
    (["--set", "workload.bogus=1"], "workload.bogus: unknown key"),
    (["--set", "workload.num_prompts=abc"], "workload.num_prompts"),
    (["--set", "workload.prompts=/nonexistent/prompts.txt"], "workload.prompts: prompt file /nonexistent/prompts.txt not found"),
    (["--set", "collectors.nope={}"], "collectors.nope: unknown collector"),
])
def test_invalid_config_exit_2_nothing_stored(perfsdk_cli, tmp_path, args, needle):
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), *args])
    assert r.exit_code == 2
    assert needle in r.output
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())


def test_missing_config_file_exit_2(perfsdk_cli, tmp_path):
    r = perfsdk_cli(["run", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "config file not found" in r.output


def test_run_from_yaml_with_prompt_file(perfsdk_cli, tmp_path):
    (tmp_path / "p.txt").write_text("first prompt here\nsecond one\nthird prompt is a little longer\n")
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(
        "name: from-yaml\n"
        "workload:\n  prompts: p.txt\n  num_prompts: 3\n  batching: {batch_size: 3}\n"
        "  generate: {max_new_tokens: 3}\n  warmup_runs: 0\n  min_iterations: 1\n"
        "exporters: [json, csv]\n"
    )
    r = perfsdk_cli(["run", str(cfg), "--store", str(tmp_path / "s"), "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.output)
    assert result["name"] == "from-yaml"
    assert result["workload"]["num_prompts"] == 3
    assert result["collectors"]["latency"]["requests"] == 3
    run_dir = tmp_path / "s" / "runs" / result["run_id"]
    assert (run_dir / "export.csv").read_text().startswith("run_id,name,status")


def test_plugins_lists_builtins(perfsdk_cli):
    r = perfsdk_cli(["plugins", "--all", "--json"])
    rows = json.loads(r.output)
    collectors = {c for row in rows for c in row["collectors"]}
    exporters = {e for row in rows for e in row["exporters"]}
    assert {"latency", "memory"} <= collectors
    assert {"csv", "json", "jsonl", "markdown", "parquet"} <= exporters
    assert all(row["distribution"] for row in rows if row["builtin"])


def test_schema_command_writes_files(perfsdk_cli, tmp_path):
    r = perfsdk_cli(["schema", "--output-dir", str(tmp_path)])
    assert r.exit_code == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.schema.json", "run-result.schema.json"} <= names
    doc = json.loads((tmp_path / "run-result.schema.json").read_text())
    assert {"schema_version", "run_id", "status", "collectors", "ranks"} <= set(doc["properties"])


def test_doctor_reports_reasons(perfsdk_cli):
    r = perfsdk_cli(["doctor", "--json"])
    assert r.exit_code == 0
    checks = {c["name"]: c for c in json.loads(r.output)}
    assert any("cuda" in n.lower() for n in checks)
    for c in checks.values():
        assert c["available"] or c["reason"]


def test_trace_hooks_env_logs_hook_calls(tmp_path):
    env = {**os.environ, "PERFSDK_TRACE_HOOKS": "1"}
    code = "import perfsdk\nwith perfsdk.session(store=None) as s:\n    pass\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0
    log = proc.stdout + proc.stderr
    assert "perfsdk_session_start" in log and "perfsdk_finalize" in log


def test_bad_jsonl_prompt_line_exit_2_nothing_stored(perfsdk_cli, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"text": "no prompt field"}\n')
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), "--set", f"workload.prompts={prompts}"])
    assert r.exit_code == 2
    assert "p.jsonl" in r.output and "line 2" in r.output
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())

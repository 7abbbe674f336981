"""Files and folders follow the umask (a store shared by a team stays readable), while every
write stays atomic (temporary name, then rename)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from perfsdk.store import atomic_write, current_umask

SMALL = ["--set", "workload.num_prompts=2", "--set", "workload.batching.batch_size=2",
         "--set", "workload.generate.max_new_tokens=4", "--set", "workload.generate.min_new_tokens=4",
         "--set", "workload.warmup_runs=0",
         "--set", "workload.min_iterations=1", "--set", "exporters=[json, csv]"]


@pytest.fixture
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002], indirect=True)
def test_run_folder_results_series_artifacts_exports_and_reports(umask, perfsdk_cli, tmp_path, monkeypatch):
    assert current_umask() == umask
    files, dirs = 0o666 & ~umask, 0o777 & ~umask  # 0o644/0o755 under 022, 0o664/0o775 under 002
    # caps the series (token_times has 4 generated positions at least): writes the series_meta.json artifact
    monkeypatch.setenv("PERFSDK_SERIES_MAX_ROWS", "2")
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), "--quiet", *SMALL])
    assert r.exit_code == 0, r.output
    run_id = r.output.strip().splitlines()[-1]  # log warnings (capped series) come first
    run = store / "runs" / run_id
    assert _mode(store) == dirs and _mode(store / "runs") == dirs and _mode(run) == dirs
    assert _mode(run / "series") == dirs and _mode(run / "artifacts") == dirs
    series = sorted((run / "series").iterdir())
    assert series and {_mode(p) for p in series} == {files}
    assert _mode(run / "artifacts" / "series_meta.json") == files
    for name in ("result.json", "export.json", "export.csv"):
        assert _mode(run / name) == files, name
    assert _mode(store / "index.sqlite") == files
    assert not [p for p in (store / "runs").iterdir() if p.name.startswith(".tmp-")]

    out = tmp_path / "out" / "runs.csv"
    r = perfsdk_cli(["export", "--format", "csv", "--store", str(store), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert _mode(out) == files and _mode(out.parent) == dirs

    pytest.importorskip("matplotlib")
    html = tmp_path / "reports" / "run.html"
    r = perfsdk_cli(["report", "latest", "--store", str(store), "--output", str(html)])
    assert r.exit_code == 0, r.output
    assert _mode(html) == files and _mode(html.parent) == dirs
    figures = html.parent / "run_files"
    assert _mode(figures) == dirs and {_mode(p) for p in figures.iterdir()} <= {files}
    assert [p.name for p in html.parent.iterdir() if p.name.startswith(".tmp-")] == []


@pytest.mark.parametrize("umask", [0o077], indirect=True)
def test_a_private_umask_keeps_files_private(umask, tmp_path):
    target = tmp_path / "x.json"
    atomic_write(target, b"{}")
    assert _mode(target) == 0o600 and target.read_bytes() == b"{}"
    atomic_write(target, b"[1]")  # replaced in one rename
    assert _mode(target) == 0o600 and target.read_bytes() == b"[1]"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]

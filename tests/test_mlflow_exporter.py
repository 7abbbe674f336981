"""The perfsdk-mlflow plugin package: runs logged to a real MLflow tracking store (SQLite backend
in a temporary folder) and read back through the MLflow client.

The package is installed with ``pip install --target`` into a temporary folder, and the CLI runs in
a subprocess with that folder on ``PYTHONPATH``: nothing is installed into the test environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow", reason="the MLflow exporter test needs mlflow: pip install -e '.[dev]'")
pytest.importorskip("sqlalchemy")

import perfsdk  # noqa: E402
from perfsdk.exporters.flatten import run_row  # noqa: E402
from perfsdk.store import RESULT_FILE, Store  # noqa: E402

PKG = Path(__file__).resolve().parents[1] / "plugins" / "perfsdk-mlflow"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """perfsdk-mlflow installed into a temporary folder (built from a copy: the source tree stays clean)."""
    tmp = tmp_path_factory.mktemp("mlflow-plugin")
    src = tmp / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (target / "perfsdk_mlflow" / "plugin.py").is_file()
    return target


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two stored runs: a measured one (ok) and one that failed after recording a user metric."""
    from click.testing import CliRunner

    from perfsdk.cli import cli

    root = tmp_path_factory.mktemp("perfsdk") / "store"
    r = CliRunner().invoke(cli, ["run", "-q", "--store", str(root), "--set", "workload.num_prompts=2",
                                 "--set", "workload.batching.batch_size=2", "--set", "workload.generate.max_new_tokens=3",
                                 "--set", "workload.warmup_runs=0", "--set", "workload.min_iterations=1",
                                 "--set", "collectors.energy=false", "--set", "collectors.utilization=false",
                                 "--set", "tags.team=inference"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    with pytest.raises(RuntimeError, match="boom"):
        with perfsdk.session({"name": "exploded", "collectors": {"energy": False, "utilization": False},
                              "tags": {"mlflow.note": "kept"}},
                             store=root) as s:
            s.record("accuracy", 0.75, unit="ratio")
            raise RuntimeError("boom")
    return root


def _export(plugin_path: Path, cwd: Path, uri: str, store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    perfsdk_src = Path(perfsdk.__file__).resolve().parents[1]  # the perfsdk under test
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFSDK_", "MLFLOW_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_path), str(perfsdk_src)])
    return subprocess.run([sys.executable, "-m", "perfsdk", "export", "--format", "mlflow", "--output", uri,
                           "--store", str(store), *extra], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _runs(client: object) -> dict[str, object]:
    """perfsdk run id -> the MLflow run, over every experiment."""
    exps = [e.experiment_id for e in client.search_experiments()]  # type: ignore[attr-defined]
    runs = client.search_runs(exps)  # type: ignore[attr-defined]
    out = {r.data.tags["perfsdk.run_id"]: r for r in runs}
    assert len(out) == len(runs), "two MLflow runs for one perfsdk run"
    return out


def test_runs_logged_read_back_and_not_duplicated(plugin_path, store, tmp_path):
    from mlflow import MlflowClient

    st = Store(store)
    ok_run = st.list_runs(status="ok")[0]
    failed_run = st.list_runs(status="failed")[0]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)

    # 1. only the measured run
    p = _export(plugin_path, tmp_path, uri, store, "--run", ok_run.run_id)
    assert p.returncode == 0, p.stderr
    assert f"exported 1 run(s) to {uri}" in p.stderr
    runs = _runs(client)
    assert list(runs) == [ok_run.run_id]
    ml = client.get_run(runs[ok_run.run_id].info.run_id)

    # params: config and model, flattened, as text
    params = ml.data.params
    assert params["config.model.id"] == "builtin:tiny-llama"
    assert params["config.workload.num_prompts"] == "2"
    assert params["config.workload.generate.max_new_tokens"] == "3"
    assert params["config.workload.generate.top_k"] == "null"
    assert params["config.collectors.energy"] == "false"
    assert params["model.num_layers"] == str(ok_run.model.num_layers) == "4"
    assert params["model.parameters"] == str(ok_run.model.parameters)

    # metrics: the stored numbers, exactly
    metrics = ml.data.metrics
    lat = ok_run.collectors["latency"]
    assert metrics["collectors.latency.ttft_s.p50"] == lat["ttft_s"]["p50"]
    assert metrics["collectors.latency.output_tokens_per_s"] == lat["output_tokens_per_s"]
    assert metrics["collectors.memory.rss_peak_bytes"] == ok_run.collectors["memory"]["rss_peak_bytes"]
    assert metrics["workload.batch_size"] == 2
    for phase in ("prefill_s", "decode_s", "itl_s", "e2e_s"):  # phase statistics, all of them
        for stat in ("count", "mean", "std", "min", "p50", "p90", "p95", "p99", "max"):
            assert metrics[f"collectors.latency.{phase}.{stat}"] == lat[phase][stat]
    assert metrics["collectors.latency.decode_s.count"] == 2  # 2 requests
    assert metrics["collectors.latency.itl_s.count"] == 4  # 2 requests x (3 tokens - 1)
    # a statistic with no samples has no values: only its count is logged; flags are not metrics
    assert metrics["collectors.latency.forward_s.count"] == 0
    assert "collectors.latency.forward_s.mean" not in metrics
    assert not [k for k in metrics if k.endswith("low_sample_count")]
    row = run_row(ok_run)
    assert all(v == row[k] for k, v in metrics.items() if k in row)

    # tags, times, status
    tags = ml.data.tags
    assert tags["perfsdk.run_id"] == ok_run.run_id
    assert tags["perfsdk.name"] == "quickstart" and tags["perfsdk.status"] == "ok"
    assert tags["team"] == "inference"
    assert tags["perfsdk.model.model_id"] == "builtin:tiny-llama" and tags["perfsdk.model.dtype"] == "float32"
    assert tags["perfsdk.started_at"] == run_row(ok_run)["started_at"]
    assert tags["perfsdk.export"] == "complete"
    assert ml.info.run_name == ok_run.run_id
    assert ml.info.status == "FINISHED"
    assert ml.info.start_time == int(ok_run.started_at.timestamp() * 1000)
    assert ml.info.end_time == int(ok_run.finished_at.timestamp() * 1000)
    assert client.get_experiment(ml.info.experiment_id).name == "quickstart"

    # artifacts: the result file byte for byte, the HTML report
    assert sorted(a.path for a in client.list_artifacts(ml.info.run_id)) == ["report.html", "result.json"]
    got = Path(client.download_artifacts(ml.info.run_id, "result.json", str(tmp_path / "dl")))
    assert got.read_bytes() == (st.run_dir(ok_run.run_id) / RESULT_FILE).read_bytes()
    html = Path(client.download_artifacts(ml.info.run_id, "report.html", str(tmp_path / "dl"))).read_text()
    assert f"<h1>Run quickstart ({ok_run.run_id})</h1>" in html
    assert (tmp_path / "mlruns").is_dir()  # a new experiment's artifacts go where MLflow puts them by default

    # 2. an export that stopped half-way is completed in place; the failed run is added
    client.delete_tag(ml.info.run_id, "perfsdk.export")
    p = _export(plugin_path, tmp_path, uri, store)
    assert p.returncode == 0, p.stderr
    assert "exported 2 run(s)" in p.stderr
    runs = _runs(client)
    assert sorted(runs) == sorted([ok_run.run_id, failed_run.run_id])
    assert runs[ok_run.run_id].info.run_id == ml.info.run_id
    assert runs[ok_run.run_id].data.tags["perfsdk.export"] == "complete"
    assert [m.value for m in client.get_metric_history(ml.info.run_id, "collectors.latency.ttft_s.p50")] == [lat["ttft_s"]["p50"]]
    assert sorted(a.path for a in client.list_artifacts(ml.info.run_id)) == ["report.html", "result.json"]

    bad = client.get_run(runs[failed_run.run_id].info.run_id)
    assert bad.info.status == "FAILED"
    assert bad.data.tags["perfsdk.status"] == "failed"
    assert bad.data.tags["perfsdk.errors"] == "user: RuntimeError: boom"
    assert bad.data.tags["perfsdk.tag.mlflow.note"] == "kept"  # reserved namespace: moved, not overwriting
    # the user's record, the memory peak, and the statistics of a run that measured nothing: counts of 0
    assert bad.data.metrics.pop("records.accuracy") == 0.75
    assert bad.data.metrics.pop("collectors.memory.rss_peak_bytes") == failed_run.collectors["memory"]["rss_peak_bytes"]
    assert bad.data.metrics and all(k.endswith(".count") and v == 0 for k, v in bad.data.metrics.items())
    assert bad.data.params["config.name"] == "exploded"
    assert client.get_experiment(bad.info.experiment_id).name == "exploded"

    # 3. exporting everything again changes nothing
    p = _export(plugin_path, tmp_path, uri, store)
    assert p.returncode == 0, p.stderr
    again = _runs(client)
    assert {k: r.info.run_id for k, r in again.items()} == {k: r.info.run_id for k, r in runs.items()}
    for r in again.values():
        for key in r.data.metrics:
            assert len(client.get_metric_history(r.info.run_id, key)) == 1


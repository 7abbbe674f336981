"""Every overview of a sweep says how valid its points are, what each constraint removed from the
Pareto front, and shows the figures users recorded: the terminal table and the HTML report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfsdk.store import Store

WORKLOAD = '''
import torch
from perfsdk.testing import build_tiny_causal_lm

def run(session):
    model = build_tiny_causal_lm()
    session.load(model=model, tokenizer=None)
    ids = torch.tensor([[5, 6, 7, 8]] * int(session.config.workload.batching.batch_size))
    for _ in range(3):
        session.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                         min_new_tokens=3)
    session.record("perplexity", 10.0 + session.config.workload.batching.batch_size)
'''


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A two-point sweep of real runs whose constraint no point can meet."""
    from click.testing import CliRunner

    from perfsdk.cli import cli, register_plugin_commands

    register_plugin_commands()
    tmp = tmp_path_factory.mktemp("overview")
    (tmp / "bench.py").write_text(WORKLOAD)
    spec = {"name": "ov", "base": {"exporters": [], "collectors": {"energy": False, "utilization": False}},
            "axes": {"workload.batching.batch_size": [1, 2]}, "workload": "bench.py:run",
            "objectives": [{"maximize": "output_tokens_per_s"}, {"minimize": "ttft_s.p95"}],
            "constraints": ["ttft_s.p95 <= 0.000001"]}
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(spec))
    r = CliRunner(env={"COLUMNS": "250"}).invoke(cli, ["sweep", str(tmp / "sweep.yaml"), "--store", str(tmp / "st")],
                                                 catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return tmp, r


def test_the_sweep_table_shows_validity_records_and_what_the_constraint_removed(swept: tuple[Path, Any]) -> None:
    tmp, r = swept
    runs = sorted(Store(tmp / "st").list_runs(), key=lambda x: x.run_id)
    verdicts = [x.validity.verdict for x in runs]  # type: ignore[union-attr]
    lines = r.output.splitlines()
    header = next(i for i, line in enumerate(lines) if "validity" in line and "status" in line)
    assert "records.perplexity" in lines[header]
    rows = {x.run_id: line for line in lines[header + 1:] for x in runs if x.run_id in line}
    assert len(rows) == len(runs)
    for x in runs:  # each run's own row (run ids started in the same second do not sort by time)
        line = rows[x.run_id]
        bs = int(x.tags["workload.batching.batch_size"])
        assert line.split()[0] == str(bs)
        assert f"{10.0 + bs:.4g}" in line.split() and x.validity.verdict in line.split()  # type: ignore[union-attr]
    # the sweep-level line counts the stored verdicts, and the points per kind of reason
    kinds: dict[str, int] = {}
    for x in runs:
        for kind in dict.fromkeys(reason.split(":", 1)[0] for reason in x.validity.reasons):  # type: ignore[union-attr]
            kinds[kind] = kinds.get(kind, 0) + 1
    if set(verdicts) == {"valid"}:
        assert "validity: all 2 finished points valid" in r.output
    else:
        line = next(x for x in lines if x.startswith("validity: of 2 finished points, "))
        for verdict in set(verdicts) - {"valid"}:
            assert f"{verdicts.count(verdict)} {verdict} (" in line
        for kind, n in kinds.items():
            assert f"{kind} {n}" in line
    assert "constraint collectors.latency.ttft_s.p95 <= 1e-06: removed 2 of 2 finished points" in r.output
    assert "Pareto front: 0 point(s) of the 0 meeting every constraint" in r.output


def test_the_sweep_report_says_the_same(swept: tuple[Path, Any], perfsdk_cli: Any) -> None:
    tmp, _ = swept
    manifest = json.loads(next((tmp / "st" / "sweeps").glob("*.json")).read_text())
    assert [p["figures"] for p in manifest["points"]] == [{"records.perplexity": 11.0}, {"records.perplexity": 12.0}]
    runs = {x.run_id: x for x in Store(tmp / "st").list_runs()}
    assert [p["validity"] for p in manifest["points"]] == [
        runs[p["run_id"]].validity.verdict for p in manifest["points"]]  # type: ignore[union-attr]
    r = perfsdk_cli(["report", manifest["sweep_id"], "--store", str(tmp / "st"), "--output", str(tmp / "r.html")])
    assert r.exit_code == 0, r.output
    html = (tmp / "r.html").read_text()
    assert "<th>records.perplexity</th>" in html and "<td>11</td>" in html and "<td>12</td>" in html
    assert "<th>validity</th>" in html
    assert "constraint collectors.latency.ttft_s.p95 &lt;= 1e-06: removed 2 of 2 finished points" in html
    assert "Pareto front: 0 point(s) of the 0 meeting every constraint" in html
    assert "of 2 finished points" in html or "all 2 finished points valid" in html

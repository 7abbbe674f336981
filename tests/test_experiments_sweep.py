"""Sweeps end to end on the embedded model: grid, resume after an interruption, failed points,
report with batch-size panels and a Pareto front; plus sweep-file validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfsdk.experiments import sweep as sweep_mod
from perfsdk.experiments.sweep import runner as sweep_runner
from perfsdk.experiments.sweep import (PointTask, SweepError, SweepRunner, load_sweep, point_id, read_manifest,
                                       sweep_id_for)
from perfsdk.store import Store

BASE = {
    "name": "exp-test",
    "model": {"id": "builtin:tiny-llama-small", "dtype": "float32", "device": "cpu"},
    "workload": {"prompts": "builtin:mixed", "num_prompts": 2, "batching": {"batch_size": 1},
                 "generate": {"max_new_tokens": 3}, "warmup_runs": 0, "min_iterations": 1, "threads": 1},
    "collectors": {"energy": False},
    "exporters": [],
}
SPEC = {
    "name": "bxd",
    "base": BASE,
    "axes": {"workload.batching.batch_size": [1, 2], "model.dtype": ["float32", "bfloat16"]},
    "objectives": [{"maximize": "collectors.latency.output_tokens_per_s"}, {"minimize": "collectors.latency.ttft_s.p95"}],
    "constraints": ["collectors.latency.ttft_s.p95 <= 1000"],
}


def _write(tmp_path: Path, spec: dict[str, Any], name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return p


@pytest.fixture(autouse=True)
def _no_energy_plugin_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class CountingWorkload:
    """The real runner, counting calls; raises ``exc`` on call number ``fail_on`` (1-based)."""

    def __init__(self, fail_on: int | None = None, exc: BaseException | None = None,
                 fail_if: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail_on = fail_on
        self.exc = exc
        self.fail_if = fail_if

    def __call__(self, session: Any) -> None:
        from perfsdk.models.runner import run_workload

        cfg = session.config
        self.calls.append({"batch_size": cfg.workload.batching.batch_size, "dtype": cfg.model.dtype})
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise self.exc  # type: ignore[misc]
        if self.fail_if is not None and self.fail_if(cfg):
            raise RuntimeError("out of memory (simulated)")
        run_workload(session)


def test_batch_dtype_sweep_resumes_after_interrupt_and_reports(tmp_path: Path, perfsdk_cli: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, SPEC)
    store = tmp_path / "store"
    sweep = load_sweep(path)

    # first invocation: interrupted while running the third point
    first = CountingWorkload(fail_on=3, exc=KeyboardInterrupt())
    monkeypatch.setattr(sweep_runner, "DEFAULT_WORKLOAD", first)
    res = perfsdk_cli(["sweep", str(path), "--store", str(store)])
    assert res.exit_code == 130, res.output
    assert len(first.calls) == 3
    manifest = read_manifest(store, sweep.sweep_id)
    assert manifest["status"] == "interrupted"
    assert [p["status"] for p in manifest["points"]] == ["ok", "ok", "pending", "pending"]

    # second invocation: only the two remaining points run
    second = CountingWorkload()
    monkeypatch.setattr(sweep_runner, "DEFAULT_WORKLOAD", second)
    res = perfsdk_cli(["sweep", str(path), "--store", str(store)])
    assert res.exit_code == 0, res.output
    assert second.calls == [{"batch_size": 2, "dtype": "float32"}, {"batch_size": 2, "dtype": "bfloat16"}]
    manifest = read_manifest(store, sweep.sweep_id)
    assert manifest["status"] == "finished"
    assert [p["status"] for p in manifest["points"]] == ["ok"] * 4
    assert all(p["feasible"] is True for p in manifest["points"])
    assert 1 <= len(manifest["pareto"]) <= 4
    assert {p["point_id"] for p in manifest["points"] if p["pareto"]} == set(manifest["pareto"])

    # every point is a normal run with the sweep's tags; the interrupted attempt is stored as failed
    runs = Store(store).list_runs(tags={"sweep_id": sweep.sweep_id})
    assert sorted(r.status for r in runs) == ["failed", "ok", "ok", "ok", "ok"]
    ok = [r for r in runs if r.status == "ok"]
    assert sorted((r.tags["workload.batching.batch_size"], r.tags["model.dtype"]) for r in ok) == [
        ("1", "bfloat16"), ("1", "float32"), ("2", "bfloat16"), ("2", "float32")]
    assert {r.tags["sweep_point"] for r in ok} == {point_id(p["values"]) for p in manifest["points"]}
    assert sorted(r.model.dtype for r in ok if r.model) == ["bfloat16", "bfloat16", "float32", "float32"]

    # a third invocation has nothing left to do
    third = CountingWorkload()
    monkeypatch.setattr(sweep_runner, "DEFAULT_WORKLOAD", third)
    res = perfsdk_cli(["sweep", str(path), "--store", str(store), "--json"])
    assert res.exit_code == 0 and third.calls == []
    assert json.loads(res.output)["sweep_id"] == sweep.sweep_id

    # the report has the batch-size panels and the Pareto front
    out = tmp_path / "rep" / "sweep.html"
    res = perfsdk_cli(["report", sweep.sweep_id, "--store", str(store), "--output", str(out)])
    assert res.exit_code == 0, res.output
    pngs = sorted(p.name for p in (tmp_path / "rep" / "sweep_files").iterdir())
    assert pngs[:2] == ["01-batch-size.png", "02-pareto.png"]
    page = out.read_text()
    assert page.count("data:image/png;base64,") == len(pngs)
    assert "<h2>Batch-size panels</h2>" in page and "<h2>Pareto front</h2>" in page

    # load_runs sees the same runs, flattened like the CSV
    import perfsdk

    df = perfsdk.load_runs(store, sweep_id=sweep.sweep_id, status="ok")
    assert len(df) == 4
    assert sorted(df["workload.batch_size"].tolist()) == [1, 1, 2, 2]
    assert (df["tags.sweep_id"] == sweep.sweep_id).all()


def test_failed_point_is_recorded_and_sweep_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dict(SPEC, axes={"workload.batching.batch_size": [1, 2, 4]}, objectives=None, constraints=None)
    sweep = load_sweep(_write(tmp_path, spec))
    wl = CountingWorkload(fail_if=lambda cfg: cfg.workload.batching.batch_size == 2)
    manifest = SweepRunner(sweep, tmp_path / "store", workload=wl).run()
    assert [p["status"] for p in manifest["points"]] == ["ok", "failed", "ok"]
    failed = manifest["points"][1]
    assert "out of memory (simulated)" in failed["error"]
    run = Store(tmp_path / "store").get(failed["run_id"])
    assert run.status == "failed" and run.tags["workload.batching.batch_size"] == "2"
    # resume: only the failed point runs again
    wl2 = CountingWorkload()
    manifest = SweepRunner(sweep, tmp_path / "store", workload=wl2).run()
    assert wl2.calls == [{"batch_size": 2, "dtype": "float32"}]
    assert [p["status"] for p in manifest["points"]] == ["ok", "ok", "ok"]


def test_no_resume_runs_every_point_again(tmp_path: Path) -> None:
    calls: list[int] = []

    def fake(session: Any) -> None:
        calls.append(session.config.workload.batching.batch_size)

    spec = dict(SPEC, axes={"workload.batching.batch_size": [1, 2]}, objectives=None, constraints=None)
    sweep = load_sweep(_write(tmp_path, spec))
    SweepRunner(sweep, tmp_path / "s", workload=fake).run()
    SweepRunner(sweep, tmp_path / "s", workload=fake).run()
    assert calls == [1, 2]
    SweepRunner(sweep, tmp_path / "s", workload=fake, resume=False).run()
    assert calls == [1, 2, 1, 2]


# -- the sweep file ---------------------------------------------------------------------------

def test_sweep_id_is_stable_and_content_derived(tmp_path: Path) -> None:
    a = load_sweep(_write(tmp_path, SPEC, "a.yaml"))
    b = load_sweep(_write(tmp_path, SPEC, "b.yaml"))
    assert a.sweep_id == b.sweep_id and a.sweep_id.startswith("bxd-")
    changed = dict(SPEC, axes={"workload.batching.batch_size": [1, 4], "model.dtype": ["float32"]})
    assert load_sweep(_write(tmp_path, changed, "c.yaml")).sweep_id != a.sweep_id
    # constraints do not change which runs are needed: same id
    looser = dict(SPEC, constraints=["collectors.latency.ttft_s.p95 <= 5"])
    assert load_sweep(_write(tmp_path, looser, "d.yaml")).sweep_id == a.sweep_id
    assert sweep_id_for(a.spec, a.base, "other") != a.sweep_id


def test_point_id_ignores_key_order() -> None:
    assert point_id({"a": 1, "b": "x"}) == point_id({"b": "x", "a": 1})
    assert point_id({"a": 1}) != point_id({"a": 2})
    assert len(point_id({"a": 1})) == 12


def test_base_config_from_a_path(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    sweep = load_sweep(_write(tmp_path, dict(SPEC, base="base.yaml")))
    assert sweep.base["model"]["id"] == "builtin:tiny-llama-small"
    assert sweep.point_config({"model.dtype": "bfloat16"})["model"]["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"axes": {"workload.batching.batch_size": [1, 0]}}, "workload.batching.batch_size"),
        ({"axes": {"model.dtype": ["float32", "float64"]}}, "model.dtype"),
        ({"axes": {}}, "axes: at least one axis"),
        ({"strategy": "annealing"}, "strategy"),
        ({"budget": 0}, "budget"),
        ({"objectives": [{"maximise": "x"}]}, "objectives"),
        ({"constraints": ["collectors.latency.ttft_s.p95 <= fast"]}, "constraints"),
        ({"bogus": 1}, "bogus: unknown key"),
        ({"base": {"workload": {"num_prompts": 0}}}, "workload.num_prompts"),
    ],
)
def test_invalid_sweep_names_the_field(tmp_path: Path, perfsdk_cli: Any, change: dict[str, Any], message: str) -> None:
    spec = dict(SPEC, **change)
    path = _write(tmp_path, spec)
    with pytest.raises(SweepError, match=message.replace(".", r"\.")):
        load_sweep(path)
    res = perfsdk_cli(["sweep", str(path), "--store", str(tmp_path / "s")])
    assert res.exit_code == 2
    assert message in res.output


def test_missing_sweep_file_exits_2(tmp_path: Path, perfsdk_cli: Any) -> None:
    res = perfsdk_cli(["sweep", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "sweep file not found" in res.output


def test_point_task_carries_plain_data(tmp_path: Path) -> None:
    import pickle

    sweep = load_sweep(_write(tmp_path, SPEC))
    runner = SweepRunner(sweep, tmp_path / "s")
    st = sweep_mod.PointState(point_id({"model.dtype": "bfloat16"}), {"model.dtype": "bfloat16"})
    task = runner._task(st)
    assert isinstance(task, PointTask)
    assert pickle.loads(pickle.dumps(task)).config["model"]["dtype"] == "bfloat16"
    assert task.store == str((tmp_path / "s").resolve())


def test_example_sweep_file_is_valid() -> None:
    sweep = load_sweep(Path(__file__).resolve().parent.parent / "examples" / "sweep.yaml")
    assert sweep.spec.axes == {"workload.batching.batch_size": [1, 2, 4, 8], "model.dtype": ["float32", "bfloat16"]}
    assert [o.direction for o in sweep.spec.objectives] == ["maximize", "minimize"]
    assert str(sweep.spec.constraints[0]) == "collectors.latency.ttft_s.p95 <= 0.5"
    assert sweep.sweep_id.startswith("batch-dtype-")


def test_cli_summary_table(tmp_path: Path, perfsdk_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(session: Any) -> None:
        session.record("score", float(session.config.workload.batching.batch_size))

    monkeypatch.setattr(sweep_runner, "DEFAULT_WORKLOAD", fake)
    spec = dict(SPEC, axes={"workload.batching.batch_size": [1, 3]}, objectives=[{"maximize": "records.score"}],
                constraints=["records.score <= 2"])
    res = perfsdk_cli(["sweep", str(_write(tmp_path, spec)), "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "2/2 points finished, 0 failed" in res.output
    assert "constraint records.score <= 2: removed 1 of 2 finished points" in res.output
    assert "Pareto front: 1 point(s) of the 1 meeting every constraint" in res.output
    m = read_manifest(tmp_path / "s", load_sweep(tmp_path / "sweep.yaml").sweep_id)
    assert [(p["values"]["workload.batching.batch_size"], p["feasible"], p["pareto"]) for p in m["points"]] == [
        (1, True, True), (3, False, False)]

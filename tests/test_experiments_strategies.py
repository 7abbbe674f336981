"""Point generation: grid, random, Latin hypercube, Optuna; executors' dispatch."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from perfsdk.experiments.executors import Executor, ExecutorUnavailable, LocalExecutor, get_executor
from perfsdk.experiments.pareto import Objective
from perfsdk.experiments.strategies import (OptunaStrategy, grid_points, grid_size, latin_hypercube_points,
                                            random_points)
from perfsdk.experiments.sweep import PointOutcome, PointTask, SweepRunner, load_sweep

AXES = {"b": [1, 2, 4, 8], "d": ["f32", "bf16"], "t": [16, 32, 64]}


def test_grid() -> None:
    pts = grid_points(AXES)
    assert grid_size(AXES) == len(pts) == 24
    assert pts[0] == {"b": 1, "d": "f32", "t": 16}
    assert pts[1] == {"b": 1, "d": "f32", "t": 32}
    assert pts[-1] == {"b": 8, "d": "bf16", "t": 64}
    assert grid_points(AXES, budget=5) == pts[:5]


def test_random_is_distinct_seeded_and_within_the_grid() -> None:
    pts = random_points(AXES, 10, seed=1)
    assert len(pts) == 10
    grid = grid_points(AXES)
    assert all(p in grid for p in pts)
    assert len({tuple(p.values()) for p in pts}) == 10
    assert random_points(AXES, 10, seed=1) == pts
    assert random_points(AXES, 10, seed=2) != pts
    assert len(random_points(AXES, 100, seed=1)) == 24


def test_latin_hypercube_covers_each_axis_evenly() -> None:
    axes = {"x": list(range(8)), "y": list(range(8))}
    pts = latin_hypercube_points(axes, 8, seed=0)
    # each of 8 strata per axis is used once: every value appears exactly once on each axis
    assert sorted(p["x"] for p in pts) == list(range(8))
    assert sorted(p["y"] for p in pts) == list(range(8))
    # with fewer values than samples, each value gets its share of strata (duplicates dropped)
    pts = latin_hypercube_points({"x": [0, 1], "y": list(range(6))}, 6, seed=0)
    assert Counter(p["x"] for p in pts) == Counter({0: 3, 1: 3})
    assert sorted(p["y"] for p in pts) == list(range(6))


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="optuna not installed (extra perfsdk[optuna])")
def test_optuna_finds_the_best_point() -> None:
    axes = {"x": list(range(10))}
    strat = OptunaStrategy(axes, [Objective(field="f", direction="minimize")], seed=0)
    strat.add_known({"x": 9}, [81.0])
    seen = []
    for _ in range(15):
        n, p = strat.ask()
        seen.append(p["x"])
        strat.tell(n, [float((p["x"] - 3) ** 2)])
    assert 3 in seen
    assert strat.study.best_trial.params == {"x": 3}


def test_optuna_missing_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from perfsdk.experiments.strategies import StrategyUnavailable

    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(StrategyUnavailable, match=r"pip install 'perfsdk\[optuna\]'"):
        OptunaStrategy({"x": [1]}, [Objective(field="f", direction="minimize")])


class FakeExecutor(Executor):
    """Takes every task, then hands outcomes back in reverse order (as a cluster might)."""

    name = "fake"

    def __init__(self) -> None:
        self.dispatched: list[PointTask] = []

    def run(self, fn: Any, tasks: list[PointTask]) -> Any:
        self.dispatched.extend(tasks)
        for t in reversed(tasks):
            yield PointOutcome(t.point_id, "failed" if t.values["workload.batching.batch_size"] == 2 else "ok",
                               None, "boom" if t.values["workload.batching.batch_size"] == 2 else None)


def _spec(tmp_path: Path) -> Path:
    import yaml

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "d", "base": {"exporters": []},
                                 "axes": {"workload.batching.batch_size": [1, 2, 3]}}, sort_keys=False))
    return p


def test_runner_dispatches_pending_points_to_the_executor(tmp_path: Path) -> None:
    sweep = load_sweep(_spec(tmp_path))
    ex = FakeExecutor()
    manifest = SweepRunner(sweep, tmp_path / "store", ex).run()
    assert [t.values["workload.batching.batch_size"] for t in ex.dispatched] == [1, 2, 3]
    assert all(t.sweep_id == sweep.sweep_id and t.store == str((tmp_path / "store").resolve()) for t in ex.dispatched)
    assert [t.config["workload"]["batching"]["batch_size"] for t in ex.dispatched] == [1, 2, 3]
    assert [p["status"] for p in manifest["points"]] == ["ok", "failed", "ok"]
    assert manifest["points"][1]["error"] == "boom"
    assert manifest["executor"] == "fake"


def test_get_executor() -> None:
    assert isinstance(get_executor("local"), LocalExecutor)
    with pytest.raises(ValueError, match="valid executors: local, ray, submitit"):
        get_executor("dask")


def test_missing_ray_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ExecutorUnavailable, match=r"pip install 'perfsdk\[ray\]'"):
        get_executor("ray")
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(ExecutorUnavailable, match=r"pip install 'perfsdk\[slurm\]'"):
        get_executor("submitit", workdir="/tmp")


def _fake_workload(session: Any) -> None:
    session.record("batch", session.config.workload.batching.batch_size)


@pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="submitit not installed (extra perfsdk[submitit])")
def test_submitit_debug_cluster_runs_points(tmp_path: Path) -> None:
    from perfsdk.experiments.executors import SubmititExecutor
    from perfsdk.store import Store

    sweep = load_sweep(_spec(tmp_path))
    ex = SubmititExecutor(tmp_path / "jobs", cluster="debug")
    manifest = SweepRunner(sweep, tmp_path / "store", ex, workload=_fake_workload).run()
    assert [p["status"] for p in manifest["points"]] == ["ok", "ok", "ok"]
    runs = Store(tmp_path / "store").list_runs()
    assert sorted(r.records[0].value for r in runs) == [1, 2, 3]  # type: ignore[type-var]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed (extra perfsdk[ray])")
@pytest.mark.skipif(os.environ.get("PERFSDK_TEST_RAY") != "1",
                    reason="starts a local Ray instance (~30 s): set PERFSDK_TEST_RAY=1 to run it")
def test_ray_local_instance_runs_points(tmp_path: Path) -> None:
    import sys

    from ray import cloudpickle

    from perfsdk.experiments.executors import RayExecutor
    from perfsdk.store import Store

    # the workers cannot import this test module: ship the workload function by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        sweep = load_sweep(_spec(tmp_path))
        ex = RayExecutor(num_cpus=1, init_kwargs={"num_cpus": 2, "object_store_memory": 80 * 2**20})
        manifest = SweepRunner(sweep, tmp_path / "store", ex, workload=_fake_workload).run()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert [p["status"] for p in manifest["points"]] == ["ok", "ok", "ok"], manifest["points"][0]["error"]
    runs = Store(tmp_path / "store").list_runs(tags={"sweep_id": sweep.sweep_id})
    assert sorted(r.records[0].value for r in runs) == [1, 2, 3]  # type: ignore[type-var]


def _score_workload(session: Any) -> None:
    bs = session.config.workload.batching.batch_size
    session.record("score", float(-(bs - 4) ** 2))


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="optuna not installed (extra perfsdk[optuna])")
def test_optuna_sweep_runs_budget_and_resumes(tmp_path: Path) -> None:
    import yaml

    p = tmp_path / "o.yaml"
    p.write_text(yaml.safe_dump({"name": "o", "base": {"exporters": [], "collectors": {"energy": False}},
                                 "axes": {"workload.batching.batch_size": [1, 2, 3, 4, 5, 6, 7, 8]},
                                 "strategy": "optuna", "budget": 5, "seed": 0,
                                 "objectives": {"maximize": "records.score"}}, sort_keys=False))
    sweep = load_sweep(p)
    manifest = SweepRunner(sweep, tmp_path / "store", workload=_score_workload).run()
    pts = manifest["points"]
    assert len(pts) == 5 and len({q["point_id"] for q in pts}) == 5
    assert all(q["status"] == "ok" and q["objectives"]["records.score"] is not None for q in pts)
    best = max(pts, key=lambda q: q["objectives"]["records.score"])
    assert manifest["pareto"] == [best["point_id"]]
    # rerunning: the five stored points seed the study; nothing new is needed
    calls: list[int] = []
    manifest = SweepRunner(sweep, tmp_path / "store",
                           workload=lambda s: calls.append(1) or _score_workload(s)).run()
    assert calls == [] and len(manifest["points"]) == 5

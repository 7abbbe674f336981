"""Sweeps whose points run elsewhere: workers are given a store path that does not exist for them,
send their runs back, and the driver alone writes every point into its store."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perfsdk
from perfsdk.experiments import sweep as sweep_mod
from perfsdk.experiments.executors import Executor, PointFn
from perfsdk.experiments.sweep import PointOutcome, PointTask, RunBundle, Sweep, SweepRunner, SweepSpec, read_manifest
from perfsdk.store import Store

#: A path no worker can reach or create (``/dev/null`` is not a folder, even for root).
UNREACHABLE = "/dev/null/perfsdk-results"

BASE = {
    "name": "remote-test",
    "model": {"id": "builtin:tiny-llama-small", "dtype": "float32", "device": "cpu"},
    "workload": {"prompts": "builtin:mixed", "num_prompts": 2, "batching": {"batch_size": 1},
                 "generate": {"max_new_tokens": 3}, "warmup_runs": 0, "min_iterations": 1, "threads": 1},
    "collectors": {"energy": False, "utilization": False},
    "exporters": ["json"],
}


def _sweep(axes: dict[str, list[Any]], base: dict[str, Any] = BASE) -> Sweep:
    spec = SweepSpec(name="remote", base=base, axes=axes)
    return Sweep(spec=spec, base=base, name="remote", sweep_id="remote-0123456789ab")


def probe_workload(session: Any) -> None:
    """No model: a series, an artifact and a record made on the worker, saying what it saw."""
    bs = session.config.workload.batching.batch_size
    session.add_series("ticks", [{"i": i, "batch_size": bs} for i in range(3)])
    session.add_artifact("worker.json", json.dumps({"pid": os.getpid(), "store": session.config.store,
                                                    "store_exists": Path(session.config.store).exists()}))
    session.record("score", float(bs * 10), unit="points")


def measured_workload(session: Any) -> None:
    """The real workload on the embedded model, then the same probe."""
    from perfsdk.models.runner import run_workload

    run_workload(session)
    probe_workload(session)


class ElsewhereExecutor(Executor):
    """A remote executor for tests: every task and outcome crosses a pickle boundary, and each
    task's store is replaced by a path the worker cannot reach."""

    name = "elsewhere"
    remote = True

    def __init__(self, inner: Executor | None = None) -> None:
        self.inner = inner
        self.tasks: list[PointTask] = []

    def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
        moved = [dataclasses.replace(t, store=UNREACHABLE) for t in tasks]
        self.tasks.extend(moved)
        if self.inner is not None:
            yield from self.inner.run(fn, moved)
            return
        for t in moved:
            out = pickle.loads(pickle.dumps(fn))(pickle.loads(pickle.dumps(t)))
            yield pickle.loads(pickle.dumps(out))


def _check_points(store: Path, sweep: Sweep, values: list[int]) -> list[Any]:
    manifest = read_manifest(store, sweep.sweep_id)
    assert manifest["status"] == "finished"
    assert [(p["values"]["workload.batching.batch_size"], p["status"]) for p in manifest["points"]] == [
        (v, "ok") for v in values]
    st = Store(store)
    runs = sorted(st.list_runs(tags={"sweep_id": sweep.sweep_id}), key=lambda r: int(r.tags["workload.batching.batch_size"]))
    assert {r.run_id for r in runs} == {p["run_id"] for p in manifest["points"]}
    assert sorted(st.indexed_ids()) == sorted(r.run_id for r in runs)  # the driver indexed them
    for r, bs in zip(runs, values):
        assert r.status == "ok"
        assert r.tags["workload.batching.batch_size"] == str(bs)
        assert [(x.name, x.value) for x in r.records] == [("score", bs * 10.0)]
        # the series and the artifact made on the worker are in the driver's store
        assert st.read_series(r.run_id, "ticks") == [{"i": i, "batch_size": bs} for i in range(3)]
        seen = json.loads((st.run_dir(r.run_id) / r.artifacts["worker.json"]).read_text())
        assert seen["store"] == UNREACHABLE and seen["store_exists"] is False
        # the configured exporter ran on the driver, as a session would have
        assert json.loads((st.run_dir(r.run_id) / "export.json").read_text())["run_id"] == r.run_id
    return runs


def test_remote_points_are_stored_by_the_driver(tmp_path: Path) -> None:
    sweep = _sweep({"workload.batching.batch_size": [1, 2]})
    ex = ElsewhereExecutor()
    SweepRunner(sweep, tmp_path / "store", ex, workload=f"{__name__}:probe_workload").run()
    assert [t.ship for t in ex.tasks] == [True, True]
    _check_points(tmp_path / "store", sweep, [1, 2])
    assert not Path(UNREACHABLE).exists()


def test_local_points_still_write_the_store_themselves(tmp_path: Path) -> None:
    sweep = _sweep({"workload.batching.batch_size": [3]})
    seen: list[PointOutcome] = []
    real = sweep_mod.execute_point

    def spy(task: PointTask) -> PointOutcome:
        out = real(task)
        seen.append(out)
        return out

    class Local(Executor):
        name = "local"

        def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
            for t in tasks:
                assert t.ship is False
                yield spy(t)

    SweepRunner(sweep, tmp_path / "store", Local(), workload=f"{__name__}:probe_workload").run()
    assert [o.bundle for o in seen] == [None]
    run = Store(tmp_path / "store").get(seen[0].run_id)  # type: ignore[arg-type]
    assert run.records[0].value == 30.0


def test_a_run_the_driver_cannot_store_fails_its_point(tmp_path: Path) -> None:
    sweep = _sweep({"workload.batching.batch_size": [1]})
    store = tmp_path / "store"
    first = ElsewhereExecutor()
    SweepRunner(sweep, store, first, workload=f"{__name__}:probe_workload").run()
    run = Store(store).list_runs()[0]

    class SameRunAgain(Executor):
        """Sends back a run whose id the store already holds."""

        name = "again"
        remote = True

        def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
            for t in tasks:
                yield PointOutcome(t.point_id, "ok", run.run_id, None, RunBundle(run.model_dump_json()))

    manifest = SweepRunner(sweep, store, SameRunAgain(), resume=False).run()
    (point,) = manifest["points"]
    assert point["status"] == "failed" and point["run_id"] is None
    assert point["error"] == (f"the driver could not store run {run.run_id}: StoreError: "
                              f"run {run.run_id} already exists in {store.resolve()}")
    assert len(Store(store).list_runs()) == 1


@pytest.mark.slow
def test_ray_workers_without_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="the Ray executor test needs ray: pip install -e '.[dev]'")
    from perfsdk.experiments.executors import RayExecutor

    # the workers import perfsdk and this module from the same places as this process
    src = Path(perfsdk.__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), str(src),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a throw-away local instance
    assert not ray.is_initialized()
    sweep = _sweep({"workload.batching.batch_size": [1, 2]})
    inner = RayExecutor(num_cpus=1, init_kwargs={"num_cpus": 1, "include_dashboard": False})
    ex = ElsewhereExecutor(inner)
    SweepRunner(sweep, tmp_path / "store", ex, workload=f"{__name__}:measured_workload").run()
    assert not ray.is_initialized()  # the executor started its instance and shut it down
    runs = _check_points(tmp_path / "store", sweep, [1, 2])
    st = Store(tmp_path / "store")
    for r in runs:
        seen = json.loads((st.run_dir(r.run_id) / r.artifacts["worker.json"]).read_text())
        assert seen["pid"] != os.getpid()  # measured in a Ray worker process
        lat = r.collectors["latency"]
        requests = st.read_series(r.run_id, "requests")  # measured on the worker, stored by the driver
        assert lat["requests"] == len(requests) == 2  # 2 prompts
        assert lat["output_tokens"] == sum(q["output_tokens"] for q in requests)
        steps = {row["step"] for row in st.read_series(r.run_id, "token_times")}
        assert steps == {q["step"] for q in requests} and len(steps) == 2 // int(r.tags["workload.batching.batch_size"])


@pytest.mark.slow
def test_submitit_jobs_without_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit", reason="the submitit executor test needs submitit: pip install -e '.[dev]'")
    from perfsdk.experiments.executors import SubmititExecutor

    src = Path(perfsdk.__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), str(src),
                                                      os.environ.get("PYTHONPATH", "")]))
    sweep = _sweep({"workload.batching.batch_size": [1, 2]})
    # cluster "local": each job is a subprocess, its task and outcome pass through files in `folder`
    ex = ElsewhereExecutor(SubmititExecutor(tmp_path / "jobs", cluster="local", poll_s=0.2,
                                            parameters={"timeout_min": 5}))
    SweepRunner(sweep, tmp_path / "store", ex, workload=f"{__name__}:probe_workload").run()
    runs = _check_points(tmp_path / "store", sweep, [1, 2])
    st = Store(tmp_path / "store")
    pids = {json.loads((st.run_dir(r.run_id) / r.artifacts["worker.json"]).read_text())["pid"] for r in runs}
    assert len(pids) == 2 and os.getpid() not in pids  # one job process per point

"""Where sweep points run: in this process, on a Ray cluster, or as Slurm jobs through submitit.

An executor takes a picklable function and a list of tasks and yields one outcome per task as
each finishes (in any order). A ``remote`` executor's workers never touch the store: each point
runs without one and returns its run (result, series, artifacts) in the outcome, and the driver
alone writes the store and the sweep manifest. Workers need neither the store's path nor a file
system shared with the driver, and the store's SQLite index stays on the driver's disk. Ray and
submitit are optional dependencies, imported when the executor is created, with an install hint
when missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from perfsdk.experiments.sweep import PointOutcome, PointTask

log = structlog.get_logger("perfsdk.experiments.executors")

PointFn = Callable[[PointTask], PointOutcome]


class ExecutorUnavailable(RuntimeError):
    """The executor's optional dependency is missing or it cannot start."""


class Executor:
    """Base class: ``run(fn, tasks)`` yields a :class:`PointOutcome` per task as each finishes.

    ``remote`` executors run points in other processes, possibly on other machines: their
    points send the run back to the driver instead of writing the store."""

    name = "base"
    remote = False

    def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
        raise NotImplementedError


class LocalExecutor(Executor):
    """One point after the other, in this process (the default; nothing competes for cores)."""

    name = "local"

    def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
        for task in tasks:
            yield fn(task)


def _failed(task: PointTask, exc: BaseException) -> PointOutcome:
    return PointOutcome(task.point_id, "failed", None, f"{type(exc).__name__}: {exc}")


class RayExecutor(Executor):
    """Points as Ray tasks. Connects to ``address`` (e.g. ``auto`` for a running cluster) or
    starts a local Ray instance; ``num_cpus``/``num_gpus`` are reserved per point, so set
    ``num_gpus: 1`` to give every point a GPU of its own."""

    name = "ray"
    remote = True

    def __init__(self, address: str | None = None, num_cpus: float = 1, num_gpus: float = 0,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorUnavailable("executor ray needs the optional dependency ray: pip install 'perfsdk[ray]'") from None
        self.ray = ray
        self.address = address
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.init_kwargs = dict(init_kwargs or {})

    def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
        if not tasks:
            return
        ray = self.ray
        started_here = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            kwargs.update(self.init_kwargs)
            ray.init(address=self.address, **kwargs)
            started_here = True
        remote = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0)(fn)
        pending = {remote.remote(t): t for t in tasks}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    task = pending.pop(ref)
                    try:
                        yield ray.get(ref)
                    except Exception as exc:  # worker died (e.g. killed for memory): the point failed
                        yield _failed(task, exc)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started_here:
                ray.shutdown()


class SubmititExecutor(Executor):
    """Points as Slurm jobs through submitit (one job per point). ``cluster`` is passed to
    ``submitit.AutoExecutor`` (``None``: Slurm when available; ``local``: subprocesses here;
    ``debug``: in this process); ``parameters`` go to ``update_parameters`` (``timeout_min``,
    ``slurm_partition``, ``gpus_per_node``, ...). submitit hands each job its pickled task and
    takes back its outcome (the run) through files in ``folder``, next to the job logs, so
    ``folder`` must be on a file system that the compute nodes see; the store need not be."""

    name = "submitit"
    remote = True

    def __init__(self, folder: str | Path, cluster: str | None = None, parameters: dict[str, Any] | None = None,
                 poll_s: float = 5.0) -> None:
        try:
            import submitit
        except ImportError:
            raise ExecutorUnavailable(
                "executor submitit needs the optional dependency submitit: pip install 'perfsdk[slurm]'"
            ) from None
        self.submitit = submitit
        self.folder = Path(folder)
        self.cluster = cluster
        self.parameters = dict(parameters or {})
        self.poll_s = poll_s

    def run(self, fn: PointFn, tasks: list[PointTask]) -> Iterator[PointOutcome]:
        if not tasks:
            return
        ex = self.submitit.AutoExecutor(folder=self.folder, cluster=self.cluster)
        if self.parameters:
            ex.update_parameters(**self.parameters)
        jobs = [ex.submit(fn, t) for t in tasks]
        by_job = {id(j): t for j, t in zip(jobs, tasks)}
        order = jobs if self.cluster == "debug" else self.submitit.helpers.as_completed(jobs, poll_frequency=self.poll_s)
        try:
            for job in order:
                task = by_job[id(job)]
                try:
                    yield job.result()
                except Exception as exc:  # job failed or was killed by the scheduler
                    yield _failed(task, exc)
        except BaseException:
            for j in jobs:
                if not j.done():
                    try:
                        j.cancel(check=False)
                    except Exception:
                        pass
            raise


EXECUTORS = ("local", "ray", "submitit")


def get_executor(name: str, options: dict[str, Any] | None = None, *, workdir: str | Path = ".") -> Executor:
    """An executor by name with its options (``executor_options`` of the sweep file)."""
    opts = dict(options or {})
    if name == "local":
        return LocalExecutor()
    if name == "ray":
        ray_opts = opts.get("ray", opts)
        return RayExecutor(address=ray_opts.get("address"), num_cpus=ray_opts.get("num_cpus", 1),
                           num_gpus=ray_opts.get("num_gpus", 0), init_kwargs=ray_opts.get("init"))
    if name == "submitit":
        sub = opts.get("submitit", opts)
        return SubmititExecutor(folder=sub.get("folder", Path(workdir) / "submitit"), cluster=sub.get("cluster"),
                                parameters=sub.get("parameters"), poll_s=float(sub.get("poll_s", 5.0)))
    raise ValueError(f"unknown executor {name!r}; valid executors: {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "Executor", "ExecutorUnavailable", "LocalExecutor", "RayExecutor", "SubmititExecutor",
           "get_executor"]

"""Running one point (module level: executors pickle it to other processes).

Only the driver writes the store. Points run by a remote executor (Ray, Slurm) measure with no
store at all and send the finished run back as a :class:`RunBundle` (result, series, artifacts),
which the driver saves: workers need no access to the store's file system, and its SQLite index
never has to live on a network file system.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from perfsdk.config import parse_config
from perfsdk.experiments.sweep.points import point_tags
from perfsdk.experiments.sweep.spec import PerplexitySpec
from perfsdk.schemas import RunResult
from perfsdk.store import Store

log = structlog.get_logger("perfsdk.experiments.sweep")

DEFAULT_WORKLOAD = "perfsdk.models.runner:run_workload"


@dataclass
class PointTask:
    """Everything a worker needs to run one point; plain data, picklable.

    ``store`` is the driver's store (recorded in the run's config). With ``ship`` the worker
    never opens it: it measures without a store and returns the run in the outcome's ``bundle``.
    """

    sweep_id: str
    point_id: str
    values: dict[str, Any]
    config: dict[str, Any]
    store: str
    quality: dict[str, Any] | None = None
    workload: str | Callable[[Any], Any] = DEFAULT_WORKLOAD
    ship: bool = False
    config_hash: str | None = None


@dataclass
class RunBundle:
    """A finished run as plain, picklable data: the result as JSON, its time series and its
    artifacts. A point that ran elsewhere sends it back; the driver stores it with :meth:`save`."""

    result_json: str
    series: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def from_session(cls, sess: Any) -> RunBundle:
        """The bundle of a finalized session (one that ran with no store)."""
        if sess.result is None:
            raise ValueError("the session has no result yet")
        return cls(result_json=sess.result.model_dump_json(),
                   series={name: list(rows) for name, rows in sess.series.items()},
                   artifacts=dict(sess.artifacts))

    def save(self, store: Store, exporters: dict[str, type] | None = None) -> RunResult:
        """Write the run into ``store`` (atomically, indexed) and the config's ``exporters`` into
        its folder, as the session would have; returns the stored result."""
        result = RunResult.model_validate_json(self.result_json)
        store.save(result, series=self.series, artifacts=self.artifacts)
        for name in result.config.get("exporters") or []:
            cls = (exporters or {}).get(name)
            if cls is None:
                log.error("unknown exporter", exporter=name, available=sorted(exporters or {}))
                continue
            try:
                store.write_export(result.run_id, cls())
            except Exception as exc:
                log.error("exporter failed", exporter=name, error=repr(exc))
        return store.get(result.run_id)


@dataclass
class PointOutcome:
    """What became of one point; ``bundle`` holds the run when the worker did not store it."""

    point_id: str
    status: str  # ok | partial | failed
    run_id: str | None = None
    error: str | None = None
    bundle: RunBundle | None = None


def resolve_workload(fn: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A workload function from ``module:function`` or ``path/to/file.py:function``."""
    if callable(fn):
        return fn
    target, _, attr = fn.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"{target} not found")
        name = "perfsdk_workload_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot import {target}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    func = getattr(module, attr)
    if not callable(func):
        raise TypeError(f"{fn} is not callable")
    return func  # type: ignore[no-any-return]


def execute_point(task: PointTask) -> PointOutcome:
    """Run one point as a normal run. Exceptions become a failed outcome (the failed run is kept
    with its error); ``KeyboardInterrupt`` propagates after the failed run was stored.

    The run goes into ``task.store``, or, with ``task.ship``, back to the caller in the outcome's
    ``bundle`` (the worker then never touches the store)."""
    from perfsdk.session import Session

    try:
        cfg = parse_config(task.config, f"point {task.point_id}")
        tags = point_tags(task.sweep_id, task.point_id, task.values, task.config_hash)
        cfg = cfg.model_copy(update={"tags": {**cfg.tags, **tags},
                                     "store": task.store})
        sess = Session(cfg, store=None if task.ship else task.store)
    except Exception as exc:  # invalid point or a plugin that cannot start: nothing was stored
        return PointOutcome(task.point_id, "failed", None, f"{type(exc).__name__}: {exc}")
    workload = resolve_workload(task.workload)
    error = None
    try:
        with sess:
            workload(sess)
            if task.quality and task.quality.get("perplexity"):
                _measure_perplexity(sess, task.quality["perplexity"])
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    res = sess.result
    if res is None:
        return PointOutcome(task.point_id, "failed", None, error or "the run produced no result")
    if error is None and res.status != "ok":
        error = "; ".join(f"{e.source}: {e.type}: {e.message}" for e in res.errors) or None
    bundle = RunBundle.from_session(sess) if task.ship else None
    return PointOutcome(task.point_id, res.status, res.run_id, error, bundle)


def _measure_perplexity(sess: Any, spec: dict[str, Any]) -> None:
    from perfsdk.experiments.quality import perplexity
    from perfsdk.models.prompts import load_prompts

    ps = PerplexitySpec.model_validate(spec)
    texts = load_prompts(ps.prompts, ps.num_prompts, seed=sess.config.workload.seed)
    with sess.stage("quality"):
        value = perplexity(sess.model, sess.tokenizer, texts, batch_size=ps.batch_size, max_length=ps.max_length)
    sess.record(ps.record, value, unit="ratio")

"""Sweeps: many runs over a grid (or a sample) of config values, resumable, tracked in a manifest.

A sweep file has the top-level keys ``name``, ``base`` (a config, inline or a path relative to
the sweep file), ``axes`` (dotted config path -> list of values), ``strategy``, ``budget``,
``seed``, ``objectives``, ``constraints`` and ``quality``. Every point is a normal stored run,
tagged ``sweep_id``, ``sweep_point`` (a hash of the point's values) and one tag per axis.
The manifest ``<store>/sweeps/<sweep_id>.json`` (written atomically) tracks the points; the
store's tags are the source of truth, so a sweep that was interrupted, or whose driver died
while remote workers kept writing runs, resumes by skipping points that already have a
finished (``ok`` or ``partial``) run.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import math
import operator
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from perfsdk.config import Config, ConfigError, parse_config, set_dotted
from perfsdk.experiments.pareto import Objective, pareto_indices
from perfsdk.experiments.strategies import OptunaStrategy, grid_size, static_points
from perfsdk.store import Store, atomic_write

log = structlog.get_logger("perfsdk.experiments.sweep")

DEFAULT_WORKLOAD = "perfsdk.models.runner:run_workload"
FINISHED = ("ok", "partial")


class SweepError(ConfigError):
    """An invalid sweep file; the message names the field path."""


# -- the sweep file ---------------------------------------------------------------------------

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq, "!=": operator.ne,
}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.:\-/]*)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")


class Constraint(BaseModel):
    """``field op value``, e.g. ``collectors.latency.ttft_s.p95 <= 0.5``."""

    model_config = ConfigDict(frozen=True)

    field: str
    op: Literal["<=", ">=", "<", ">", "==", "!="]
    value: float

    @classmethod
    def parse(cls, text: str) -> Constraint:
        m = _CONSTRAINT.match(text)
        if not m:
            raise ValueError(f"{text!r}: expected '<result field> <op> <number>' with op one of <=, >=, <, >, ==, !=")
        try:
            value = float(m.group(3))
        except ValueError:
            raise ValueError(f"{text!r}: {m.group(3)!r} is not a number") from None
        return cls(field=m.group(1), op=m.group(2), value=value)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.field} {self.op} {self.value:g}"

    def check(self, row: dict[str, Any]) -> tuple[bool | None, float]:
        """(satisfied, violation): ``None`` when the field is missing; violation >= 0."""
        v = row.get(self.field)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(float(v)):
            return None, 1.0
        ok = _OPS[self.op](float(v), self.value)
        if ok:
            return True, 0.0
        scale = abs(self.value) or 1.0
        return False, abs(float(v) - self.value) / scale


class QualitySpec(BaseModel):
    """Quality measured at every point (after the timed workload, in a ``quality`` stage)."""

    model_config = ConfigDict(extra="forbid")

    perplexity: PerplexitySpec | None = None


class PerplexitySpec(BaseModel):
    """Perplexity of the point's model on a prompt set, recorded as ``records.<record>``."""

    model_config = ConfigDict(extra="forbid")

    prompts: str = "builtin:mixed"
    num_prompts: int = Field(default=8, ge=1)
    max_length: int = Field(default=256, ge=2)
    batch_size: int = Field(default=4, ge=1)
    record: str = "perplexity"


QualitySpec.model_rebuild()


class SweepSpec(BaseModel):
    """A validated sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    base: dict[str, Any] | str = Field(default_factory=dict)
    axes: dict[str, list[Any]]
    strategy: Literal["grid", "random", "latin_hypercube", "optuna"] = "grid"
    budget: int | None = Field(default=None, ge=1)
    seed: int = 0
    objectives: list[Objective] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)
    quality: QualitySpec | None = None
    executor_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("axes")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not v:
            raise ValueError("at least one axis is needed")
        for path, values in v.items():
            if not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", path):
                raise ValueError(f"{path!r}: not a dotted config path")
            if not values:
                raise ValueError(f"{path}: needs at least one value")
            keys = [json.dumps(x, sort_keys=True, default=str) for x in values]
            if len(set(keys)) != len(keys):
                raise ValueError(f"{path}: values repeat")
        return v

    @field_validator("objectives", mode="before")
    @classmethod
    def _objectives(cls, v: Any) -> Any:
        if v is None:
            return []
        items = v if isinstance(v, list) else [v]
        out: list[Any] = []
        for item in items:
            if isinstance(item, Objective):
                out.append(item)
                continue
            if not isinstance(item, dict) or not item or set(item) - {"maximize", "minimize"}:
                raise ValueError("each objective is {maximize: <field>} or {minimize: <field>}")
            for direction in ("maximize", "minimize"):
                fields = item.get(direction)
                for f in (fields if isinstance(fields, list) else [fields] if fields is not None else []):
                    if not isinstance(f, str) or not f:
                        raise ValueError(f"{direction}: expected a result field name, got {f!r}")
                    out.append({"field": f, "direction": direction})
        return out

    @field_validator("constraints", mode="before")
    @classmethod
    def _constraints(cls, v: Any) -> Any:
        if v is None:
            return []
        items = v if isinstance(v, list) else [v]
        return [Constraint.parse(c) if isinstance(c, str) else c for c in items]

    @model_validator(mode="after")
    def _budget(self) -> SweepSpec:
        if self.strategy == "optuna" and not self.objectives:
            raise ValueError("strategy optuna needs at least one objective")
        return self


def _format_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            from perfsdk.suggest import unknown_key_hint

            msg += unknown_key_hint(SweepSpec, list(e["loc"]))
        parts.append(f"{path or '<root>'}: {msg}")
    return "; ".join(parts)


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``"a.b"``, creating mappings on the way."""
    try:
        set_dotted(data, dotted.split("."), copy.deepcopy(value))
    except ValueError as err:
        raise SweepError(f"axes.{dotted}: {err} in the base config") from None


@dataclass
class Sweep:
    """A sweep ready to run: the spec, the resolved base config and the derived id."""

    spec: SweepSpec
    base: dict[str, Any]
    name: str
    sweep_id: str
    source: str = "sweep"

    @property
    def axes(self) -> dict[str, list[Any]]:
        return self.spec.axes

    def point_config(self, values: dict[str, Any]) -> dict[str, Any]:
        """The base config with the point's values set (not validated)."""
        data = copy.deepcopy(self.base)
        for path, value in values.items():
            set_path(data, path, value)
        return data

    def validate_point(self, values: dict[str, Any]) -> Config:
        """The point's validated config; errors name the axis and field path."""
        label = ", ".join(f"{k}={v}" for k, v in values.items())
        try:
            return parse_config(self.point_config(values), f"{self.source}: point ({label})")
        except ConfigError as err:
            raise SweepError(str(err)) from None


def point_id(values: dict[str, Any]) -> str:
    """A stable 12-hex-digit hash of a point's axis values (order of keys does not matter)."""
    canon = json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def _slug(name: str) -> str:
    return (re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "sweep")[:80]


def sweep_id_for(spec: SweepSpec, base: dict[str, Any], name: str) -> str:
    """``<name>-<hash>``: the hash covers everything that decides which runs the sweep makes
    (resolved base config, axes, strategy, budget, seed, quality; objectives too for Optuna,
    whose points depend on them), so re-running the same file resumes the same sweep while
    editing a constraint does not throw the finished runs away."""
    content: dict[str, Any] = {
        "name": name, "base": base, "axes": spec.axes, "strategy": spec.strategy, "budget": spec.budget,
        "seed": spec.seed, "quality": spec.quality.model_dump() if spec.quality else None,
    }
    if spec.strategy == "optuna":
        content["objectives"] = [o.model_dump() for o in spec.objectives]
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{_slug(name)}-{digest}"


def load_sweep(source: str | Path | dict[str, Any]) -> Sweep:
    """Read and validate a sweep file (or dict); every point's config is validated too."""
    base_dir = Path.cwd()
    label = "sweep"
    default_name = "sweep"
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise SweepError(f"{path}: sweep file not found")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise SweepError(f"{path}: not valid YAML: {err}") from None
        base_dir = path.resolve().parent
        label = str(path)
        default_name = path.stem
    else:
        raw = source
    if not isinstance(raw, dict):
        raise SweepError(f"{label}: expected a mapping at the top level")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        raise SweepError(f"{label}: invalid sweep: {_format_errors(err)}") from None
    if isinstance(spec.base, str):
        from perfsdk.config import read_yaml

        bpath = Path(spec.base)
        if not bpath.is_absolute():
            bpath = base_dir / bpath
        try:
            base = read_yaml(bpath) or {}
        except ConfigError as err:
            raise SweepError(f"{label}: base: {err}") from None
        if not isinstance(base, dict):
            raise SweepError(f"{label}: base: {bpath} does not hold a mapping")
        cfg_dir = bpath.resolve().parent
    else:
        base = copy.deepcopy(spec.base)
        cfg_dir = base_dir
    try:
        base_cfg = parse_config(base, f"{label}: base")
    except ConfigError as err:
        raise SweepError(str(err)) from None
    # Prompt files named relative to the config file must still be found from the workers.
    prompts = base_cfg.workload.prompts
    if not prompts.startswith("builtin:") and not Path(prompts).is_absolute():
        set_path(base, "workload.prompts", str(cfg_dir / prompts))
    name = spec.name or (base.get("name") if isinstance(spec.base, dict) and spec.base.get("name") else None) or default_name
    sweep = Sweep(spec=spec, base=base, name=name, sweep_id=sweep_id_for(spec, base, name), source=label)
    if spec.strategy == "optuna":
        # every value of every axis must be valid with the others at their first value
        first = {k: v[0] for k, v in spec.axes.items()}
        for k, values in spec.axes.items():
            for v in values:
                sweep.validate_point({**first, k: v})
    else:
        for pt in static_points(spec.strategy, spec.axes, spec.budget, spec.seed):
            sweep.validate_point(pt)
    return sweep


# -- running one point (module level: executors pickle it to other processes) -----------------

@dataclass
class PointTask:
    """Everything a worker needs to run one point; plain data, picklable."""

    sweep_id: str
    point_id: str
    values: dict[str, Any]
    config: dict[str, Any]
    store: str
    quality: dict[str, Any] | None = None
    workload: str | Callable[[Any], Any] = DEFAULT_WORKLOAD


@dataclass
class PointOutcome:
    """What became of one point."""

    point_id: str
    status: str  # ok | partial | failed
    run_id: str | None = None
    error: str | None = None


def point_tags(sweep_id: str, pid: str, values: dict[str, Any]) -> dict[str, str]:
    """The tags a point's run carries: sweep id, point hash, and one per axis value."""
    tags = {"sweep_id": sweep_id, "sweep_point": pid}
    for k, v in values.items():
        tags[k] = v if isinstance(v, str) else json.dumps(v, default=str)
    return tags


def _resolve(fn: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
    if callable(fn):
        return fn
    mod, _, attr = fn.partition(":")
    return getattr(importlib.import_module(mod), attr)  # type: ignore[no-any-return]


def execute_point(task: PointTask) -> PointOutcome:
    """Run one point as a normal stored run. Exceptions become a failed outcome (the session
    stores the failed run with its error); ``KeyboardInterrupt`` propagates after the failed
    run was stored."""
    from perfsdk.session import Session

    try:
        cfg = parse_config(task.config, f"point {task.point_id}")
        cfg = cfg.model_copy(update={"tags": {**cfg.tags, **point_tags(task.sweep_id, task.point_id, task.values)},
                                     "store": task.store})
        sess = Session(cfg, store=task.store)
    except Exception as exc:  # invalid point or a plugin that cannot start: nothing was stored
        return PointOutcome(task.point_id, "failed", None, f"{type(exc).__name__}: {exc}")
    workload = _resolve(task.workload)
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
    return PointOutcome(task.point_id, res.status, res.run_id, error)


def _measure_perplexity(sess: Any, spec: dict[str, Any]) -> None:
    from perfsdk.experiments.quality import perplexity
    from perfsdk.models.prompts import load_prompts

    ps = PerplexitySpec.model_validate(spec)
    texts = load_prompts(ps.prompts, ps.num_prompts, seed=sess.config.workload.seed)
    with sess.stage("quality"):
        value = perplexity(sess.model, sess.tokenizer, texts, batch_size=ps.batch_size, max_length=ps.max_length)
    sess.record(ps.record, value, unit="ratio")


# -- the manifest and the driver ---------------------------------------------------------------

@dataclass
class PointState:
    """One point as the manifest records it."""

    point_id: str
    values: dict[str, Any]
    status: str = "pending"  # pending | running | ok | partial | failed
    run_id: str | None = None
    error: str | None = None
    objectives: dict[str, float | None] = field(default_factory=dict)
    feasible: bool | None = None
    pareto: bool = False


def manifest_path(store: Store, sweep_id: str) -> Path:
    """``<store>/sweeps/<sweep_id>.json``."""
    return store.root / "sweeps" / f"{sweep_id}.json"


def read_manifest(store: Store | str, sweep_id: str) -> dict[str, Any]:
    """A sweep's manifest; a missing one raises :class:`FileNotFoundError`."""
    st = store if isinstance(store, Store) else Store(store)
    path = manifest_path(st, sweep_id)
    if not path.is_file():
        raise FileNotFoundError(f"sweep {sweep_id} not found in {st.root}")
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def list_sweeps(store: Store | str) -> list[str]:
    """Ids of the sweeps in a store (from their manifests)."""
    st = store if isinstance(store, Store) else Store(store)
    folder = st.root / "sweeps"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


ProgressFn = Callable[[int, int, PointState | None], None]


class SweepRunner:
    """Runs a :class:`Sweep` through an executor, keeping the manifest up to date."""

    def __init__(self, sweep: Sweep, store: str | Path, executor: Any = None, *, resume: bool = True,
                 progress: ProgressFn | None = None,
                 workload: str | Callable[[Any], Any] | None = None) -> None:
        from perfsdk.experiments.executors import LocalExecutor

        self.sweep = sweep
        self.store = Store(Path(store).resolve())
        self.executor = executor or LocalExecutor()
        self.resume = resume
        self.progress = progress
        # resolved now, not at import, so that tests can swap the module-level default
        self.workload = workload if workload is not None else DEFAULT_WORKLOAD
        self.points: dict[str, PointState] = {}
        self.status = "running"
        self.created_at = datetime.now(timezone.utc).isoformat()
        self.started = time.time()

    # manifest --------------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        spec = self.sweep.spec
        return {
            "sweep_id": self.sweep.sweep_id,
            "name": self.sweep.name,
            "status": self.status,
            "created_at": self.created_at,
            "updated_at": datetime.now(timezone.utc).isoformat(),
            "source": self.sweep.source,
            "strategy": spec.strategy,
            "budget": spec.budget,
            "seed": spec.seed,
            "executor": getattr(self.executor, "name", type(self.executor).__name__),
            "axes": spec.axes,
            "objectives": [o.model_dump() for o in spec.objectives],
            "constraints": [str(c) for c in spec.constraints],
            "base": self.sweep.base,
            "points": [asdict(p) for p in self.points.values()],
            "pareto": [p.point_id for p in self.points.values() if p.pareto],
        }

    def save_manifest(self) -> Path:
        path = manifest_path(self.store, self.sweep.sweep_id)
        atomic_write(path, json.dumps(self.manifest(), indent=2, default=str).encode("utf-8"))
        return path

    # state from the store --------------------------------------------------------------------

    def _finished_in_store(self) -> dict[str, tuple[str, str]]:
        """point id -> (run id, status) of the latest run of each point already stored."""
        out: dict[str, tuple[str, str]] = {}
        if not self.store.runs_dir.is_dir():
            return out
        for run in self.store.list_runs(tags={"sweep_id": self.sweep.sweep_id}):
            pid = run.tags.get("sweep_point")
            if pid is None:
                continue
            prev = out.get(pid)
            # a finished run wins over a failed one; among equals the latest (ids sort by time)
            rank = (run.status in FINISHED, run.run_id)
            if prev is None or rank > (prev[1] in FINISHED, prev[0]):
                out[pid] = (run.run_id, run.status)
        return out

    def _task(self, st: PointState) -> PointTask:
        spec = self.sweep.spec
        return PointTask(sweep_id=self.sweep.sweep_id, point_id=st.point_id, values=st.values,
                         config=self.sweep.point_config(st.values), store=str(self.store.root),
                         quality=spec.quality.model_dump() if spec.quality else None, workload=self.workload)

    def _record(self, outcome: PointOutcome) -> PointState:
        st = self.points[outcome.point_id]
        st.status, st.run_id, st.error = outcome.status, outcome.run_id, outcome.error
        if outcome.status in FINISHED and outcome.run_id:
            self._evaluate(st)
        self.save_manifest()
        return st

    def _evaluate(self, st: PointState) -> None:
        from perfsdk.exporters.flatten import run_row

        try:
            row = run_row(self.store.get(st.run_id))  # type: ignore[arg-type]
        except Exception as exc:
            log.warning("could not read point run", run_id=st.run_id, error=repr(exc))
            return
        fields = [o.field for o in self.sweep.spec.objectives] + [c.field for c in self.sweep.spec.constraints]
        st.objectives = {f: _num(row.get(f)) for f in dict.fromkeys(fields)}
        checks = [c.check(row)[0] for c in self.sweep.spec.constraints]
        st.feasible = None if any(c is None for c in checks) else all(checks)

    def _violation(self, st: PointState) -> float:
        row = {k: v for k, v in st.objectives.items()}
        return sum(c.check(row)[1] for c in self.sweep.spec.constraints)

    def _tick(self, st: PointState | None) -> None:
        if self.progress is not None:
            done = sum(1 for p in self.points.values() if p.status != "pending" and p.status != "running")
            self.progress(done, self._total, st)

    # run -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run (or resume) the sweep; returns the final manifest."""
        known = self._finished_in_store() if self.resume else {}
        try:
            if self.sweep.spec.strategy == "optuna":
                self._run_optuna(known)
            else:
                self._run_static(known)
        except BaseException:
            self.status = "interrupted"
            for p in self.points.values():
                if p.status == "running":
                    p.status = "pending"
            self._finish_front()
            self.save_manifest()
            raise
        self.status = "finished"
        self._finish_front()
        self.save_manifest()
        return self.manifest()

    def _run_static(self, known: dict[str, tuple[str, str]]) -> None:
        spec = self.sweep.spec
        for values in static_points(spec.strategy, spec.axes, spec.budget, spec.seed):
            pid = point_id(values)
            st = PointState(pid, values)
            if pid in known:
                st.run_id, st.status = known[pid]
                if st.status in FINISHED:
                    self._evaluate(st)
                else:
                    st.status = "pending"  # a failed or interrupted point runs again
            self.points[pid] = st
        self._total = len(self.points)
        todo = [p for p in self.points.values() if p.status == "pending"]
        self.save_manifest()
        self._tick(None)
        for p in todo:
            p.status = "running"
        for outcome in self.executor.run(execute_point, [self._task(p) for p in todo]):
            self._tick(self._record(outcome))

    def _run_optuna(self, known: dict[str, tuple[str, str]]) -> None:
        spec = self.sweep.spec
        strategy = OptunaStrategy(spec.axes, spec.objectives, seed=spec.seed)
        budget = spec.budget or min(grid_size(spec.axes), 20)
        self._total = budget
        # points that already ran (this sweep, earlier invocation) seed the study
        by_values: dict[str, PointState] = {}
        for pid, (run_id, status) in known.items():
            if status not in FINISHED:
                continue
            try:
                run = self.store.get(run_id)
            except Exception:
                continue
            values = {k: _axis_value(spec.axes[k], run.tags.get(k)) for k in spec.axes}
            if any(v is _MISSING for v in values.values()):
                continue
            st = PointState(pid, values, status=status, run_id=run_id)
            self._evaluate(st)
            self.points[pid] = st
            strategy.add_known(values, self._objective_values(st), self._violation(st))
            by_values[pid] = st
        self.save_manifest()
        self._tick(None)
        attempts = 0
        while len(self.points) < budget and attempts < budget * 20:
            attempts += 1
            number, values = strategy.ask()
            pid = point_id(values)
            if pid in self.points:  # the sampler proposed a point we have: answer from the store
                st = self.points[pid]
                strategy.tell(number, self._objective_values(st) if st.status in FINISHED else None, self._violation(st))
                continue
            st = PointState(pid, values, status="running")
            self.points[pid] = st
            for outcome in self.executor.run(execute_point, [self._task(st)]):
                self._record(outcome)
            strategy.tell(number, self._objective_values(st) if st.status in FINISHED else None, self._violation(st))
            self._tick(st)

    def _objective_values(self, st: PointState) -> list[float] | None:
        vals = [st.objectives.get(o.field) for o in self.sweep.spec.objectives]
        if any(v is None for v in vals):
            return None
        return [float(v) for v in vals]  # type: ignore[arg-type]

    def _finish_front(self) -> None:
        objs = self.sweep.spec.objectives
        pts = list(self.points.values())
        for p in pts:
            p.pareto = False
        if not objs:
            return
        cands = [p for p in pts if p.status in FINISHED and p.feasible is not False]
        for i in pareto_indices([p.objectives for p in cands], objs):
            cands[i].pareto = True


_MISSING = object()


def _axis_value(values: list[Any], tag: str | None) -> Any:
    for v in values:
        if (v if isinstance(v, str) else json.dumps(v, default=str)) == tag:
            return v
    return _MISSING


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None

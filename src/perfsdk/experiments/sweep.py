"""Sweeps: many runs over a grid (or a sample) of config values, resumable, tracked in a manifest.

A sweep file has the top-level keys ``name``, ``base`` (a config, inline or a path relative to
the sweep file), ``axes`` (dotted config path -> list of values), ``strategy`` (or
``strategies`` to compare several), ``budget``, ``seed``, ``objectives``, ``objective`` (a
weighted score), ``constraints``, ``quality``, ``workload`` (a function to run at each point)
and ``report``. Every point is a normal stored run, tagged ``sweep_id``, ``sweep_point`` (a
hash of the point's values), ``config_hash`` (a hash of its whole configuration) and one tag
per axis. Strategies compared in one sweep share the measured points: a configuration measured
for one is answered from its stored run for the others.
The manifest ``<store>/sweeps/<sweep_id>.json`` (written atomically) tracks the points; the
store's tags are the source of truth, so a sweep that was interrupted resumes by skipping points
that already have a finished (``ok`` or ``partial``) run.

Only the driver writes the store. Points run by a remote executor (Ray, Slurm) measure with no
store at all and send the finished run back as a :class:`RunBundle` (result, series, artifacts),
which the driver saves: workers need no access to the store's file system, and its SQLite index
never has to live on a network file system.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import json
import math
import operator
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from perfsdk.config import Config, ConfigError, parse_config, set_dotted, tag_text
from perfsdk.experiments.pareto import Objective, pareto_indices
from perfsdk.experiments.strategies import OptunaStrategy, grid_size, static_points
from perfsdk.schemas import RunResult
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


StrategyName = Literal["grid", "random", "latin_hypercube", "optuna", "tpe"]
ADAPTIVE = ("optuna", "tpe")
SCORE = "score"


class WeightedObjective(BaseModel):
    """One score from several result fields: ``score = sum(weight * value / scale)``, maximized.

    A positive weight rewards a larger value (accuracy), a negative one a smaller value
    (latency). ``scale`` (default 1 for every field) puts fields of different units on one
    footing: divide by a typical value or by the difference you consider equivalent (e.g.
    ``tpot_s.p50: 0.01`` makes 10 ms of TPOT one unit). A point missing any field has no score.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights: dict[str, float]
    scale: dict[str, float] = Field(default_factory=dict)

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("name at least one field")
        for f, w in v.items():
            if not math.isfinite(w) or w == 0:
                raise ValueError(f"{f}: a weight must be a non-zero number")
        return v

    @model_validator(mode="after")
    def _scales(self) -> WeightedObjective:
        for f, sc in self.scale.items():
            if f not in self.weights:
                raise ValueError(f"scale.{f}: not one of the weighted fields")
            if not math.isfinite(sc) or sc <= 0:
                raise ValueError(f"scale.{f}: must be a positive number")
        return self

    def score(self, row: dict[str, Any]) -> float | None:
        """The weighted score of a flattened result row, or ``None`` when a field is missing."""
        total = 0.0
        for f, w in self.weights.items():
            v = _num(row.get(f))
            if v is None:
                return None
            total += w * v / self.scale.get(f, 1.0)
        return total


class StrategyOptions(BaseModel):
    """Settings of the adaptive strategy."""

    model_config = ConfigDict(extra="forbid")

    n_startup_trials: int = Field(default=10, ge=1, description="TPE: random trials before it models the objective")


class Heatmap(BaseModel):
    """A heat map of ``metric`` over two axes (the mean of the points sharing each cell)."""

    model_config = ConfigDict(extra="forbid")

    x: str
    y: str
    metric: str

    @classmethod
    def parse(cls, text: str) -> Heatmap:
        """``x=AXIS,y=AXIS,metric=FIELD`` (the command-line form)."""
        parts: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in ("x", "y", "metric") or not value.strip():
                raise ValueError(f"{text!r}: expected x=AXIS,y=AXIS,metric=FIELD")
            parts[key.strip()] = value.strip()
        if set(parts) != {"x", "y", "metric"}:
            raise ValueError(f"{text!r}: expected x=AXIS,y=AXIS,metric=FIELD")
        return cls(**parts)


class ReportSpec(BaseModel):
    """What the sweep report draws beyond its defaults."""

    model_config = ConfigDict(extra="forbid")

    heatmaps: list[Heatmap] = Field(default_factory=list)

    @field_validator("heatmaps", mode="before")
    @classmethod
    def _heatmaps(cls, v: Any) -> Any:
        return [Heatmap.parse(x) if isinstance(x, str) else x for x in (v or [])]


class SweepSpec(BaseModel):
    """A validated sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    base: dict[str, Any] | str = Field(default_factory=dict)
    axes: dict[str, list[Any]]
    strategy: StrategyName = "grid"
    strategies: list[StrategyName] | None = None
    budget: int | None = Field(default=None, ge=1)
    seed: int = 0
    objectives: list[Objective] = Field(default_factory=list)
    objective: WeightedObjective | None = None
    constraints: list[Constraint] = Field(default_factory=list)
    quality: QualitySpec | None = None
    workload: str | None = None
    strategy_options: StrategyOptions = Field(default_factory=StrategyOptions)
    report: ReportSpec = Field(default_factory=ReportSpec)
    executor_options: dict[str, Any] = Field(default_factory=dict)

    @property
    def strategy_list(self) -> list[str]:
        """The strategies this sweep runs, in order (one unless ``strategies`` compares several)."""
        return list(self.strategies) if self.strategies else [self.strategy]

    @property
    def compare(self) -> bool:
        return len(self.strategy_list) > 1

    def primary(self) -> Objective | None:
        """The objective strategies are judged on: the weighted score when there is one, else
        the first of ``objectives``."""
        if self.objective is not None:
            return Objective(field=SCORE, direction="maximize")
        return self.objectives[0] if self.objectives else None

    def adaptive_objectives(self) -> list[Objective]:
        """What the adaptive (TPE) strategy optimizes: the weighted score, else ``objectives``."""
        if self.objective is not None:
            return [Objective(field=SCORE, direction="maximize")]
        return list(self.objectives)

    def fields(self) -> list[str]:
        """Every result field the sweep reads at each point."""
        out = [o.field for o in self.objectives] + list(self.objective.weights if self.objective else [])
        out += [c.field for c in self.constraints]
        return list(dict.fromkeys(out))

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

    @field_validator("strategies")
    @classmethod
    def _strategies(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("name at least one strategy")
        if len(set(v)) != len(v):
            raise ValueError("strategies repeat")
        return v

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: str | None) -> str | None:
        if v is not None and (":" not in v or not v.split(":")[-1].isidentifier()):
            raise ValueError("expected 'package.module:function' or 'path/to/file.py:function'")
        return v

    @model_validator(mode="after")
    def _budget(self) -> SweepSpec:
        for name in self.strategy_list:
            if name in ADAPTIVE and not (self.objectives or self.objective):
                raise ValueError(f"strategy {name} needs an objective (objectives or a weighted objective)")
        if self.compare and self.primary() is None:
            raise ValueError("comparing strategies needs an objective (objectives or a weighted objective)")
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
    workload: str | None = None  # the spec's workload with a file path made absolute

    def strategy_budget(self, strategy: str) -> int | None:
        """Points a strategy may try. Comparing strategies, grid always covers the whole grid
        (it defines the optimum the others are measured against)."""
        if strategy in ADAPTIVE:
            return self.spec.budget or min(grid_size(self.spec.axes), 20)
        if strategy == "grid" and self.spec.compare:
            return None
        return self.spec.budget

    def static_points(self, strategy: str) -> list[dict[str, Any]]:
        """The points of a non-adaptive strategy."""
        return static_points(strategy, self.spec.axes, self.strategy_budget(strategy), self.spec.seed)

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
    # keys added later only enter the hash when used, so older sweeps keep their ids
    if spec.strategies:
        content["strategies"] = spec.strategies
    if spec.workload:
        content["workload"] = spec.workload
    if any(st in ADAPTIVE for st in spec.strategy_list):
        content["objectives"] = [o.model_dump() for o in spec.objectives]
        if spec.objective is not None:
            content["objective"] = spec.objective.model_dump()
        if spec.strategy_options != StrategyOptions():
            content["strategy_options"] = spec.strategy_options.model_dump()
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{_slug(name)}-{digest}"


def load_sweep(source: str | Path | dict[str, Any], strategies: list[str] | None = None) -> Sweep:
    """Read and validate a sweep file (or dict); every point's config is validated too.

    ``strategies`` replaces the file's ``strategies`` (``perfsdk sweep --compare-strategies``).
    """
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
    if strategies:
        raw = {**raw, "strategies": list(strategies)}
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
    ds = base_cfg.workload.dataset
    if ds is not None and not Path(ds.path).expanduser().is_absolute() and (cfg_dir / ds.path).exists():
        set_path(base, "workload.dataset.path", str(cfg_dir / ds.path))
    name = spec.name or (base.get("name") if isinstance(spec.base, dict) and spec.base.get("name") else None) or default_name
    workload = _absolute_workload(spec.workload, base_dir) if spec.workload else None
    sweep = Sweep(spec=spec, base=base, name=name, sweep_id=sweep_id_for(spec, base, name), source=label,
                  workload=workload)
    if workload is not None:
        try:
            _resolve(workload)
        except Exception as exc:
            raise SweepError(f"{label}: workload: cannot load {spec.workload!r}: {type(exc).__name__}: {exc}") from None
    checked: set[str] = set()
    for strategy in spec.strategy_list:
        if strategy in ADAPTIVE:
            # every value of every axis must be valid with the others at their first value
            first = {k: v[0] for k, v in spec.axes.items()}
            points = [{**first, k: v} for k, values in spec.axes.items() for v in values]
        else:
            points = sweep.static_points(strategy)
        for pt in points:
            pid = point_id(pt)
            if pid not in checked:
                checked.add(pid)
                sweep.validate_point(pt)
    return sweep


def _absolute_workload(spec: str, base_dir: Path) -> str:
    """``file.py:function`` relative to the sweep file becomes an absolute path."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py") and not Path(target).is_absolute():
        return f"{base_dir / target}:{attr}"
    return spec


# -- running one point (module level: executors pickle it to other processes) -----------------

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


def point_tags(sweep_id: str, pid: str, values: dict[str, Any], chash: str | None = None) -> dict[str, str]:
    """The tags a point's run carries: sweep id, point hash, configuration hash, and one per
    axis value (numbers as JSON text, like numeric ``tags.*`` values)."""
    tags = {"sweep_id": sweep_id, "sweep_point": pid}
    if chash is not None:
        tags["config_hash"] = chash
    for k, v in values.items():
        text = tag_text(v)
        tags[k] = text if isinstance(text, str) else json.dumps(v, default=str)
    return tags


def _resolve(fn: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
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


def config_hash(config: dict[str, Any]) -> str:
    """A 12-hex-digit hash of a point's whole validated configuration, without the fields that
    do not change what is measured (name, tags, store, exporters). Strategies that reach the
    same configuration share its run."""
    cfg = parse_config(config, "point").model_dump(mode="json", exclude={"name", "tags", "store", "exporters"})
    canon = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


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
    config_hash: str | None = None
    strategies: list[str] = field(default_factory=list)


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
    """Runs a :class:`Sweep` through an executor, keeping the manifest up to date.

    With several strategies (``strategies: [grid, tpe]``) each runs in turn over the same space;
    a point whose configuration already has a finished run (measured for an earlier strategy,
    or stored by an earlier invocation) is answered from that run, so comparing strategies
    costs only the points no strategy tried before. Each strategy's trials, in order, are kept
    in the manifest (``trials``) with their best-so-far objective (``efficiency``).
    """

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
        self.workload = workload if workload is not None else (sweep.workload or DEFAULT_WORKLOAD)
        self.points: dict[str, PointState] = {}
        self._exporters: dict[str, type] | None = None
        self.trials: dict[str, list[str]] = {}
        self.status = "running"
        self.created_at = datetime.now(timezone.utc).isoformat()
        self.started = time.time()
        self._total = 0
        self._hashes: dict[str, str] = {}

    # manifest --------------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        spec = self.sweep.spec
        primary = spec.primary()
        out = {
            "sweep_id": self.sweep.sweep_id,
            "name": self.sweep.name,
            "status": self.status,
            "created_at": self.created_at,
            "updated_at": datetime.now(timezone.utc).isoformat(),
            "source": self.sweep.source,
            "strategy": spec.strategy if not spec.compare else ",".join(spec.strategy_list),
            "strategies": spec.strategy_list,
            "budget": spec.budget,
            "seed": spec.seed,
            "executor": getattr(self.executor, "name", type(self.executor).__name__),
            "axes": spec.axes,
            "objectives": [o.model_dump() for o in spec.objectives],
            "objective": spec.objective.model_dump() if spec.objective else None,
            "primary": primary.model_dump() if primary else None,
            "constraints": [str(c) for c in spec.constraints],
            "report": spec.report.model_dump(),
            "base": self.sweep.base,
            "points": [asdict(p) for p in self.points.values()],
            "pareto": [p.point_id for p in self.points.values() if p.pareto],
            "trials": self.trials,
        }
        out.update(sample_efficiency(out))
        return out

    def save_manifest(self) -> Path:
        path = manifest_path(self.store, self.sweep.sweep_id)
        atomic_write(path, json.dumps(self.manifest(), indent=2, default=str).encode("utf-8"))
        return path

    # state from the store --------------------------------------------------------------------

    def _finished_in_store(self) -> dict[str, tuple[str, str]]:
        """point id (and ``config:<hash>``) -> (run id, status) of the best run of each point
        already stored for this sweep."""
        out: dict[str, tuple[str, str]] = {}
        if not self.store.runs_dir.is_dir():
            return out
        for run in self.store.list_runs(tags={"sweep_id": self.sweep.sweep_id}):
            for key in (run.tags.get("sweep_point"), "config:" + run.tags["config_hash"] if run.tags.get("config_hash") else None):
                if key is None:
                    continue
                prev = out.get(key)
                # a finished run wins over a failed one; among equals the latest (ids sort by time)
                rank = (run.status in FINISHED, run.run_id)
                if prev is None or rank > (prev[1] in FINISHED, prev[0]):
                    out[key] = (run.run_id, run.status)
        return out

    def _config_hash(self, values: dict[str, Any]) -> str:
        pid = point_id(values)
        h = self._hashes.get(pid)
        if h is None:
            h = config_hash(self.sweep.point_config(values))
            self._hashes[pid] = h
        return h

    def _task(self, st: PointState) -> PointTask:
        spec = self.sweep.spec
        return PointTask(sweep_id=self.sweep.sweep_id, point_id=st.point_id, values=st.values,
                         config=self.sweep.point_config(st.values), store=str(self.store.root),
                         quality=spec.quality.model_dump() if spec.quality else None, workload=self.workload,
                         ship=bool(getattr(self.executor, "remote", False)), config_hash=st.config_hash)

    def _store_bundle(self, outcome: PointOutcome) -> PointOutcome:
        """Save a run that a worker sent back; a run the driver cannot store fails its point."""
        assert outcome.bundle is not None
        if self._exporters is None:
            from perfsdk.plugins import collect_registry, get_plugin_manager

            self._exporters = dict(collect_registry(get_plugin_manager(), strict=False).exporters)
        try:
            outcome.bundle.save(self.store, self._exporters)
        except Exception as exc:
            log.error("could not store a point's run", point=outcome.point_id, run_id=outcome.run_id, error=repr(exc))
            return PointOutcome(outcome.point_id, "failed", None,
                                f"the driver could not store run {outcome.run_id}: {type(exc).__name__}: {exc}")
        return PointOutcome(outcome.point_id, outcome.status, outcome.run_id, outcome.error)

    def _record(self, outcome: PointOutcome) -> PointState:
        if outcome.bundle is not None:
            outcome = self._store_bundle(outcome)
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
        spec = self.sweep.spec
        st.objectives = {f: _num(row.get(f)) for f in spec.fields()}
        if spec.objective is not None:
            st.objectives[SCORE] = spec.objective.score(row)
        checks = [c.check(row)[0] for c in spec.constraints]
        st.feasible = None if any(c is None for c in checks) else all(checks)

    def _violation(self, st: PointState) -> float:
        row = {k: v for k, v in st.objectives.items()}
        return sum(c.check(row)[1] for c in self.sweep.spec.constraints)

    def _tick(self, st: PointState | None) -> None:
        if self.progress is not None:
            done = sum(1 for p in self.points.values() if p.status != "pending" and p.status != "running")
            self.progress(done, max(self._total, done), st)

    # run -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run (or resume) the sweep; returns the final manifest."""
        known = self._finished_in_store() if self.resume else {}
        spec = self.sweep.spec
        self._total = self._estimate_total()
        try:
            for strategy in spec.strategy_list:
                self.trials[strategy] = []
                if strategy in ADAPTIVE:
                    self._run_adaptive(strategy, known)
                else:
                    self._run_static(strategy, known)
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

    def _estimate_total(self) -> int:
        """Distinct points the sweep will need at most (for the progress bar)."""
        seen: set[str] = set()
        adaptive = 0
        for strategy in self.sweep.spec.strategy_list:
            if strategy in ADAPTIVE:
                adaptive = max(adaptive, self.sweep.strategy_budget(strategy) or 0)
            else:
                seen.update(point_id(v) for v in self.sweep.static_points(strategy))
        return min(grid_size(self.sweep.spec.axes), max(len(seen), adaptive))

    def _state(self, values: dict[str, Any], known: dict[str, tuple[str, str]], strategy: str) -> PointState:
        """The point's state: shared across strategies; known from the store when it ran before."""
        pid = point_id(values)
        st = self.points.get(pid)
        if st is None:
            st = PointState(pid, values, config_hash=self._config_hash(values))
            hit = known.get(pid) or known.get("config:" + (st.config_hash or ""))
            if hit is not None:
                st.run_id, st.status = hit
                if st.status in FINISHED:
                    self._evaluate(st)
                else:
                    st.status = "pending"  # a failed or interrupted point runs again
            self.points[pid] = st
        if strategy not in st.strategies:
            st.strategies.append(strategy)
        return st

    def _run_static(self, strategy: str, known: dict[str, tuple[str, str]]) -> None:
        states = [self._state(values, known, strategy) for values in self.sweep.static_points(strategy)]
        self.trials[strategy] = [st.point_id for st in states]
        todo = list({p.point_id: p for p in states if p.status == "pending"}.values())
        self.save_manifest()
        self._tick(None)
        for p in todo:
            p.status = "running"
        for outcome in self.executor.run(execute_point, [self._task(p) for p in todo]):
            self._tick(self._record(outcome))

    def _run_adaptive(self, strategy: str, known: dict[str, tuple[str, str]]) -> None:
        spec = self.sweep.spec
        tpe = OptunaStrategy(spec.axes, spec.adaptive_objectives(), seed=spec.seed,
                             n_startup_trials=spec.strategy_options.n_startup_trials)
        budget = self.sweep.strategy_budget(strategy) or 1
        trials = self.trials[strategy]
        if not spec.compare:
            # resuming a single adaptive sweep: the points that already ran seed the study
            for key, (run_id, status) in known.items():
                if key.startswith("config:") or status not in FINISHED:
                    continue
                try:
                    run = self.store.get(run_id)
                except Exception:
                    continue
                values = {k: _axis_value(spec.axes[k], run.tags.get(k)) for k in spec.axes}
                if any(v is _MISSING for v in values.values()):
                    continue
                st = self._state(values, known, strategy)
                tpe.add_known(values, self._objective_values(st), self._violation(st))
                trials.append(st.point_id)
        self.save_manifest()
        self._tick(None)
        attempts = 0
        while len(trials) < budget and attempts < budget * 20:
            attempts += 1
            number, values = tpe.ask()
            st = self._state(values, known, strategy)
            if st.point_id in trials:  # proposed again: answer from what it gave, not a new trial
                tpe.tell(number, self._objective_values(st) if st.status in FINISHED else None, self._violation(st))
                continue
            trials.append(st.point_id)
            if st.status not in FINISHED:
                st.status = "running"
                for outcome in self.executor.run(execute_point, [self._task(st)]):
                    self._record(outcome)
                self._tick(st)
            else:  # measured before (another strategy, an earlier invocation): its run answers
                self.save_manifest()
            tpe.tell(number, self._objective_values(st) if st.status in FINISHED else None, self._violation(st))

    def _objective_values(self, st: PointState) -> list[float] | None:
        vals = [st.objectives.get(o.field) for o in self.sweep.spec.adaptive_objectives()]
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


def sample_efficiency(manifest: dict[str, Any]) -> dict[str, Any]:
    """How fast each strategy of a sweep reached its best point.

    For every strategy, ``best_so_far[k]`` is the best primary-objective value among its first
    ``k + 1`` trials (failed points, points without the value and points that violate a
    constraint do not count; ``None`` until one does). ``optimum`` is the best value over the
    whole grid when the grid strategy ran (``optimum_source: grid``), else over every finished
    point (``all points``); ``trials_to_optimum`` is the first trial count at which a strategy's
    best-so-far equals it (``None``: never). Identical configurations share one stored run, so
    equal means the very same measurement.
    """
    primary = manifest.get("primary")
    trials = manifest.get("trials") or {}
    if not primary or not trials:
        return {"efficiency": {}, "optimum": None, "optimum_source": None}
    field_, sign = primary["field"], (1.0 if primary["direction"] == "maximize" else -1.0)
    by_id = {p["point_id"]: p for p in manifest["points"]}

    def value(pid: str) -> float | None:
        p = by_id.get(pid)
        if p is None or p["status"] not in FINISHED or p.get("feasible") is False:
            return None
        return _num((p.get("objectives") or {}).get(field_))

    def better(a: float | None, b: float | None) -> float | None:
        if a is None:
            return b
        if b is None:
            return a
        return a if sign * a >= sign * b else b

    curves: dict[str, list[float | None]] = {}
    for name, pids in trials.items():
        best: float | None = None
        curve = []
        for pid in pids:
            best = better(best, value(pid))
            curve.append(best)
        curves[name] = curve
    pool = trials["grid"] if "grid" in trials else [p["point_id"] for p in manifest["points"]]
    optimum: float | None = None
    for pid in pool:
        optimum = better(optimum, value(pid))
    eff = {}
    for name, curve in curves.items():
        reach = next((k + 1 for k, v in enumerate(curve) if v is not None and optimum is not None and v == optimum), None)
        eff[name] = {"trials": len(curve), "best": curve[-1] if curve else None, "best_so_far": curve,
                     "trials_to_optimum": reach}
    return {"efficiency": eff, "optimum": optimum, "optimum_source": "grid" if "grid" in trials else "all points"}


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

"""The sweep file: its models (axes, strategies, objectives, constraints, the weighted
objective, quality, report) and their validation.

A sweep file has the top-level keys ``name``, ``base`` (a config, inline or a path relative to
the sweep file), ``axes`` (dotted config path -> list of values), ``strategy`` (or
``strategies`` to compare several), ``budget``, ``seed``, ``objectives``, ``objective`` (a
weighted score), ``constraints``, ``quality``, ``workload`` (a function to run at each point)
and ``report``. :func:`perfsdk.experiments.sweep.load_sweep` reads one.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from perfsdk.config import ConfigError
from perfsdk.experiments.pareto import Objective


class SweepError(ConfigError):
    """An invalid sweep file; the message names the field path."""


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

    def resolved(self, columns: list[str]) -> SweepSpec:
        """This spec with every objective, weighted and constraint field resolved against
        ``columns`` (a point run's flattened result; see :mod:`perfsdk.metric_names`):
        ``ttft_s.p95`` becomes ``collectors.latency.ttft_s.p95``. An unknown or ambiguous field
        raises :class:`SweepError` naming where it was used."""
        from perfsdk.metric_names import MetricNameError, resolve_metric

        def res(name: str, where: str) -> str:
            if name == SCORE and self.objective is not None:
                return name
            try:
                return resolve_metric(name, columns)
            except MetricNameError as err:
                raise SweepError(f"{where}: {err}") from None

        objectives = [o.model_copy(update={"field": res(o.field, f"objectives[{i}]")})
                      for i, o in enumerate(self.objectives)]
        objective = self.objective
        if objective is not None:
            names = {f: res(f, f"objective.weights.{f}") for f in objective.weights}
            objective = objective.model_copy(update={
                "weights": {names[f]: w for f, w in objective.weights.items()},
                "scale": {names[f]: v for f, v in objective.scale.items()}})
        constraints = [c.model_copy(update={"field": res(c.field, f"constraints[{i}] ({c})")})
                       for i, c in enumerate(self.constraints)]
        return self.model_copy(update={"objectives": objectives, "objective": objective,
                                       "constraints": constraints})

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
    from perfsdk.errors import format_validation_error

    return format_validation_error(err, model=SweepSpec)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None

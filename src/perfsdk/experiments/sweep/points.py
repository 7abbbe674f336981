"""Points of a sweep: the sweep ready to run (:class:`Sweep`, each point's config), the ids
and hashes that name points and sweeps, and the tags a point's run carries."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from perfsdk.config import Config, ConfigError, parse_config, set_dotted, tag_text
from perfsdk.experiments.strategies import grid_size, static_points
from perfsdk.experiments.sweep.spec import ADAPTIVE, StrategyOptions, SweepError, SweepSpec


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


def config_hash(config: dict[str, Any]) -> str:
    """A 12-hex-digit hash of a point's whole validated configuration, without the fields that
    do not change what is measured (name, tags, store, exporters). Strategies that reach the
    same configuration share its run."""
    cfg = parse_config(config, "point").model_dump(mode="json", exclude={"name", "tags", "store", "exporters"})
    canon = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


_MISSING = object()


def _axis_value(values: list[Any], tag: str | None) -> Any:
    for v in values:
        if (v if isinstance(v, str) else json.dumps(v, default=str)) == tag:
            return v
    return _MISSING

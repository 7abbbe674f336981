"""Reading a sweep file: validation of the file and of every point's config, base configs and
workload files resolved relative to the sweep file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfsdk.config import ConfigError, parse_config
from perfsdk.experiments.sweep.execute import resolve_workload
from perfsdk.experiments.sweep.points import Sweep, point_id, set_path, sweep_id_for
from perfsdk.experiments.sweep.spec import ADAPTIVE, SweepError, SweepSpec, _format_errors


def load_sweep(source: str | Path | dict[str, Any], strategies: list[str] | None = None) -> Sweep:
    """Read and validate a sweep file (or dict); every point's config is validated too.

    ``strategies`` replaces the file's ``strategies`` (``perfsdk sweep --compare-strategies``).
    """
    base_dir = Path.cwd()
    label = "sweep"
    default_name = "sweep"
    if isinstance(source, (str, Path)):
        from perfsdk.yamlio import read_yaml

        path = Path(source)
        raw = read_yaml(path, what="sweep file", error=SweepError)
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
        from perfsdk.config import read_yaml as read_base

        bpath = Path(spec.base)
        if not bpath.is_absolute():
            bpath = base_dir / bpath
        try:
            base = read_base(bpath) or {}
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
            resolve_workload(workload)
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

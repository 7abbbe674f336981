"""Comparing search strategies: each strategy's best-so-far objective and how many trials it
took to reach the optimum."""

from __future__ import annotations

from typing import Any

from perfsdk.experiments.sweep.manifest import FINISHED
from perfsdk.experiments.sweep.spec import _num


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


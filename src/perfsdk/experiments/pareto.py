"""Pareto fronts: the points no other point beats on every objective at once."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

Direction = Literal["maximize", "minimize"]


class Objective(BaseModel):
    """One goal of a sweep: a flattened result field and whether more or less is better."""

    model_config = ConfigDict(frozen=True)

    field: str
    direction: Direction

    @property
    def label(self) -> str:
        return f"{'max' if self.direction == 'maximize' else 'min'} {self.field}"


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[Direction]) -> bool:
    """True when ``a`` is at least as good as ``b`` on every objective and better on one."""
    better = False
    for x, y, d in zip(a, b, directions):
        if d == "minimize":
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better


def pareto_indices(points: Sequence[Mapping[str, object]], objectives: Sequence[Objective]) -> list[int]:
    """Indices (ascending) of the non-dominated points.

    A point missing a value (or with a non-finite one) for any objective takes no part. Points
    with identical objective values do not dominate each other, so all of them stay on the front.
    """
    if len(objectives) < 1:
        raise ValueError("a Pareto front needs at least one objective")
    dirs = [o.direction for o in objectives]
    vecs: list[tuple[int, list[float]]] = []
    for i, p in enumerate(points):
        vals = [p.get(o.field) for o in objectives]
        if all(_finite(v) for v in vals):
            vecs.append((i, [float(v) for v in vals]))  # type: ignore[arg-type]
    front = []
    for i, v in vecs:
        if not any(dominates(w, v, dirs) for j, w in vecs if j != i):
            front.append(i)
    return front

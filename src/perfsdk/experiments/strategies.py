"""How a sweep picks its points: full grid, random, Latin hypercube, or Optuna TPE (``tpe``,
also called ``optuna``).

Axes are discrete (each a list of values), so every strategy picks indices into those lists.
Static strategies (grid, random, Latin hypercube) know all their points up front; the Optuna
strategy is adaptive: it proposes one point at a time and learns from the results (ask/tell).
"""

from __future__ import annotations

import itertools
import math
import random
import warnings
from typing import TYPE_CHECKING, Any

from perfsdk.experiments.pareto import Objective

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

Point = dict[str, Any]


class StrategyUnavailable(RuntimeError):
    """An optional dependency of the chosen strategy is not installed."""


def grid_size(axes: dict[str, list[Any]]) -> int:
    """Number of points in the full grid."""
    return math.prod(len(v) for v in axes.values())


def _from_index(axes: dict[str, list[Any]], idx: tuple[int, ...]) -> Point:
    return {k: vals[i] for (k, vals), i in zip(axes.items(), idx)}


def grid_points(axes: dict[str, list[Any]], budget: int | None = None) -> list[Point]:
    """Every combination, first axis slowest; with a budget, the first ``budget`` of them."""
    combos = itertools.product(*(range(len(v)) for v in axes.values()))
    pts = [_from_index(axes, idx) for idx in combos]
    return pts[:budget] if budget is not None else pts


def random_points(axes: dict[str, list[Any]], budget: int | None, seed: int = 0) -> list[Point]:
    """``budget`` distinct combinations drawn uniformly without replacement (seeded)."""
    total = grid_size(axes)
    n = total if budget is None else min(budget, total)
    rng = random.Random(seed)
    picks = rng.sample(range(total), n)
    sizes = [len(v) for v in axes.values()]
    pts = []
    for flat in picks:
        idx = []
        for s in reversed(sizes):
            idx.append(flat % s)
            flat //= s
        pts.append(_from_index(axes, tuple(reversed(idx))))
    return pts


def latin_hypercube_points(axes: dict[str, list[Any]], budget: int | None, seed: int = 0) -> list[Point]:
    """A Latin hypercube over the axes: ``budget`` samples, each axis cut into ``budget`` strata
    taken once each, every stratum mapped onto the axis's values. Duplicate points (possible
    when an axis has fewer values than the budget) are dropped, so fewer points may come back."""
    total = grid_size(axes)
    n = total if budget is None else budget
    rng = random.Random(seed)
    columns: list[list[int]] = []
    for values in axes.values():
        strata = list(range(n))
        rng.shuffle(strata)
        columns.append([min(len(values) - 1, int((s + rng.random()) / n * len(values))) for s in strata])
    seen: set[tuple[int, ...]] = set()
    pts = []
    for row in zip(*columns):
        if row in seen:
            continue
        seen.add(row)
        pts.append(_from_index(axes, row))
    return pts


def static_points(strategy: str, axes: dict[str, list[Any]], budget: int | None, seed: int) -> list[Point]:
    """The points of a non-adaptive strategy."""
    if strategy == "grid":
        return grid_points(axes, budget)
    if strategy == "random":
        return random_points(axes, budget, seed)
    if strategy == "latin_hypercube":
        return latin_hypercube_points(axes, budget, seed)
    raise ValueError(f"strategy {strategy!r} is not a static strategy")


class OptunaStrategy:
    """Optuna's TPE sampler over categorical axes, driven by ask/tell.

    The first ``n_startup_trials`` points are drawn at random (Optuna's default is 10); after
    that TPE models which values give good objectives. Constraint violations are passed to the sampler through ``constraints_func`` so that it
    learns to avoid infeasible regions; failed points are told as failed trials.
    """

    def __init__(self, axes: dict[str, list[Any]], objectives: list[Objective], seed: int = 0,
                 n_startup_trials: int = 10) -> None:
        try:
            import optuna
        except ImportError:
            raise StrategyUnavailable(
                "strategy optuna needs the optional dependency optuna: pip install 'perfsdk[optuna]'"
            ) from None
        if not objectives:
            raise ValueError("strategy optuna needs at least one objective")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.axes = axes
        self.objectives = objectives
        # Categorical choices must be primitives; map each axis's values to their positions.
        self.dists: dict[str, BaseDistribution] = {k: optuna.distributions.CategoricalDistribution(list(range(len(v)))) for k, v in axes.items()}
        with warnings.catch_warnings():
            # constraints_func is deprecated in newer Optuna but still the one API across 3.x-5.x
            warnings.simplefilter("ignore", FutureWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, constraints_func=_constraints_of,
                                                 n_startup_trials=n_startup_trials)
        self.study = optuna.create_study(directions=[o.direction for o in objectives], sampler=sampler)
        self._open: dict[int, Any] = {}

    def ask(self) -> tuple[int, Point]:
        """A new trial number and its point."""
        trial = self.study.ask(self.dists)
        self._open[trial.number] = trial
        return trial.number, {k: self.axes[k][trial.params[k]] for k in self.axes}

    def tell(self, number: int, values: list[float] | None, violation: float = 0.0) -> None:
        """Report a trial: objective values, or ``None`` when the point failed."""
        trial = self._open.pop(number)
        trial.set_user_attr("constraint", [violation])
        if values is None:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, values)

    def add_known(self, point: Point, values: list[float] | None, violation: float = 0.0) -> None:
        """Seed the study with a point that already ran (used when resuming)."""
        optuna = self.optuna
        try:
            params = {k: self.axes[k].index(point[k]) for k in self.axes}
        except (KeyError, ValueError):
            return
        state = optuna.trial.TrialState.COMPLETE if values is not None else optuna.trial.TrialState.FAIL
        self.study.add_trial(optuna.trial.create_trial(params=params, distributions=self.dists, values=values,
                                                       state=state, user_attrs={"constraint": [violation]}))


def _constraints_of(trial: Any) -> list[float]:
    return list(trial.user_attrs.get("constraint", [0.0]))

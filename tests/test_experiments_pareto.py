"""Pareto fronts on hand-made point sets."""

from __future__ import annotations

import pytest

from perfsdk.experiments.pareto import Objective, dominates, pareto_indices

TPS = Objective(field="tps", direction="maximize")
TTFT = Objective(field="ttft", direction="minimize")
ACC = Objective(field="acc", direction="maximize")


def test_two_objectives() -> None:
    pts = [
        {"tps": 100, "ttft": 0.10},  # 0 front (best ttft)
        {"tps": 200, "ttft": 0.20},  # 1 front
        {"tps": 150, "ttft": 0.25},  # 2 dominated by 1
        {"tps": 300, "ttft": 0.50},  # 3 front (best tps)
        {"tps": 90, "ttft": 0.10},   # 4 dominated by 0 (equal ttft, less tps)
        {"tps": 250, "ttft": 0.60},  # 5 dominated by 3
    ]
    assert pareto_indices(pts, [TPS, TTFT]) == [0, 1, 3]


def test_three_objectives() -> None:
    pts = [
        {"tps": 100, "ttft": 0.1, "acc": 0.90},  # 0 front
        {"tps": 100, "ttft": 0.1, "acc": 0.80},  # 1 dominated by 0
        {"tps": 50, "ttft": 0.3, "acc": 0.95},   # 2 front (best accuracy)
        {"tps": 40, "ttft": 0.4, "acc": 0.95},   # 3 dominated by 2
        {"tps": 200, "ttft": 0.2, "acc": 0.70},  # 4 front (best tps)
    ]
    assert pareto_indices(pts, [TPS, TTFT, ACC]) == [0, 2, 4]


def test_ties_and_missing_values() -> None:
    pts = [{"tps": 1, "ttft": 1}, {"tps": 1, "ttft": 1}, {"tps": None, "ttft": 0.1}, {"ttft": 0.0},
           {"tps": float("nan"), "ttft": 0.0}, {"tps": 0.5, "ttft": 2}]
    assert pareto_indices(pts, [TPS, TTFT]) == [0, 1]
    assert pareto_indices([], [TPS, TTFT]) == []


def test_single_objective_is_the_best_points() -> None:
    assert pareto_indices([{"tps": 3}, {"tps": 5}, {"tps": 5}, {"tps": 1}], [TPS]) == [1, 2]
    with pytest.raises(ValueError):
        pareto_indices([{"tps": 1}], [])


def test_dominates() -> None:
    assert dominates([2, 1], [1, 1], ["maximize", "minimize"])
    assert not dominates([1, 1], [1, 1], ["maximize", "minimize"])
    assert dominates([1, 0.5], [1, 1], ["maximize", "minimize"])
    assert not dominates([2, 2], [1, 1], ["maximize", "minimize"])

"""benchmarks/simulation_accuracy.py: how each calibration's memory rate is chosen on the command line, and
what its summary says of the intervals' sources."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def accuracy(load_benchmark):
    return load_benchmark("simulation_accuracy")


@pytest.mark.parametrize("value", ["held", "fitted,", ",", "measured,guessed"])
def test_a_memory_rate_other_than_measured_or_fitted_is_refused(accuracy, value: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        accuracy.main(["--calibration-memory-rate", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "--calibration-memory-rate takes 'measured' or 'fitted', comma-separated" in err


def test_each_sources_median_width_is_taken_per_calibration_over_ttft_and_tpot(accuracy) -> None:
    def row(family: bool, ttft: list[dict], tpot: list[dict]) -> dict:
        return {"family": family, "ttft_interval_terms_each": ttft, "tpot_interval_terms_each": tpot}

    rows = [row(True, [{"run": [0.8, 1.2], "model_error": [0.7, 1.4]}, {"run": [0.9, 1.1], "model_error": [0.8, 1.2]}],
                [{"run": [0.75, 1.3], "model_error": [0.6, 1.5]}, {"run": [0.9, 1.2], "model_error": [0.9, 1.1]}]),
            row(True, [{"run": [0.8, 1.3], "model_error": [0.7, 1.3]}, {"run": [0.9, 1.1], "model_error": [0.8, 1.3]}],
                [{"run": [0.8, 1.2], "model_error": [0.5, 1.5]}, {"run": [0.9, 1.1], "model_error": [0.8, 1.1]}]),
            row(False, [{"run": [0.5, 2.0]}], [{"run": [0.5, 2.0]}])]
    widths = accuracy._term_widths(rows, True)
    # calibration 1: run widths 40, 55, 50, 40 -> median 45; model error 70, 90, 60, 100 -> 80
    assert widths[0] == pytest.approx({"run": 45.0, "model_error": 80.0})
    assert widths[1] == pytest.approx({"run": 20.0, "model_error": 35.0})
    assert accuracy._term_widths(rows, False) == [pytest.approx({"run": 150.0})]
    assert accuracy._term_widths([row(True, [], [])], True) == []

"""benchmarks/simulation_accuracy.py: how each calibration's memory rate is chosen on the command line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "simulation_accuracy.py"


@pytest.fixture(scope="module")
def accuracy():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("simulation_accuracy", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(SCRIPT.parent))


@pytest.mark.parametrize("value", ["held", "fitted,", ",", "measured,guessed"])
def test_a_memory_rate_other_than_measured_or_fitted_is_refused(accuracy, value: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        accuracy.main(["--calibration-memory-rate", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "--calibration-memory-rate takes 'measured' or 'fitted', comma-separated" in err

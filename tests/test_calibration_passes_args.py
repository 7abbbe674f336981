"""benchmarks/calibration_passes.py: the step-shaped cache share its ``--share-step`` refits use, and
the fits' own errors each variant prints."""

from __future__ import annotations

import math

import pytest

from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.simulation.calibration.fit import FitResult
from perfsdk.simulation.costmodel import cached_share


@pytest.fixture(scope="module")
def passes(load_benchmark):
    return load_benchmark("calibration_passes")


def test_a_step_share_serves_a_pass_inside_the_cache_whole_and_one_a_quarter_larger_not_at_all(passes) -> None:
    shares = passes.step_shares(8e6)
    assert shares.resident_bytes == [8e6, 10e6]
    assert shares.at(4e6) == 1.0
    assert shares.at(8e6) == 1.0
    assert shares.at(10e6) == 0.0
    assert shares.at(20e6) == 0.0
    # between the two sizes, linear in log bytes: 9 MB lies log(9/8) / log(1.25) of the way
    assert shares.at(9e6) == pytest.approx(1.0 - math.log(9 / 8) / math.log(1.25))
    # and the cost model reads it as it reads measured shares
    profile = builtin_profiles()["host-cpu"].model_copy(update={
        "cache_mb": 8.0, "cache_bandwidth_gbs": 40.0, "cache_shares": shares})
    assert cached_share(profile, 12e6) == 0.0
    assert cached_share(profile, 6e6) == 1.0


def test_the_fits_own_errors_are_pooled_by_model_and_phase_over_every_fit(passes) -> None:
    def fitted(errors: dict[str, float]) -> FitResult:
        return FitResult(coefficients={}, errors_pct=errors, iterations=1, observations=len(errors))

    one = fitted({"builtin:a b1 in16 out16 prefill": 4.0, "builtin:a b1 in16 out16 decode": -10.0,
                  "builtin:a b4 in32 out16 decode": -2.0, "type:codegen b1 in16 out16 decode": 7.0,
                  "micro matmul 1024^3 fp32": 50.0})
    two = fitted({"builtin:a b1 in16 out16 prefill": 6.0, "builtin:a b1 in16 out16 decode": -6.0,
                  "builtin:a b4 in32 out16 decode": -4.0, "type:codegen b1 in16 out16 decode": 9.0})
    assert passes.fit_residuals([one, two]) == {
        "builtin:a decode": -5.0,  # the median of -10, -2, -6, -4
        "builtin:a prefill": 5.0,
        "type:codegen decode": 8.0,
    }


@pytest.mark.parametrize("value", ["0", "8,0", "-4"])
def test_a_step_share_at_no_cache_is_refused(passes, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        passes.main(["--share-step", value])
    assert exc.value.code == 2
    assert "--share-step: each cache size must be above 0 MB (for none, --cache-mb 0)" in capsys.readouterr().err

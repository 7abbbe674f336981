"""Calibration: fit a host profile (effective FLOP/s, bandwidth, per-op overhead) to measurements.

Each observation is one phase of one measured ``generate`` call: the operations it executed
(from capture or the analytic generator) and the measured time (TTFT for the prefill, the
decode time for the decode steps); :mod:`~perfsdk.simulation.calibration.fit` describes the
cost model and how it is fitted.

The parts, by job:

- :mod:`~perfsdk.simulation.calibration.fit` — observations, the least-squares fit and the
  hardware profile made from it (:func:`fit`, :func:`profile_from_fit`).
- :mod:`~perfsdk.simulation.calibration.measure` — short measurements on this machine
  (:func:`calibrate_here`; its default grid is ``measure.DEFAULT_CALIBRATION_GRID``).
- :mod:`~perfsdk.simulation.calibration.from_store` — observations from runs already in a
  store (:func:`calibrate_from_store`).
"""

from __future__ import annotations

from perfsdk.simulation.calibration.fit import (
    CACHE_GRID,
    CACHE_MIN_GAIN,
    HALF_ROWS_GRID,
    PACK_ROWS_GRID,
    PARAMS,
    ConfigurationSamples,
    FitResult,
    Observation,
    bootstrap_coefficients,
    cached_fraction,
    fit,
    HeldOut,
    held_out_errors,
    held_out_predictions,
    keep_cache,
    keep_held_out,
    profile_from_fit,
)
from perfsdk.simulation.calibration.from_store import calibrate_from_store, measurements_of_run, model_config_of_run
from perfsdk.simulation.calibration.measure import (
    DEFAULT_CALIBRATION_GRID,
    DEFAULT_CALIBRATION_MODELS,
    DEFAULT_MAX_PASSES,
    DEFAULT_PASSES,
    PASS_SETTLE_PCT,
    REFERENCE_LABEL,
    REFERENCE_MODEL,
    REFERENCE_SHAPE,
    Measurement,
    ReferenceTimer,
    at_current_speed,
    build_random_model,
    calibrate_here,
    captured_observations_for,
    fit_with_micro,
    measure_generate,
    measure_in_session,
    median_of,
    micro_observations,
    normalised_runs,
    observations_for,
    pass_drift_pct,
    pass_levels,
    run_scatter,
    pass_order,
    passes_settled,
    reference_tracking,
    scaled,
    term_fit,
    term_tracking,
)

__all__ = [
    "REFERENCE_LABEL", "REFERENCE_MODEL", "REFERENCE_SHAPE", "at_current_speed", "ConfigurationSamples", "ReferenceTimer", "bootstrap_coefficients",
    "fit_with_micro", "HeldOut", "held_out_errors", "held_out_predictions", "keep_held_out", "measure_in_session", "median_of", "normalised_runs", "scaled",
    "CACHE_GRID", "CACHE_MIN_GAIN", "DEFAULT_CALIBRATION_GRID", "DEFAULT_CALIBRATION_MODELS", "HALF_ROWS_GRID", "PACK_ROWS_GRID", "PARAMS", "FitResult", "Measurement",
    "Observation", "build_random_model", "cached_fraction", "calibrate_from_store", "calibrate_here", "fit",
    "measure_generate", "measurements_of_run", "micro_observations", "model_config_of_run", "observations_for",
    "captured_observations_for", "pass_drift_pct", "pass_levels", "run_scatter", "pass_order", "passes_settled", "PASS_SETTLE_PCT", "DEFAULT_PASSES", "DEFAULT_MAX_PASSES", "profile_from_fit", "reference_tracking", "term_fit", "term_tracking", "keep_cache",
]

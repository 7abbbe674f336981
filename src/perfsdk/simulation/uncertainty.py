"""How far a prediction can be trusted: its origin, and an interval where a calibration allows one.

A prediction rests on one of three kinds of profile (:func:`profile_origin`):

- ``calibrated`` — fitted by ``perfsdk calibrate`` on a host; the profile carries a
  :class:`~perfsdk.hardware.profile.CalibrationRecord`, from which every predicted time gets an
  interval (:func:`time_interval_samples`);
- ``spec sheet`` — a built-in catalogue profile: peak figures from the vendor's sheet and
  efficiency factors that are literature estimates. No interval is invented for it;
- ``user file`` — any other profile (a YAML file, a plugin, a device-keyed architecture file):
  its figures are whatever its author wrote, so no interval either.

A predicted time ``p`` on a calibrated profile is the median of the predictions of the
calibration's bootstrap refits (:func:`bagged_factors`: each phase re-costed with every refit,
as a ratio to the central fit, and the central fit's time scaled by the median ratio). Its
interval is drawn from three independent sources of spread, each kept by the calibration: those
refits (the ratio of each to their median), the errors of predictions of configurations whose
model was left out of the fit (model error), and how far one run strays on this machine: each
calibration configuration's time in one pass on the raw clock over its median over the passes
(``CalibrationRecord.run_scatter``; on a calibration that did not keep it, the reference workload's
times relative to their median, which leave out the short stalls a run of milliseconds meets).
Every combination of the three is one possible measurement, ``p * ratio / (1 + error) * level``;
the interval is the central ``level`` share of them (90 % by default). Each source drawn alone, the
others held at the prediction (``terms`` of :func:`time_interval_samples`), says what widens an
interval most (``SimulationResult.interval_terms``).

The model error is that of models like the one predicted (:func:`model_errors`): a model of a
family the calibration measured draws on every held-out configuration; a model of any other
family (or of an unknown one) on the configurations whose fit left their whole family out, which
is what predicting a family the fit never saw risks. (Mixed in with the configurations of the
calibration's own family left out one model at a time, median |error| 5-6 %, the errors of the
families left out whole would be a third of the sample, and the intervals of other families
would follow the calibration's own family more than what another family risks.) For a family
the calibration did not measure, each error is taken both ways (:func:`mirrored`): the
measurement as far above the prediction as it was below, and the reverse. A calibration leaves
out whole only the few families it measures besides its own (two by default); they say how far
another family can be missed, not which way, since whether a family costs more or less than the
cost model says is that family's own. In ten calibrations of a 2-core x86 host, one of the two
was predicted 8-17 % short in prefill on all of its configurations, while
nine other families' TTFT came out from 7.5 % below their measurement to 9.0 % above in one of
them; the intervals drawn on the left-out families' errors one way held 76-100 % of those
families' measurements (median widths 30-35 %), both ways 94-100 % (35-40 %)
(docs/simulation-accuracy-log.md, "Which way a family the fit never saw misses").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.profile import CalibrationRecord, HardwareProfile, WeightRowCosts

ORIGINS = ("calibrated", "spec sheet", "user file")


@lru_cache(maxsize=1)
def _builtins() -> dict[str, HardwareProfile]:
    from perfsdk.hardware.catalog import builtin_profiles

    return builtin_profiles()


def profile_origin(profile: HardwareProfile) -> str:
    """``calibrated``, ``spec sheet`` (a built-in profile, unchanged) or ``user file``."""
    if profile.calibration is not None:
        return "calibrated"
    if _builtins().get(profile.name) == profile:
        return "spec sheet"
    return "user file"


def _threads(n: int) -> str:
    return f"{n} torch thread{'s' if n > 1 else ''}"


def origin_text(profile: HardwareProfile) -> str:
    """The origin as a user reads it: ``calibrated on <host> with <n> torch threads, <when>``
    (the threads where the calibration recorded them: its times are of runs with as many),
    ``spec sheet with efficiency factors`` or ``user file``."""
    origin = profile_origin(profile)
    if origin == "calibrated":
        cal = profile.calibration
        assert cal is not None
        threads = f" with {_threads(cal.threads)}" if cal.threads else ""
        return f"calibrated on {cal.host}{threads}, {cal.fitted_at}"
    if origin == "spec sheet":
        return "spec sheet with efficiency factors (estimates)"
    return "user file"


def threads_mismatch(profile: HardwareProfile, threads: int) -> str | None:
    """What a user should know when a run with ``threads`` torch threads is predicted with
    ``profile``, calibrated with another number of threads (None when they agree or the
    calibration did not record its threads). A CPU's matrix products change speed with the
    threads unevenly, by their rows and their weights' layout (a 2-core x86 host, PyTorch's CPU
    BLAS: a [1152, 384] linear layer's product of 16-48 rows ran 2.2-3.7 times slower with two
    threads than the same product on a weight stored [384, 1152], and both alike from 64 rows),
    so no factor carries a calibration from one thread count to another."""
    cal = profile.calibration
    if cal is None or not cal.threads or cal.threads == threads:
        return None
    return (f"{profile.name} was calibrated with {_threads(cal.threads)} and "
            f"this run used {threads}: its times and interval are of runs with {cal.threads}; calibrate with "
            f"`perfsdk calibrate --threads {threads}` to predict runs like this one")


def no_interval_reason(profiles: list[HardwareProfile]) -> str | None:
    """Why the predictions on these device profiles carry no interval (None: they all do)."""
    bare = [p for p in profiles if p.calibration is None]
    if bare:
        names = ", ".join(f"{p.name} ({profile_origin(p)})" for p in bare)
        return f"no interval: {names} not calibrated on a host, so there is no measured spread to draw one from"
    blind = [p.name for p in profiles if p.calibration is not None and not p.calibration.held_out]
    if blind:
        return (f"no interval: the calibration of {', '.join(blind)} predicted no model it was not fitted on "
                "(it needs measurements of at least two models), so it cannot say how far it misses one")
    return None


@dataclass
class Samples:
    """Possible measurements of each predicted phase time, one array per phase (same length)."""

    phases: dict[str, np.ndarray]
    level: float


def _phase_observation(ops: list[OpRecord], phase: str, step_weights: dict[int, float] | None) -> Any:
    from perfsdk.simulation.calibration.fit import Observation

    return Observation.from_ops(phase, "prefill" if phase in ("prefill", "encode") else phase, 1.0, ops,
                                step_weights)


def _whole_families_only(cal: CalibrationRecord, family: str | None) -> bool:
    """Whether a model of ``family`` draws on the held-out configurations of whole families only."""
    whole = cal.held_out_whole_family
    return (bool(cal.held_out) and len(whole) == len(cal.held_out) and any(whole)
            and family not in cal.families)


def mirrored(errors: np.ndarray) -> np.ndarray:
    """Each relative error ``e = (predicted - measured) / measured`` and its mirror ``e'``, the
    error of a measurement that lies as far the other way (``1 + e' = 1 / (1 + e)``: a prediction
    1.25 times its measurement becomes one 1.25 times below it)."""
    return np.vstack([errors, 1.0 / (1.0 + errors) - 1.0])


def _foreign(cal: CalibrationRecord, family: str | None) -> bool:
    """Whether ``family`` is known not to be one the calibration measured (the record names its
    families, and ``family`` is not among them)."""
    return bool(cal.families) and family not in cal.families


def model_errors(cal: CalibrationRecord, family: str | None) -> np.ndarray:
    """The held-out errors (rows ``[prefill, decode]``) that a prediction of a model of ``family``
    (its model type; None: unknown) draws its model error from: those of the configurations
    whose whole family was left out of the fit where ``family`` is not one the calibration
    measured and the record says which those are; every one otherwise (and on a record that
    does not say). For a family the calibration did not measure, each error is taken both ways
    (:func:`mirrored`): which way such a family misses is its own."""
    held = np.array(cal.held_out, dtype=float) if cal.held_out else np.zeros((1, 2))
    if _whole_families_only(cal, family):
        held = held[np.array(cal.held_out_whole_family, dtype=bool)]
    return mirrored(held) if _foreign(cal, family) else held


def model_error_basis(cal: CalibrationRecord, family: str | None) -> str:
    """Which held-out errors a prediction of a model of ``family`` draws on, as a user reads it."""
    who = family or "a model without a model type"
    both = ", each taken both ways (a family may cost more or less than the model says)" if _foreign(cal, family) else ""
    if _whole_families_only(cal, family):
        n = sum(cal.held_out_whole_family)
        return (f"{who} is not a family the calibration measured ({', '.join(cal.families)}): the cost model's "
                f"errors on the {n} configurations of the families left out of the fit whole{both}")
    n = len(cal.held_out)
    if family is not None and family in cal.families:
        return f"{family} is a family the calibration measured: the cost model's errors on all {n} held-out configurations"
    if cal.held_out_whole_family and len(cal.held_out_whole_family) == n and cal.families:
        return (f"{who} is not a family the calibration measured ({', '.join(cal.families)}), and it left no whole "
                f"family out of its fit: the cost model's errors on all {n} held-out configurations{both}")
    return (f"the cost model's errors on all {n} held-out configurations (the calibration does not say which left "
            "a whole family out)")


def _vectors(cal: CalibrationRecord) -> tuple[np.ndarray, list[np.ndarray]]:
    """The central coefficients and the bootstrap replicates' (or the central alone), in
    :data:`~perfsdk.simulation.calibration.fit.PARAMS` order."""
    from perfsdk.simulation.calibration.fit import COEFFICIENT_FALLBACK, PARAMS

    def at(p: str) -> int | None:
        if p in cal.params:
            return cal.params.index(p)
        return at(COEFFICIENT_FALLBACK[p]) if p in COEFFICIENT_FALLBACK else None

    order = [at(p) for p in PARAMS]

    def vec(values: list[float]) -> np.ndarray:
        return np.array([values[i] if i is not None else 0.0 for i in order])

    central = vec(cal.coefficients)
    return central, [vec(r) for r in cal.replicates] or [central]


def replicate_ratios(cal: CalibrationRecord, phase_ops: dict[str, list[OpRecord]],
                     step_weights: dict[int, float] | None = None) -> dict[str, np.ndarray]:
    """Each phase re-costed by the calibration's own cost model with every bootstrap replicate's
    coefficients, over its cost with the central coefficients (one ratio per replicate; ``[1]``
    where the record keeps no replicates)."""
    central, reps = _vectors(cal)
    out: dict[str, np.ndarray] = {}
    for phase, ops in phase_ops.items():
        obs = _phase_observation(ops, phase, step_weights)
        obs.small_m_gaps = cal.layout_gaps()
        if cal.pack_fast_bytes and cal.pack_fast_share:
            obs.pack_fast = (cal.pack_fast_bytes, cal.pack_fast_share)
        obs.few_rows = cal.few_rows if cal.pack_rows else None
        obs.row_costs = row_costs(cal, central)
        obs.cache_shares = cal.cache_shares
        base = obs.predict(central, 0.0, cal.cache_bytes, cal.pack_rows)
        out[phase] = np.array([obs.predict(r, 0.0, cal.cache_bytes, cal.pack_rows) / base if base > 0 else 1.0
                               for r in reps])
    return out


def row_costs(cal: CalibrationRecord, central: np.ndarray) -> tuple[WeightRowCosts, float] | None:
    """The cost per stored row by the row's length the calibration priced its products with, and
    the cost per row (ns) its held ``s_per_weight_row`` stands for (:attr:`Observation.row_costs
    <perfsdk.simulation.calibration.fit.Observation.row_costs>`; None: not measured)."""
    from perfsdk.simulation.calibration.fit import PARAMS

    unit = float(central[PARAMS.index("s_per_weight_row")]) * 1e9
    return (cal.weight_row_costs, unit) if cal.weight_row_costs is not None and unit > 0 else None


def bagged_factors(ratios: dict[str, np.ndarray]) -> dict[str, float]:
    """The median of each phase's replicate ratios (:func:`replicate_ratios`): what the central
    fit's time of that phase is multiplied by to give the prediction (bagging).

    The fit is piecewise (each op labelled compute- or memory-bound, the small-matrix term
    started from several points and the least loss kept), so a few percent more or less in one
    configuration's timing can move it to another labelling, and two calibrations of one machine
    then predicted the families they never saw up to 9 % apart. The median over the bootstrap
    refits does not jump with one labelling: in ten pairs of calibrations of a 2-core x86 host,
    the pairs' predictions of nine unseen families stood at most 3.1-7.8 % apart (8 of 10 pairs
    within 5 %) against 2.5-9.0 % (3 of 10) from the central fits, with the same accuracy against
    their measurement (docs/simulation-accuracy-log.md, "The median of the bootstrap refits")."""
    return {phase: float(np.median(r)) if len(r) else 1.0 for phase, r in ratios.items()}


def run_levels(cal: CalibrationRecord) -> list[float]:
    """The levels one run's time is drawn at, relative to the calibration's: its configurations'
    scatter from pass to pass on the raw clock (``run_scatter``), or the reference workload's
    levels where the calibration did not keep it (empty: neither)."""
    return cal.run_scatter or cal.levels


#: the three sources an interval draws on (:func:`time_interval_samples`): the bootstrap refits'
#: coefficients, the cost model's errors on models left out of the fit, one run's stray on the machine
INTERVAL_TERMS = ("coefficients", "model_error", "run")
#: how each source is named where it is printed
TERM_NAMES = {"coefficients": "refits' coefficients", "model_error": "model error", "run": "one run"}


def widest_source(bounds: dict[str, tuple[float, float]]) -> str | None:
    """The source whose interval alone is the widest (in log distance), of ``{source: (low,
    high)}`` factors of the prediction; None for none."""
    sized = {src: math.log(hi / lo) for src, (lo, hi) in bounds.items() if lo > 0 and hi > 0}
    return max(sized, key=lambda src: sized[src]) if sized else None


def time_interval_samples(cal: CalibrationRecord, phase_ops: dict[str, list[OpRecord]],
                          phase_times: dict[str, float], step_weights: dict[int, float] | None = None,
                          max_samples: int = 20000, family: str | None = None,
                          ratios: dict[str, np.ndarray] | None = None,
                          terms: tuple[str, ...] = INTERVAL_TERMS) -> Samples:
    """Possible measured times of each phase (``phase_times``: the prediction, bagged: the
    central fit's time times :func:`bagged_factors`) of a model of ``family`` (its model type,
    for :func:`model_errors`).

    Each phase is re-costed by the calibration's own cost model with every bootstrap replicate's
    coefficients (:func:`replicate_ratios`, or ``ratios`` already computed); the ratio to their
    median scales the prediction. The held-out errors of the same configuration (prefill and
    decode together) and one run's levels (:func:`run_levels`) are combined with every replicate. ``encode`` and
    ``forward`` take the prefill's held-out error (a full pass over the inputs), ``decode`` the
    decode's. ``terms``: the sources drawn on (of :data:`INTERVAL_TERMS`); each one left out is held
    at the prediction (one source alone: how wide it would make the interval on its own).
    """
    unknown = set(terms) - set(INTERVAL_TERMS)
    if unknown:
        raise ValueError(f"unknown interval terms {sorted(unknown)}: known {', '.join(INTERVAL_TERMS)}")
    if ratios is None:
        ratios = replicate_ratios(cal, phase_ops, step_weights) if "coefficients" in terms else {}
    if "coefficients" not in terms:
        ratios = {phase: np.ones(1) for phase in phase_ops}
    held = model_errors(cal, family) if "model_error" in terms else np.zeros((1, 2))
    drawn = run_levels(cal) if "run" in terms else []
    levels = np.array(drawn, dtype=float) if drawn else np.ones(1)
    n_reps = max(len(r) for r in ratios.values()) if ratios else 1
    # keep the product set bounded: thin the levels (they are a distribution, evenly spaced
    # quantiles keep its shape)
    room = max(1, max_samples // max(1, n_reps * len(held)))
    if len(levels) > room:
        levels = np.quantile(levels, np.linspace(0.0, 1.0, room))
    out: dict[str, np.ndarray] = {}
    for phase, ratio in ratios.items():
        rel = ratio / np.median(ratio)
        err = held[:, 1] if phase == "decode" else held[:, 0]
        # every (replicate, held-out configuration, level): p * ratio / (1 + error) * level
        s = (phase_times[phase] * rel[:, None, None] / (1.0 + err)[None, :, None] * levels[None, None, :])
        out[phase] = s.reshape(-1)
    return Samples(phases=out, level=cal.level)


def bounds(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` share of ``values``: (low, high)."""
    lo, hi = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)

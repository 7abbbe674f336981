"""Predictions that carry their uncertainty: the calibration record (bootstrap refits, held-out
errors, reference levels), drift normalisation, the intervals and origins the simulation gives."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import yaml

from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.hardware.profile import CalibrationRecord, parse_profile, profile_to_yaml
from perfsdk.models.tiny import tiny_llama_config
from perfsdk.simulation.calibration.fit import CACHE_GRID
from perfsdk.simulation.calibration import (PARAMS, REFERENCE_LABEL, ConfigurationSamples, at_current_speed, Measurement, bootstrap_coefficients, fit,
                                            held_out_errors, median_of, normalised_runs, pass_levels, pass_order,
                                            passes_settled, profile_from_fit, reference_tracking, run_scatter,
                                            term_fit, term_tracking)
from perfsdk.simulation.predictor import simulate_config
from perfsdk.simulation.uncertainty import profile_origin
from tests.test_simulation_fit import TRUTH, _observations


def _calibrated(held_out: list[list[float]], levels: list[float], replicates: int = 1,
                reference_s: float | None = None, tracking: float | None = None,
                apart: tuple[float, float] | None = None, scatter: list[float] | None = None):
    """A profile fitted to noise-free observations, with the given held-out errors and levels;
    every bootstrap replicate equal to the central coefficients (no parameter spread). With
    ``reference_s``: timed around this version's reference workload, at one thread."""
    obs, _ = _observations(np.random.default_rng(7), 16)
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    central = [res.coefficients[p] for p in PARAMS]
    res.replicates = [list(central) for _ in range(replicates)]
    res.held_out = held_out
    res.levels = levels
    res.run_scatter = scatter or []
    if reference_s is not None:
        res.reference, res.reference_s, res.reference_tracking = REFERENCE_LABEL, reference_s, tracking
        res.threads, res.clock = 1, "wall"
        if apart is not None:
            res.rest_tracking, res.memory_tracking = apart
    return profile_from_fit(res, name="my-host")


def _m(ttft: float, decode: float, model: str = "m") -> Measurement:
    return Measurement(model=model, batch_size=1, input_tokens=8, output_tokens=3, ttft_s=ttft, decode_s=decode,
                       repeats=3)


def test_each_pass_is_divided_by_its_adjacent_reference_and_brought_back_with_the_median() -> None:
    # the machine ran 10 % slower during the second pass: the reference saw it, so both passes
    # give the same time once normalised, at the reference's median level
    raw = {"cfg": [(_m(2.0, 4.0), 1.0), (_m(2.2, 4.4), 1.1), (_m(1.8, 3.6), 0.9)]}
    runs = normalised_runs(raw, reference_s=1.0)
    assert [r.ttft_s for r in runs["cfg"]] == pytest.approx([2.0, 2.0, 2.0])
    assert [r.decode_s for r in runs["cfg"]] == pytest.approx([4.0, 4.0, 4.0])
    runs = normalised_runs(raw, reference_s=1.05)
    assert median_of(runs["cfg"]).ttft_s == pytest.approx(2.1)
    assert median_of(runs["cfg"]).decode_s == pytest.approx(4.2)
    assert median_of(runs["cfg"]).repeats == 9


def test_the_normalisation_takes_the_power_the_passes_follow_the_reference_with() -> None:
    # passes that move exactly as the reference: exponent 1
    raw = {"a": [(_m(2.0, 4.0), 1.0), (_m(2.2, 4.4), 1.1), (_m(1.8, 3.6), 0.9)],
           "b": [(_m(1.0, 3.0), 1.0), (_m(1.1, 3.3), 1.1)]}
    assert reference_tracking(raw) == pytest.approx(1.0)
    # configurations that move half as much as the reference (in log terms): 0.5, and divided by
    # level ** 0.5 every pass of a configuration comes out the same
    half = {k: [(_m(m.ttft_s / adj ** 0.5, m.decode_s / adj ** 0.5), adj) for m, adj in v] for k, v in raw.items()}
    assert reference_tracking(half) == pytest.approx(0.5)
    runs = normalised_runs(half, reference_s=1.0, tracking=0.5)
    assert [r.ttft_s for r in runs["a"]] == pytest.approx([2.0, 2.0, 2.0])
    assert [r.decode_s for r in runs["b"]] == pytest.approx([3.0, 3.0])
    # brought back at the reference's median level to the same power: 1.21 ** 0.5 = 1.1
    assert normalised_runs(half, reference_s=1.21, tracking=0.5)["a"][0].ttft_s == pytest.approx(2.0 * 1.1)
    # a reference whose swings the configurations do not follow at all: 0, nothing divided out
    still = {"a": [(_m(2.0, 4.0), 1.0), (_m(2.0, 4.0), 1.2), (_m(2.0, 4.0), 0.8)]}
    assert reference_tracking(still) == pytest.approx(0.0)
    # moving against it: clipped at 0; more than it: clipped at 1
    against = {"a": [(_m(2.0, 4.0), 1.0), (_m(1.8, 3.6), 1.1)]}
    assert reference_tracking(against) == 0.0
    more = {"a": [(_m(2.0, 4.0), 1.0), (_m(2.6, 5.2), 1.1)]}
    assert reference_tracking(more) == 1.0
    # one pass, or a level that never moved: nothing to estimate, the plain division (1)
    assert reference_tracking({"a": [(_m(2.0, 4.0), 1.3)]}) == 1.0
    assert reference_tracking({"a": [(_m(2.0, 4.0), 1.0), (_m(2.5, 4.0), 1.0)]}) == 1.0
    # the passes as plain (TTFT, TPOT) tuples, as the accuracy benchmark keeps them
    assert reference_tracking({"a": [((2.0, 0.5), 1.0), ((2.0 * 1.1 ** 0.25, 0.5 * 1.1 ** 0.25), 1.1)]}) \
        == pytest.approx(0.25)


def test_the_memory_traffic_and_the_rest_follow_the_reference_with_exponents_of_their_own() -> None:
    levels = [1.0, 1.1, 0.9, 1.05]

    def passes(ttft: float, decode: float, b_ttft: float, b_decode: float) -> list[tuple[Measurement, float]]:
        return [(_m(ttft * lv ** b_ttft, decode * lv ** b_decode), lv) for lv in levels]

    # compute-bound phases (no memory traffic) follow the reference to the power 0.9, phases that
    # are all memory traffic to the power 0.2, a phase half of each to 0.55 (0.9 * 0.5 + 0.2 * 0.5)
    raw = {"small": passes(2.0, 4.0, 0.9, 0.9), "large": passes(3.0, 9.0, 0.9, 0.2), "mid": passes(1.0, 2.0, 0.55, 0.55)}
    shares = {"small": (0.0, 0.0), "large": (0.0, 1.0), "mid": (0.5, 0.5)}
    rest, memory = term_tracking(raw, shares)  # type: ignore[misc]
    assert (rest, memory) == (pytest.approx(0.9), pytest.approx(0.2))
    # one exponent for all of them lies in between
    assert 0.2 < reference_tracking(raw) < 0.9
    # memory traffic that moves against the reference: its exponent held at 0, the rest's fitted with it held
    against = {"small": passes(2.0, 4.0, 0.8, 0.8), "large": passes(3.0, 9.0, 0.8, -0.3)}
    assert term_tracking(against, {"small": (0.0, 0.0), "large": (0.0, 1.0)}) == (pytest.approx(0.8), 0.0)
    # every phase with the same share: the two cannot be told apart
    assert term_tracking(raw, {"small": (0.4, 0.4), "large": (0.4, 0.4), "mid": (0.4, 0.4)}) is None
    # shares that barely spread (one minus the regressors' squared correlation under 0.05): none either
    assert term_tracking(raw, {"small": (0.40, 0.40), "large": (0.40, 0.42), "mid": (0.41, 0.41)}) is None
    # a configuration without shares (not fitted) is left out; one pass says nothing
    assert term_tracking({**raw, "x": [(_m(1.0, 1.0), 1.0)], "y": passes(5.0, 5.0, 0.0, 0.0)}, shares) == \
        (pytest.approx(0.9), pytest.approx(0.2))
    assert term_tracking({"a": [(_m(2.0, 4.0), 1.1)]}, {"a": (0.0, 1.0)}) is None
    # both following to the same power, with the timings' own noise: the exponents come out apart
    # by less than twice the standard error of their difference, and one exponent stands for all
    rng = np.random.default_rng(3)
    lv = np.exp(rng.normal(0.0, 0.04, 8))
    noisy = {f"c{c}": [(_m(2.0 * v ** 0.7 * np.exp(rng.normal(0.0, 0.03)), 4.0 * v ** 0.7 * np.exp(rng.normal(0.0, 0.03))),
                        float(v)) for v in lv] for c in range(6)}
    noisy_shares = {f"c{c}": (0.1 * c, 0.2 * c) for c in range(6)}
    assert term_tracking(noisy, noisy_shares) is None
    said = term_fit(noisy, noisy_shares)[1]
    assert re.fullmatch(r"not told apart: the memory traffic \d\.\d\d, the rest \d\.\d\d \(their difference's standard "
                        r"error \d\.\d\d\), less than 2 standard errors apart", said), said
    assert term_fit(raw, {"small": (0.4, 0.4), "large": (0.4, 0.4), "mid": (0.4, 0.4)})[1] == (
        "not told apart: the phases' shares of memory traffic spread too little (0.000 against 0.05)")
    # the same noise with the memory traffic following to 0 and the rest to 1: told apart
    apart = {k: [(_m(m.ttft_s * v ** (1 - noisy_shares[k][0] - 0.7), m.decode_s * v ** (1 - noisy_shares[k][1] - 0.7)), v)
                 for m, v in runs] for k, runs in noisy.items()}
    rest, memory = term_tracking(apart, noisy_shares)  # type: ignore[misc]
    assert rest > 0.7 and memory < 0.3
    assert term_fit(apart, noisy_shares)[1].startswith("told apart: the memory traffic ")
    assert term_fit(against, {"small": (0.0, 0.0), "large": (0.0, 1.0)})[1] == (
        "told apart: the memory traffic -0.30, the rest 0.80 (their difference's standard error 0.00); in [0, 1], "
        "the memory traffic 0.00, the rest 0.80")


def test_a_fits_memory_share_is_its_bytes_from_memory_over_the_whole_predicted_time() -> None:
    from perfsdk.simulation.calibration.fit import FitResult, Observation

    # two ops: a matrix product of 2e6 FLOPs over 1e3 bytes (compute-bound at these rates) and an
    # add of 10 FLOPs over 4e6 bytes (memory-bound); 5 us per op, 20 us per forward pass
    ob = Observation(label="x", phase="decode", measured_s=1.0, flops=np.array([2e6, 10.0]),
                     bytes_=np.array([1e3, 4e6]), weights=np.array([1.0, 1.0]), forward_passes=1.0)
    coef = dict.fromkeys(PARAMS, 0.0)
    coef.update(s_per_flop=1e-10, s_per_byte=1e-10, op_overhead_s=5e-6, step_overhead_s=20e-6)
    res = FitResult(coefficients=coef, errors_pct={}, iterations=1, observations=1)
    compute, memory, fixed = 2e6 * 1e-10, 4e6 * 1e-10, 2 * 5e-6 + 20e-6
    assert res.memory_share(ob) == pytest.approx(memory / (compute + memory + fixed))
    assert res.memory_share(replace(ob, bytes_=np.array([1e3, 1.0]))) == 0.0


def test_a_profile_slower_by_two_factors_scales_the_memory_traffic_by_its_own() -> None:
    prof = _calibrated([[0.1, -0.1]], [1.0], reference_s=0.040, tracking=0.8, apart=(0.9, 0.25))
    prof = prof.model_copy(update={"matmul_pack_gbs": 30.0, "cache_bandwidth_gbs": 200.0, "cache_mb": 8.0})
    slow = prof.slower_by(1.2, 1.05)
    assert slow.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.05)
    assert slow.matmul_pack_gbs == pytest.approx(30.0 / 1.05)
    assert slow.cache_bandwidth_gbs == pytest.approx(200.0 / 1.2)  # the cache runs at the cores' speed
    assert slow.peak_tflops.fp32 == pytest.approx(prof.peak_tflops.fp32 / 1.2)  # type: ignore[operator]
    assert slow.op_overhead_s == pytest.approx(prof.op_overhead_s * 1.2)
    cal, now = prof.calibration, slow.calibration
    assert cal is not None and now is not None
    want = {"s_per_byte": 1.05, "s_per_packed_byte": 1.05}
    assert now.coefficients == pytest.approx([c * want.get(p, 1.2) for p, c in zip(cal.params, cal.coefficients)])
    assert now.replicates[0] == pytest.approx([c * want.get(p, 1.2) for p, c in zip(cal.params, cal.replicates[0])])
    assert now.reference_s == pytest.approx(0.040 * 1.2)
    # one factor: both alike, as before
    assert prof.slower_by(1.2).memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.2)
    with pytest.raises(ValueError, match="a speed factor must be positive"):
        prof.slower_by(1.2, 0.0)
    # the record's factors: the reference's ratio to each exponent; one exponent where not told apart
    assert cal.speed_factors(0.044) == (pytest.approx(1.1 ** 0.9), pytest.approx(1.1 ** 0.25), pytest.approx(1.1 ** 0.9))
    assert cal.speed_factor(0.044) == pytest.approx(1.1 ** 0.8)
    assert cal.model_copy(update={"memory_tracking": None}).speed_factors(0.044) == (
        pytest.approx(1.1 ** 0.8), pytest.approx(1.1 ** 0.8), pytest.approx(1.1 ** 0.8))
    # what the calibration found is said in the profile's source, and kept through a profile file
    assert ("Told apart by each phase's share of memory traffic, the memory traffic followed the reference workload "
            "to the power 0.25, the rest to 0.90.") in prof.source
    back = parse_profile(yaml.safe_load(profile_to_yaml(prof)))
    assert back.calibration is not None
    assert (back.calibration.rest_tracking, back.calibration.memory_tracking) == (0.9, 0.25)
    # re-timed: the memory traffic's factor apart, and said
    now_prof, factor, said = at_current_speed(prof, ticks=3, min_time_s=0.0,
                                              timer=_Timer(0.044, 0.044, 0.044))  # type: ignore[arg-type]
    assert factor == pytest.approx(1.1 ** 0.9)
    assert now_prof.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.1 ** 0.25)
    assert ("every predicted time x 1.090 (that ratio to the power 0.90), the memory traffic's x 1.024 (to the "
            "power 0.25, the one the calibration's memory-bound phases followed it with); the median of 3 timings"
            ) in said


def test_the_median_pass_is_settled_when_three_passes_covering_it_agree() -> None:
    # three passes: settled exactly when their whole spread is within the bound
    assert passes_settled([1.0, 1.02, 1.01], 3.0)
    assert not passes_settled([1.0, 1.05, 1.02], 3.0)
    # a fourth pass at the first's level: 1.0, 1.0, 1.02 agree and cover the median
    assert passes_settled([1.0, 1.05, 1.02, 1.0], 3.0)
    # passes split between two speeds, none of the middle three within 3 %: not settled
    assert not passes_settled([1.0, 1.06, 1.0, 1.06], 3.0)
    assert passes_settled([1.0, 1.06, 1.0, 1.06, 1.06], 3.0)  # the slower speed is now the majority
    # three that agree but leave the median outside them do not count
    assert not passes_settled([1.0, 1.01, 1.02, 1.10, 1.20, 1.30], 3.0)
    assert passes_settled([1.0, 1.2], 3.0)  # fewer than three: nothing more to decide on
    # the levels of the passes: each configuration's time over its fastest pass, median over them
    runs = [[_m(1.0, 1.0), _m(1.1, 1.1), _m(1.0, 1.0)], [_m(2.0, 2.0), _m(2.2, 2.2), _m(2.4, 2.4)],
            [_m(1.0, 1.0), _m(1.0, 1.0), _m(1.5, 1.5)]]
    assert pass_levels(runs) == pytest.approx([1.0, 1.1, 1.2])


def test_one_runs_scatter_is_every_pass_over_its_configurations_median_on_the_raw_clock() -> None:
    # two configurations in three passes, one measured once: TTFT and decode each over the median
    # of their own passes (1.0 and 2.0; 2.0 and 2.2), the single-pass configuration left out
    runs = [[_m(1.0, 2.0), _m(1.2, 2.4), _m(0.9, 1.8)], [_m(2.0, 2.2), _m(3.0, 2.2), _m(1.8, 2.2)],
            [_m(5.0, 5.0)]]
    assert run_scatter(runs) == pytest.approx([1.0, 1.2, 0.9, 1.0, 1.2, 0.9, 1.0, 1.5, 0.9, 1.0, 1.0, 1.0])
    assert run_scatter([[_m(1.0, 1.0)]]) == []


def test_calibrate_here_runs_more_passes_until_the_median_pass_is_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.simulation.calibration.measure as cal

    def machine(slow: dict[int, float]):  # type: ignore[no-untyped-def]
        """A machine that runs pass ``p`` ``slow[p]`` times slower than its normal speed."""
        def measure(model, b, i, o, *, calls, label, seed, min_time_s):  # type: ignore[no-untyped-def]
            f = slow.get(seed, 1.0)
            return Measurement(model=label, batch_size=b, input_tokens=i, output_tokens=o,
                               ttft_s=f * 1e-3 * b * i, decode_s=f * 2e-4 * b * (o - 1), repeats=calls)
        return measure

    kw = dict(grid=[(1, 8, 3), (2, 16, 3)], repeats=1, normalise=False, micro=False, replicates=2)
    models = ["builtin:tiny-llama-small", "builtin:tiny-llama-small@layers=1"]
    # the second pass ran 10 % slower: three passes do not settle, a fourth at the usual speed does
    monkeypatch.setattr(cal, "measure_in_session", machine({1: 1.10}))
    res, meas = cal.calibrate_here(models, passes=3, max_passes=6, **kw)
    assert res.passes == 4 and res.drift_pct == pytest.approx(10.0)
    assert meas[0].ttft_s == pytest.approx(1e-3 * 8)  # the median of 1.0, 1.1, 1.0, 1.0 times
    # without room for more (the default, or max_passes equal to passes): exactly the passes asked for
    assert cal.calibrate_here(models, passes=3, **kw)[0].passes == 3
    # a machine that never settles: up to max_passes and no more
    monkeypatch.setattr(cal, "measure_in_session", machine({p: 1.0 + 0.05 * p for p in range(10)}))
    assert cal.calibrate_here(models, passes=3, max_passes=5, **kw)[0].passes == 5
    # a steady machine: the passes asked for
    monkeypatch.setattr(cal, "measure_in_session", machine({}))
    res, _ = cal.calibrate_here(models, passes=3, max_passes=6, **kw)
    assert res.passes == 3 and res.drift_pct == pytest.approx(0.0)
    assert profile_from_fit(res).calibration.passes == 3  # type: ignore[union-attr]
    # the cache size is the one the working sets measured (none here: no micro-kernels), not a
    # choice of the fit; with cache=True the fit chooses on its grid (and the check against the
    # left-out models decides)
    grids = []
    real = cal.fit_with_micro

    def spy(micro, measured, **kw):  # type: ignore[no-untyped-def]
        grids.append(kw.get("cache_bytes"))
        return real(micro, measured, **kw)

    monkeypatch.setattr(cal, "fit_with_micro", spy)
    res, _ = cal.calibrate_here(models, passes=3, **kw)
    assert grids == [None] and res.cache_bytes == 0.0 and res.cache_note == "none: no working sets timed"
    grids.clear()
    cal.calibrate_here(models, passes=3, cache=True, **kw)
    assert grids[0] == CACHE_GRID  # the whole grid


def test_each_calibration_pass_measures_the_configurations_in_its_own_shuffled_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.simulation.calibration.measure as cal

    configs = [(m, b, 8, 3) for m in ("a", "b", "c") for b in (1, 2, 4, 8)]
    orders = [pass_order(configs, p, seed=0) for p in range(3)]
    for order in orders:
        assert sorted(order) == sorted(configs)  # every configuration, once
    assert orders[0] != configs and len({tuple(o) for o in orders}) == 3  # none in model order, none alike
    assert pass_order(configs, 1, seed=0) == orders[1]  # reproducible from the seed and the pass
    assert pass_order(configs, 1, seed=1) != orders[1]
    # model order would measure each model's configurations back to back: a shuffle breaks most runs
    runs = sum(1 for x, y in zip(orders[0], orders[0][1:]) if x[0] != y[0])
    assert runs >= 4

    # the calibration measures in exactly that order, pass after pass, and keeps its results in grid order
    seen: list[tuple[str, int, int, int, int]] = []

    def measure(model, b, i, o, *, calls, label, seed, min_time_s):  # type: ignore[no-untyped-def]
        seen.append((label, b, i, o, seed))
        return Measurement(model=label, batch_size=b, input_tokens=i, output_tokens=o,
                           ttft_s=1e-3 * b * i, decode_s=2e-4 * b * (o - 1), repeats=calls)

    monkeypatch.setattr(cal, "measure_in_session", measure)
    grid = [(1, 8, 3), (2, 16, 3), (4, 8, 3)]
    models = ["builtin:tiny-llama-small", "builtin:tiny-llama-small@layers=1"]
    _, meas = cal.calibrate_here(models, grid=grid, passes=2, seed=5, repeats=1, normalise=False, micro=False,
                                 replicates=2)
    keys = [(m, b, i, o) for m in models for b, i, o in grid]
    assert seen == [(*k, p) for p in range(2) for k in pass_order(keys, p, seed=5)]
    assert [(m.model, m.batch_size, m.input_tokens, m.output_tokens) for m in meas] == keys


def test_bootstrap_and_held_out_on_noise_free_timings_reproduce_the_fit() -> None:
    obs, _ = _observations(np.random.default_rng(11), 18)
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    # three "models" of six configurations, each measured identically in three passes
    configs = [ConfigurationSamples(model=f"m{i // 6}", observations=[o], per_pass=[[o.measured_s] * 3])
               for i, o in enumerate(obs)]
    reps = bootstrap_coefficients(res, configs, [], replicates=5, seed=1)
    assert len(reps) == 5
    truth = np.array([TRUTH[p] for p in PARAMS])
    for rep in reps:
        for o in obs:
            assert o.predict(np.array(rep)) == pytest.approx(o.predict(truth), rel=1e-5)
    # decode-only observations have no prefill to pair with: nothing held out
    assert held_out_errors(res, configs, []) == []
    pairs = []
    for i in range(0, len(obs) - 1, 2):
        pre = replace(obs[i], phase="prefill")
        pairs.append(ConfigurationSamples(model=f"m{i // 6}", observations=[pre, obs[i + 1]],
                                          per_pass=[[pre.measured_s], [obs[i + 1].measured_s]]))
    held = held_out_errors(res, pairs, [])
    assert len(held) == len(pairs)
    assert max(abs(x) for pair in held for x in pair) < 0.05


def test_calibration_record_round_trips_through_the_profile_yaml() -> None:
    prof = _calibrated([[0.1, -0.05], [-0.2, 0.15]], [0.95, 1.0, 1.05], replicates=3)
    cal = prof.calibration
    assert cal is not None and cal.params == list(PARAMS) and len(cal.replicates) == 3
    assert cal.held_out == [[0.1, -0.05], [-0.2, 0.15]]
    text = profile_to_yaml(prof)
    again = parse_profile(yaml.safe_load(text), "my-host.yaml")
    assert again == prof
    with pytest.raises(Exception, match="one per name in params"):
        CalibrationRecord(host="h", fitted_at="now", params=["a", "b"], coefficients=[1.0])


def test_a_calibration_recorded_before_the_prompts_own_call_cost_prices_those_calls_as_before() -> None:
    from perfsdk.simulation.uncertainty import _vectors

    prof = _calibrated([[0.1, -0.05], [-0.2, 0.15]], [0.95, 1.0, 1.05], replicates=3)
    cal = prof.calibration
    assert cal is not None
    at_call, at_prompt = PARAMS.index("call_overhead_s"), PARAMS.index("prefill_call_overhead_s")
    # the record as written before the coefficient existed: its name, value and replicates' values gone
    keep = [i for i, p in enumerate(cal.params) if p != "prefill_call_overhead_s"]
    old = cal.model_copy(update={"params": [cal.params[i] for i in keep],
                                 "coefficients": [cal.coefficients[i] for i in keep],
                                 "replicates": [[r[i] for i in keep] for r in cal.replicates]})
    central, reps = _vectors(old)
    assert central[at_prompt] == central[at_call] == cal.coefficients[cal.params.index("call_overhead_s")]
    assert [r[at_prompt] for r in reps] == [r[at_call] for r in reps]
    # and the profile without the field prices a prompt's calls at call_overhead_s
    before = prof.model_copy(update={"call_overhead_s": 5e-6, "prefill_call_overhead_s": None, "calibration": old})
    same, dearer = (prof.model_copy(update={"call_overhead_s": 5e-6, "prefill_call_overhead_s": x, "calibration": old})
                    for x in (5e-6, 9e-6))
    a, b, c = (simulate_config(tiny_llama_config("tiny-llama"), p, batch_size=1, input_tokens=16, output_tokens=9,
                               dtype="float32") for p in (before, same, dearer))
    assert a.ttft_s == pytest.approx(b.ttft_s, rel=1e-12) and a.tpot_s == pytest.approx(b.tpot_s, rel=1e-12)
    assert c.ttft_s > a.ttft_s and c.tpot_s == pytest.approx(a.tpot_s, rel=1e-12)


def test_interval_is_the_central_share_of_prediction_over_one_plus_error_times_level() -> None:
    # no parameter spread; held-out errors +25 % and 0 % (prefill), -20 % and 0 % (decode); levels 0.9 and 1.1
    prof = _calibrated([[0.25, -0.2], [0.0, 0.0]], [0.9, 1.1])
    res = simulate_config(tiny_llama_config("tiny-llama"), prof, batch_size=1, input_tokens=16, output_tokens=9,
                          dtype="float32")
    assert res.origin == "calibrated" and res.interval_level == 0.9 and res.interval_note is None
    assert res.origin_detail.startswith("my-host: calibrated on ")
    ttft = res.ttft_s
    # prefill samples: ttft/1.25 * {0.9, 1.1}, ttft * {0.9, 1.1}
    expect = np.quantile([ttft / 1.25 * 0.9, ttft / 1.25 * 1.1, ttft * 0.9, ttft * 1.1], [0.05, 0.95])
    assert (res.ttft_s_low, res.ttft_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    tpot = res.tpot_s
    expect = np.quantile([tpot / 0.8 * 0.9, tpot / 0.8 * 1.1, tpot * 0.9, tpot * 1.1], [0.05, 0.95])
    assert (res.tpot_s_low, res.tpot_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    assert res.phases["decode"].time_s_low == pytest.approx(res.tpot_s_low * 8, rel=1e-9)
    # throughput falls where the times rise
    assert res.output_tokens_per_s_low < res.output_tokens_per_s < res.output_tokens_per_s_high
    assert res.e2e_s_low < res.e2e_s < res.e2e_s_high
    # energy is never calibrated by timing: no interval, and the origin says so
    assert "energy figures copied from host-cpu" in res.energy_origin
    data = json.loads(res.model_dump_json())
    assert {"ttft_s_low", "ttft_s_high", "tpot_s_low", "tpot_s_high", "origin", "interval_level"} <= set(data)


def test_the_interval_draws_one_run_at_its_scatter_on_the_raw_clock_where_the_calibration_kept_it() -> None:
    # the reference's levels 0.95 and 1.05; one run strayed 0.8, 1.0 and 1.3 times its median: the
    # interval is drawn at the run's scatter, not at the reference's levels
    held, levels, scatter = [[0.25, -0.2], [0.0, 0.0]], [0.95, 1.05], [0.8, 1.0, 1.3]
    prof = _calibrated(held, levels, scatter=scatter)
    assert prof.calibration is not None and prof.calibration.run_scatter == scatter
    assert parse_profile(yaml.safe_load(profile_to_yaml(prof))) == prof  # kept in the profile file
    res = simulate_config(tiny_llama_config("tiny-llama"), prof, batch_size=1, input_tokens=16, output_tokens=9,
                          dtype="float32")
    tpot = res.tpot_s
    expect = np.quantile([tpot / (1 + e) * s for e in (-0.2, 0.0) for s in scatter], [0.05, 0.95])
    assert (res.tpot_s_low, res.tpot_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    # the same calibration without it draws on the reference's levels (narrower here)
    plain = simulate_config(tiny_llama_config("tiny-llama"), _calibrated(held, levels), batch_size=1,
                            input_tokens=16, output_tokens=9, dtype="float32")
    assert plain.tpot_s == pytest.approx(tpot, rel=1e-12)
    expect = np.quantile([tpot / (1 + e) * lv for e in (-0.2, 0.0) for lv in levels], [0.05, 0.95])
    assert (plain.tpot_s_low, plain.tpot_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    assert plain.tpot_s_high < res.tpot_s_high and plain.tpot_s_low > res.tpot_s_low


def test_a_calibrated_prediction_is_the_median_of_its_bootstrap_refits_predictions() -> None:
    # replicates at 0.9, 1.3 and 1.1 times every central coefficient: each re-costs every phase by
    # exactly that factor, so the median refit predicts 1.1 times the central fit, every op alike
    held, levels = [[0.25, -0.2], [0.0, 0.0]], [0.9, 1.1]
    plain = _calibrated(held, levels)
    cal = plain.calibration
    assert cal is not None
    bagged = plain.model_copy(update={"calibration": cal.model_copy(update={
        "replicates": [[k * c for c in cal.coefficients] for k in (0.9, 1.3, 1.1)]})})
    kw = dict(batch_size=2, input_tokens=16, output_tokens=9, dtype="float32")
    a = simulate_config(tiny_llama_config("tiny-llama"), plain, **kw)
    b = simulate_config(tiny_llama_config("tiny-llama"), bagged, **kw)
    assert b.ttft_s == pytest.approx(1.1 * a.ttft_s, rel=1e-9)
    assert b.tpot_s == pytest.approx(1.1 * a.tpot_s, rel=1e-9)
    assert b.output_tokens_per_s == pytest.approx(a.output_tokens_per_s / 1.1, rel=1e-9)
    for ph in ("prefill", "decode"):
        pa, pb = a.phases[ph], b.phases[ph]
        assert (pb.time_s, pb.compute_s, pb.memory_s, pb.overhead_s) == pytest.approx(
            (1.1 * pa.time_s, 1.1 * pa.compute_s, 1.1 * pa.memory_s, 1.1 * pa.overhead_s), rel=1e-9)
        assert (pb.flops, pb.bytes_moved) == (pa.flops, pa.bytes_moved)
    assert sum(l.time_s for l in b.layers if l.phase == "decode") == pytest.approx(
        1.1 * sum(l.time_s for l in a.layers if l.phase == "decode"), rel=1e-9)
    # the interval is that of every refit, held-out error and level around the central fit:
    # the refits' ratios (0.9, 1.3, 1.1) times the same samples as the plain profile's
    tpot = a.tpot_s
    samples = [tpot * k / (1 + e) * lv for k in (0.9, 1.3, 1.1) for e in (-0.2, 0.0) for lv in levels]
    assert (b.tpot_s_low, b.tpot_s_high) == pytest.approx(tuple(np.quantile(samples, [0.05, 0.95])), rel=1e-9)
    assert ("times are the median of the calibration's 3 bootstrap refits' predictions (against its central fit: "
            "prefill +10.0 %, decode +10.0 %)") in b.notes


def test_a_family_the_calibration_never_measured_draws_on_the_families_left_out_whole() -> None:
    from transformers import GPT2Config

    # two Llama models left out one at a time (+-1 %), one other family left out whole (-20 %)
    base = _calibrated([[0.01, -0.01], [-0.01, 0.01], [-0.2, -0.2]], [1.0])
    assert base.calibration is not None
    cal = base.calibration.model_copy(update={"held_out_whole_family": [False, False, True],
                                              "families": ["codegen", "llama"]})
    prof = base.model_copy(update={"calibration": cal})
    gpt2 = GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=1024, n_positions=128)
    res = simulate_config(gpt2, prof, batch_size=1, input_tokens=16, output_tokens=9, dtype="float32")
    # only the -20 % of the family left out whole, taken both ways: the samples are p / 0.8 (the
    # measurement 1.25 times the prediction) and p * 0.8 (the prediction 1.25 times the measurement)
    for p, lo, hi in ((res.ttft_s, res.ttft_s_low, res.ttft_s_high), (res.tpot_s, res.tpot_s_low, res.tpot_s_high)):
        assert (lo, hi) == pytest.approx((0.8 * p + 0.05 * (p / 0.8 - 0.8 * p), 0.8 * p + 0.95 * (p / 0.8 - 0.8 * p)),
                                         rel=1e-9)
    assert res.interval_basis == ("gpt2 is not a family the calibration measured (codegen, llama): the cost "
                                  "model's errors on the 1 configurations of the families left out of the fit whole, "
                                  "each taken both ways (a family may cost more or less than the model says)")
    # a Llama (a family the calibration measured) draws on all three
    res = simulate_config(tiny_llama_config("tiny-llama"), prof, batch_size=1, input_tokens=16, output_tokens=9,
                          dtype="float32")
    ttft = res.ttft_s
    expect = np.quantile([ttft / 1.01, ttft / 0.99, ttft / 0.8], [0.05, 0.95])
    assert (res.ttft_s_low, res.ttft_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    assert res.interval_basis == ("llama is a family the calibration measured: the cost model's errors on all 3 "
                                  "held-out configurations")
    # a record that does not say which entries left a whole family out: all of them, whatever the family
    res = simulate_config(gpt2, base, batch_size=1, input_tokens=16, output_tokens=9, dtype="float32")
    expect = np.quantile([res.tpot_s / 0.99, res.tpot_s / 1.01, res.tpot_s / 0.8], [0.05, 0.95])
    assert (res.tpot_s_low, res.tpot_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    assert res.interval_basis == ("the cost model's errors on all 3 held-out configurations (the calibration does "
                                  "not say which left a whole family out)")
    # a calibration of one family only: no family left out whole, so every entry, and it says why
    one = prof.model_copy(update={"calibration": cal.model_copy(update={"held_out_whole_family": [False] * 3,
                                                                        "families": ["llama"]})})
    # (each taken both ways: gpt2 is not a family it measured)
    res = simulate_config(gpt2, one, batch_size=1, input_tokens=16, output_tokens=9, dtype="float32")
    t = res.tpot_s
    expect = np.quantile([t / 0.99, t / 1.01, t / 0.8, t * 0.99, t * 1.01, t * 0.8], [0.05, 0.95])
    assert (res.tpot_s_low, res.tpot_s_high) == pytest.approx(tuple(expect), rel=1e-9)
    assert res.interval_basis == ("gpt2 is not a family the calibration measured (llama), and it left no whole family "
                                  "out of its fit: the cost model's errors on all 3 held-out configurations, each "
                                  "taken both ways (a family may cost more or less than the model says)")
    # the record round-trips, and one flag per entry is required
    again = parse_profile(yaml.safe_load(profile_to_yaml(prof)), "my-host.yaml")
    assert again.calibration is not None and again.calibration.held_out_whole_family == [False, False, True]
    assert again.calibration.families == ["codegen", "llama"]
    with pytest.raises(Exception, match=r"held_out_whole_family needs one value per held_out entry \(3\), got 2"):
        CalibrationRecord(host="h", fitted_at="now", params=["a"], coefficients=[1.0],
                          held_out=[[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]], held_out_whole_family=[True, False])


def test_an_error_taken_both_ways_is_as_far_on_the_other_side_of_the_measurement() -> None:
    from perfsdk.simulation.uncertainty import mirrored

    # predicted 1.25 x measured (+25 %) mirrors to 1.25 x below (-20 %), and back; 0 stays 0
    out = mirrored(np.array([[0.25, -0.2], [0.0, 0.1]]))
    assert out.shape == (4, 2)
    assert out[:2].tolist() == [[0.25, -0.2], [0.0, 0.1]]
    assert out[2:] == pytest.approx(np.array([[-0.2, 0.25], [0.0, 1 / 1.1 - 1]]), rel=1e-12)
    assert mirrored(out[2:])[2:] == pytest.approx(np.array([[0.25, -0.2], [0.0, 0.1]]), rel=1e-12)


def test_spec_sheet_and_user_file_profiles_say_so_instead_of_an_interval() -> None:
    h100 = builtin_profiles()["h100-sxm"]
    assert profile_origin(h100) == "spec sheet"
    res = simulate_config(tiny_llama_config("tiny-llama"), h100, batch_size=1, input_tokens=16, output_tokens=4)
    assert res.origin == "spec sheet" and res.interval_level is None and res.ttft_s_low is None
    assert res.interval_note == ("no interval: h100-sxm (spec sheet) not calibrated on a host, so there is no "
                                 "measured spread to draw one from")
    mine = h100.model_copy(update={"name": "my-gpu", "memory_efficiency": 0.8})
    assert profile_origin(mine) == "user file"
    res = simulate_config(tiny_llama_config("tiny-llama"), mine, batch_size=1, input_tokens=16, output_tokens=4)
    assert res.origin == "user file" and res.tpot_s_high is None
    assert res.interval_note.startswith("no interval: my-gpu (user file)")


def test_session_run_with_a_calibrated_host_judges_the_measurement_with_the_interval(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import csv

    import torch
    from click.testing import CliRunner
    from transformers import LlamaConfig, LlamaForCausalLM

    import perfsdk
    from perfsdk.cli.main import cli
    from perfsdk.experiments.report.page import build_report
    from perfsdk.store import Store

    # wide enough to hold any measurement of this tiny model on any machine: half the held-out
    # errors -99.9 %, half +99900 % (measurements from a thousandth to a thousand times the
    # prediction; the run has no warm-up: its cold first prefill measured 33x the prediction once,
    # and over 100x in two runs of this test)
    host = tmp_path / "my-host.yaml"
    held = [[-0.999, -0.999]] * 10 + [[999.0, 999.0]] * 10
    host.write_text(profile_to_yaml(_calibrated(held, [1.0])), encoding="utf-8")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                         max_position_embeddings=256)).eval()
    ids = torch.randint(4, 256, (1, 10))
    cfg = {"collectors": {"simulation": {"targets": ["h100-sxm"], "host": str(host)}},
           "store": str(tmp_path / "store"), "exporters": ["json", "csv"]}
    with perfsdk.session(cfg) as s:
        s.load(model=model)
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                   pad_token_id=0)
    res = s.result.collectors["simulation"]
    here = res["predictions"][str(host)] if str(host) in res["predictions"] else res["predictions"][res["measured_profile"]]
    assert here["origin"] == "calibrated" and here["interval_level"] == 0.9
    assert here["ttft_s_low"] < here["ttft_s"] < here["ttft_s_high"]
    h100 = res["predictions"]["h100-sxm"]
    assert h100["origin"] == "spec sheet" and h100["ttft_s_low"] is None
    assert h100["interval_note"].startswith("no interval: h100-sxm (spec sheet)")
    for phase in ("prefill", "decode", "tpot"):
        e = res["comparison"][phase]
        assert e["predicted_low_s"] <= e["predicted_s"] <= e["predicted_high_s"]
        assert e["inside_interval"] is (e["predicted_low_s"] <= e["measured_s"] <= e["predicted_high_s"])
        assert e["inside_interval"] is True
    # the stored run: the report's simulation section and the CSV export carry them
    store = Store(tmp_path / "store")
    _, sections = build_report(store, s.result.run_id)
    sim = next(sec for sec in sections if getattr(sec, "slug", None) == "simulation")
    html = "".join(sim.html)
    assert "90 % interval" in html and "inside" in html
    assert "h100-sxm: spec sheet, no interval" in html
    # the source that widens the calibrated prediction's interval most: the held-out errors here
    from html import unescape

    assert ("calibrated, 90 % interval in brackets (widest source: TTFT's model error, TPOT's model error)"
            in " ".join(unescape(html).split()))
    r = CliRunner().invoke(cli, ["export", "--store", str(tmp_path / "store"), "--format", "csv", "-o",
                                 str(tmp_path / "runs.csv")])
    assert r.exit_code == 0, r.output
    with open(tmp_path / "runs.csv", newline="", encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))
    measured = res["measured_profile"]
    assert float(row[f"collectors.simulation.predictions.{measured}.ttft_s_low"]) == pytest.approx(here["ttft_s_low"])
    assert row["collectors.simulation.comparison.tpot.inside_interval"] in ("True", "true")
    # each source of the interval on its own, as factors of the prediction, in the stored run's
    # columns: the held-out errors -99.9 % and +99900 % alone give 1/1000 to 1000 times the
    # prediction; one run (the reference at 1.0) and the refits (one, at the central fit) nothing
    col = f"collectors.simulation.predictions.{measured}.interval_terms"
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        assert float(row[f"{col}.{metric}.model_error.low"]) == pytest.approx(1e-3, rel=1e-9)
        assert float(row[f"{col}.{metric}.model_error.high"]) == pytest.approx(1e3, rel=1e-9)
        for source in ("run", "coefficients"):
            assert float(row[f"{col}.{metric}.{source}.low"]) == pytest.approx(1.0, rel=1e-9)
            assert float(row[f"{col}.{metric}.{source}.high"]) == pytest.approx(1.0, rel=1e-9)
    assert here["interval_terms"]["tpot_s"]["model_error"] == {"low": pytest.approx(1e-3), "high": pytest.approx(1e3)}


def test_the_collector_gives_the_run_model_s_family_to_its_interval(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import perfsdk

    # one entry from a family left out whole (-50 %), one from a model left out (0 %)
    base = _calibrated([[-0.5, -0.5], [0.0, 0.0]], [1.0])
    assert base.calibration is not None

    def record(name: str, families: list[str]) -> str:
        cal = base.calibration.model_copy(update={"held_out_whole_family": [True, False], "families": families})
        path = tmp_path / f"{name}.yaml"
        path.write_text(profile_to_yaml(base.model_copy(update={"name": name, "calibration": cal})), encoding="utf-8")
        return str(path)

    never = record("never-saw-llama", ["gpt2"])
    saw = record("saw-llama", ["llama"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                         max_position_embeddings=256)).eval()
    ids = torch.randint(4, 256, (1, 10))
    cfg = {"collectors": {"simulation": {"targets": [saw], "host": never}}}
    with perfsdk.session(cfg) as s:
        s.load(model=model)
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                   pad_token_id=0)
    preds = s.result.collectors["simulation"]["predictions"]
    # a calibration that measured no Llama: only the family left out whole, taken both ways: the
    # samples p / 0.5 and p * 0.5
    here = preds[never]
    expect = np.quantile([2 * here["ttft_s"], 0.5 * here["ttft_s"]], [0.05, 0.95])
    assert (here["ttft_s_low"], here["ttft_s_high"]) == pytest.approx(tuple(expect))
    assert (here["ttft_s_low"], here["ttft_s_high"]) == pytest.approx((0.575 * here["ttft_s"], 1.925 * here["ttft_s"]))
    assert here["interval_basis"].startswith("llama is not a family the calibration measured (gpt2)")
    # one that measured a Llama: both entries
    other = preds[saw]
    expect = np.quantile([other["ttft_s"] / 0.5, other["ttft_s"]], [0.05, 0.95])
    assert (other["ttft_s_low"], other["ttft_s_high"]) == pytest.approx(tuple(expect))


def test_each_source_of_the_interval_alone_is_its_own_samples_central_share() -> None:
    # refits at 0.9, 1.3 and 1.1 times the central coefficients (ratios to their median 0.818,
    # 1.182, 1); held-out errors +25 % and 0 % (prefill), -20 % and 0 % (decode); one run strayed
    # 0.8, 1.0 and 1.3 times its median
    held, levels, scatter = [[0.25, -0.2], [0.0, 0.0]], [0.95, 1.05], [0.8, 1.0, 1.3]
    plain = _calibrated(held, levels, scatter=scatter)
    cal = plain.calibration
    assert cal is not None
    prof = plain.model_copy(update={"calibration": cal.model_copy(update={
        "replicates": [[k * c for c in cal.coefficients] for k in (0.9, 1.3, 1.1)]})})
    res = simulate_config(tiny_llama_config("tiny-llama"), prof, batch_size=2, input_tokens=16, output_tokens=9,
                          dtype="float32")

    def central(values: list[float]) -> tuple[float, float]:
        lo, hi = np.quantile(values, [0.05, 0.95])
        return float(lo), float(hi)

    expect = {"coefficients": central([k / 1.1 for k in (0.9, 1.3, 1.1)]),
              "run": central(scatter)}
    for metric, errors in (("ttft_s", (0.25, 0.0)), ("tpot_s", (-0.2, 0.0))):
        terms = res.interval_terms[metric]
        assert list(terms) == ["coefficients", "model_error", "run"]
        for source, (lo, hi) in {**expect, "model_error": central([1 / (1 + e) for e in errors])}.items():
            assert (terms[source].low, terms[source].high) == pytest.approx((lo, hi), rel=1e-9), (metric, source)
    # the three together make the interval itself (every combination: wider than any alone)
    together = central([k / 1.1 / (1 + e) * s for k in (0.9, 1.3, 1.1) for e in (-0.2, 0.0) for s in scatter])
    assert (res.tpot_s_low / res.tpot_s, res.tpot_s_high / res.tpot_s) == pytest.approx(together, rel=1e-9)
    assert res.tpot_s_high / res.tpot_s > max(t.high for t in res.interval_terms["tpot_s"].values())
    # the end-to-end time mixes the prefill's and the decode's errors of the same configuration
    e2e = res.interval_terms["e2e_s"]["model_error"]
    pre, dec = res.phases["prefill"].time_s, res.phases["decode"].time_s
    assert (e2e.low, e2e.high) == pytest.approx(central([(pre / (1 + a) + dec / (1 + b)) / (pre + dec)
                                                         for a, b in held]), rel=1e-9)
    # a profile without an interval has no terms either
    assert simulate_config(tiny_llama_config("tiny-llama"), builtin_profiles()["h100-sxm"], batch_size=1, input_tokens=8,
                           output_tokens=4).interval_terms == {}


def test_simulate_command_prints_the_interval_and_origin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from perfsdk.cli.simulate import simulate_command

    host = tmp_path / "my-host.yaml"
    host.write_text(profile_to_yaml(_calibrated([[0.1, -0.1], [-0.1, 0.1]], [0.94, 1.06])), encoding="utf-8")
    args = ["--model", "builtin:tiny-llama", "--hardware", str(host), "--output-tokens", "4", "--input-tokens", "8"]
    r = CliRunner().invoke(simulate_command, [*args, "--json"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["origin"] == "calibrated" and data["interval_level"] == 0.9
    assert data["ttft_s_low"] < data["ttft_s"] < data["ttft_s_high"]
    r = CliRunner().invoke(simulate_command, args, env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "90 % interval" in r.output
    assert "times: my-host: calibrated on " in r.output
    assert "with 1 torch thread" not in r.output  # this fit recorded no threads
    assert "energy: my-host: energy figures copied from host-cpu" in r.output
    assert "model error: the cost model's errors on all 2 held-out configurations" in r.output
    # held-out errors of +-10 % (1 / 1.1 and 1 / 0.9 of the prediction: their central 90 % 0.919 to
    # 1.101), one run at 0.94 and 1.06 (the reference's levels: their central 90 % 0.946 to 1.054, clear
    # of a rounding edge in the printed percent), one refit at the central fit
    assert ("each source alone (the others at the prediction): TTFT refits' coefficients +0…+0 %, model error "
            "-8…+10 %, one run -5…+5 % (widest: model error); TPOT refits' coefficients +0…+0 %, model error "
            "-8…+10 %, one run -5…+5 % (widest: model error)") in " ".join(r.output.split())
    assert data["interval_terms"]["tpot_s"]["run"] == {"low": pytest.approx(0.946), "high": pytest.approx(1.054)}
    r = CliRunner().invoke(simulate_command, ["--model", "builtin:tiny-llama", "--hardware", "l4",
                                              "--output-tokens", "4"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "interval" not in r.output.split("times:")[0]
    assert "times: l4: spec sheet with efficiency factors (estimates)" in r.output
    assert "no interval: l4 (spec sheet) not calibrated on a host" in " ".join(r.output.split())


def test_a_run_with_other_torch_threads_than_the_calibration_is_told_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import perfsdk
    from perfsdk.simulation.uncertainty import origin_text, threads_mismatch

    base = _calibrated([[0.1, -0.1], [-0.1, 0.1]], [1.0], reference_s=0.05, tracking=1.0)
    assert base.calibration is not None and base.calibration.threads == 1
    assert origin_text(base) == f"calibrated on {base.calibration.host} with 1 torch thread, {base.calibration.fitted_at}"
    now = torch.get_num_threads()

    def with_threads(name: str, threads: int | None) -> str:
        cal = base.calibration.model_copy(update={"threads": threads})
        path = tmp_path / f"{name}.yaml"
        path.write_text(profile_to_yaml(base.model_copy(update={"name": name, "calibration": cal})), encoding="utf-8")
        return str(path)

    other = now + 1
    said = (f"other-threads was calibrated with {other} torch threads and this run used {now}: its times and "
            f"interval are of runs with {other}; calibrate with `perfsdk calibrate --threads {now}` to predict "
            "runs like this one")
    assert threads_mismatch(base.model_copy(update={"name": "other-threads", "calibration": base.calibration.model_copy(
        update={"threads": other})}), now) == said
    assert threads_mismatch(base, 1) is None
    # a calibration that did not record its threads cannot tell: nothing said
    assert threads_mismatch(base.model_copy(update={"calibration": base.calibration.model_copy(
        update={"threads": None})}), 3) is None
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                         max_position_embeddings=256)).eval()
    ids = torch.randint(4, 256, (1, 10))
    notes = {}
    for name, threads in (("other-threads", other), ("same-threads", now)):
        cfg = {"collectors": {"simulation": {"host": with_threads(name, threads)}}}
        with perfsdk.session(cfg) as s:
            s.load(model=model)
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                       min_new_tokens=3, pad_token_id=0)
        res = s.result.collectors["simulation"]
        notes[name] = res["notes"]
        assert res["predictions"][res["measured_profile"]]["origin_detail"] == (
            f"{name}: calibrated on {base.calibration.host} with {threads} torch thread{'s' if threads > 1 else ''}, "
            f"{base.calibration.fitted_at}")
    assert said in notes["other-threads"]
    assert not any("torch thread" in n for n in notes["same-threads"])


class _Timer:
    """A reference workload that takes the given times, one per timing."""

    def __init__(self, *times: float) -> None:
        self.given, self.times = list(times), []  # type: ignore[var-annotated]

    def tick(self) -> float:
        self.times.append(self.given[len(self.times)])
        return self.times[-1]


def test_a_calibrated_host_at_its_speed_now_prices_every_time_by_the_reference_ratio() -> None:
    prof = _calibrated([[0.1, -0.1], [-0.1, 0.1]], [0.95, 1.05], reference_s=0.040, tracking=0.5)
    # the reference now takes 44 ms (the median of three timings) against 40 ms when calibrated;
    # the calibration's work followed it to the power 0.5: every time x 1.1 ** 0.5
    now, factor, said = at_current_speed(prof, ticks=3, min_time_s=0.0,
                                         timer=_Timer(0.044, 0.050, 0.043))  # type: ignore[arg-type]
    f = 1.1 ** 0.5
    assert factor == pytest.approx(f)
    # the re-timing is a window of seconds: it may stray from the machine's level as far as the
    # calibration's levels (0.95, 1.05) did, 1 / level; the central 90 % of (1 / 1.05, 1 / 0.95)
    lo = 1 / 1.05 + 0.05 * (1 / 0.95 - 1 / 1.05)
    hi = 1 / 1.05 + 0.95 * (1 / 0.95 - 1 / 1.05)
    assert f"{100 * (lo - 1):+.1f} / {100 * (hi - 1):+.1f}" == "-4.3 / +4.8"
    assert said == ("at this machine's speed now: the reference workload took 44.00 ms against 40.00 ms when "
                    "my-host was calibrated; every predicted time x 1.049 (that ratio to the power 0.50); the median "
                    "of 3 timings over 0.0 s, from 43.00 ms to 50.00 ms; a window of seconds strays from the "
                    "machine's level by -4.3 / +4.8 % (90 %, as the calibration's reference did), which the "
                    "intervals include")
    # the machine's levels: the run's level (0.95 or 1.05) times the window's stray (1 / 0.95 or 1 / 1.05)
    assert sorted(now.calibration.levels) == pytest.approx(  # type: ignore[union-attr]
        sorted([1.0, 0.95 / 1.05, 1.05 / 0.95, 1.0]))
    assert now.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / f)
    assert now.peak_tflops.fp32 == pytest.approx(prof.peak_tflops.fp32 / f)  # type: ignore[operator]
    assert now.op_overhead_s == pytest.approx(prof.op_overhead_s * f)
    assert now.step_overhead_s == pytest.approx(prof.step_overhead_s * f)
    assert now.memory_capacity_gb == prof.memory_capacity_gb and now.static_power_w == prof.static_power_w
    assert now.calibration.reference_s == pytest.approx(0.044 ** 0.5 * 0.040 ** 0.5)  # type: ignore[union-attr]
    assert now.calibration.coefficients == pytest.approx([c * f for c in prof.calibration.coefficients])  # type: ignore[union-attr]
    assert parse_profile(yaml.safe_load(profile_to_yaml(now))) == now  # still a valid profile file
    cfg = tiny_llama_config("tiny-llama")
    base = simulate_config(cfg, prof, batch_size=2, input_tokens=16, output_tokens=4)
    slow = simulate_config(cfg, now, batch_size=2, input_tokens=16, output_tokens=4)
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        assert getattr(slow, metric) == pytest.approx(getattr(base, metric) * f, rel=1e-9), metric
    assert slow.output_tokens_per_s == pytest.approx(base.output_tokens_per_s / f, rel=1e-9)  # type: ignore[operator]
    # the interval moves with the speed and widens by the re-timing's uncertainty
    for x in ("ttft_s", "tpot_s"):
        assert getattr(slow, f"{x}_low") < getattr(base, f"{x}_low") * f < getattr(slow, x), x
        assert getattr(slow, x) < getattr(base, f"{x}_high") * f < getattr(slow, f"{x}_high"), x
    # a calibration that kept one run's scatter draws the run there, and the window's stray from
    # the reference's levels: every run level (0.8, 1.0, 1.3) times every stray (1 / 0.95, 1 / 1.05)
    spread = prof.model_copy(update={"calibration": prof.calibration.model_copy(  # type: ignore[union-attr]
        update={"run_scatter": [0.8, 1.0, 1.3]})})
    now_s, _, said_s = at_current_speed(spread, ticks=3, min_time_s=0.0,
                                        timer=_Timer(0.044, 0.050, 0.043))  # type: ignore[arg-type]
    assert said_s == said
    assert now_s.calibration.levels == prof.calibration.levels  # type: ignore[union-attr]
    assert sorted(now_s.calibration.run_scatter) == pytest.approx(  # type: ignore[union-attr]
        sorted(r / lv for r in (0.8, 1.0, 1.3) for lv in (0.95, 1.05)))
    # a calibration that kept no levels has no stray to draw: its interval only moves, and the note
    # claims nothing about it
    cal0 = prof.calibration
    assert cal0 is not None
    flat = prof.model_copy(update={"calibration": cal0.model_copy(update={"levels": []})})
    still, _, said0 = at_current_speed(flat, ticks=3, min_time_s=0.0, timer=_Timer(0.044, 0.044, 0.044))  # type: ignore[arg-type]
    assert said0.endswith("the median of 3 timings over 0.0 s, from 44.00 ms to 44.00 ms")
    flat_base = simulate_config(cfg, flat, batch_size=2, input_tokens=16, output_tokens=4)
    moved = simulate_config(cfg, still, batch_size=2, input_tokens=16, output_tokens=4)
    for metric in ("ttft_s_low", "ttft_s_high", "tpot_s_low", "tpot_s_high"):
        assert getattr(moved, metric) == pytest.approx(getattr(flat_base, metric) * f, rel=1e-9), metric
    # a described family captured because the profile prices each ATen call: said so, and no
    # claim that an analytic description is missing
    per_call = simulate_config(cfg, prof.model_copy(update={"call_overhead_s": 3e-6}), batch_size=1,
                               input_tokens=8, output_tokens=2)
    assert per_call.notes[-1] == "ops captured from the model's own code: the calibrated profile prices each ATen call"
    assert not any(n.startswith("analytic cross-check") for n in per_call.notes)
    # what cannot be brought to this machine's speed says why
    with pytest.raises(ValueError, match="re-timed from a calibration on this host with the reference workload"):
        at_current_speed(builtin_profiles()["h100-sxm"])
    with pytest.raises(ValueError, match="re-timed from a calibration on this host"):
        at_current_speed(_calibrated([[0.1, -0.1]], [1.0]))  # no reference (as from stored runs)
    cal = prof.calibration
    assert cal is not None
    other = prof.model_copy(update={"calibration": cal.model_copy(update={"host": "Some Other CPU"})})
    with pytest.raises(ValueError, match="calibrated on Some Other CPU, and this machine is"):
        at_current_speed(other)
    older = prof.model_copy(update={"calibration": cal.model_copy(update={"reference": "builtin:x batch 1"})})
    with pytest.raises(ValueError, match="timed the reference 'builtin:x batch 1'.*calibrate again"):
        at_current_speed(older)
    unthreaded = prof.model_copy(update={"calibration": cal.model_copy(update={"threads": None})})
    with pytest.raises(ValueError, match="did not record how many torch threads it ran with.*calibrate again"):
        at_current_speed(unthreaded)


def test_simulate_and_the_collector_at_the_current_speed_time_the_reference_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import re

    import torch
    from click.testing import CliRunner
    from transformers import LlamaConfig, LlamaForCausalLM

    from rich.console import Console

    import perfsdk
    from perfsdk.cli.simulate import simulate_command
    from perfsdk.collectors.simulation import _summary_tables

    host = tmp_path / "my-host.yaml"
    host.write_text(profile_to_yaml(_calibrated([[0.1, -0.1], [-0.1, 0.1]], [0.95, 1.05], reference_s=0.040,
                                                tracking=1.0)), encoding="utf-8")
    args = ["--model", "builtin:tiny-llama", "--hardware", str(host), "--output-tokens", "4", "--input-tokens", "8",
            "--json"]
    base = json.loads(CliRunner().invoke(simulate_command, args).output)
    r = CliRunner().invoke(simulate_command, [*args, "--at-current-speed"])
    assert r.exit_code == 0, r.output
    now = json.loads(r.output)
    said = re.fullmatch(r"at this machine's speed now: the reference workload took (\S+) ms against 40\.00 ms when "
                        r"my-host was calibrated; every predicted time x (\d+\.\d{3}) \(that ratio to the "
                        r"power 1\.00\); the median of (\d+) timings over (\d+\.\d) s, from \S+ ms to \S+ ms; "
                        r"a window of seconds strays from the machine's level by -4\.3 / \+4\.8 % \(90 %, as the "
                        r"calibration's reference did\), which the intervals include",
                        now["notes"][-1])
    assert said is not None, now["notes"]
    assert float(said.group(2)) == pytest.approx(float(said.group(1)) / 40.0, abs=6e-4)
    # timed for three seconds at least, five timings or more
    assert int(said.group(3)) >= 5 and float(said.group(4)) >= 3.0
    for metric in ("ttft_s", "tpot_s"):
        assert now[metric] / base[metric] == pytest.approx(float(said.group(2)), abs=6e-4)
    assert now["ttft_s_high"] / base["ttft_s_high"] >= float(said.group(2)) - 6e-4
    r = CliRunner().invoke(simulate_command, ["--model", "builtin:tiny-llama", "--hardware", "l4",
                                              "--at-current-speed"])
    assert r.exit_code != 0
    assert "profile l4: its speed can only be re-timed from a calibration on this host" in r.output
    # the collector: the measured device predicted at the speed timed after the run, said in its notes;
    # a profile that cannot be re-timed leaves the prediction as it was and says why
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                         max_position_embeddings=256)).eval()
    ids = torch.randint(4, 256, (1, 10))
    for profile, timed in ((str(host), True), ("host-cpu", False)):
        cfg = {"collectors": {"simulation": {"host": profile, "at_current_speed": True}}, "store": None}
        with perfsdk.session(cfg) as s:
            s.load(model=model)
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                       min_new_tokens=4, pad_token_id=0)
        res = s.result.collectors["simulation"]
        assert res["predictions"]
        console = Console(width=250, record=True)
        for table in _summary_tables(res):
            console.print(table)
        shown = " ".join(console.export_text().split())  # captions wrap to their table's width
        if timed:
            said = next(n for n in res["notes"] if n.startswith("at this machine's speed now"))
            factor = re.search(r"every predicted time x (\d+\.\d{3})", said)
            assert factor is not None and res["speed_factor"] == pytest.approx(float(factor.group(1)), abs=6e-4)
            assert "at_current_speed" not in res["errors"]
            assert f"predicted at this machine's speed after the run: x {res['speed_factor']:.3f}" in shown
        else:
            assert res["speed_factor"] is None
            assert res["errors"]["at_current_speed"].startswith("profile host-cpu: its speed can only be re-timed")
            assert "at the calibration's speed: profile host-cpu: its speed can only be re-timed" in shown


class _TimerWithMemory(_Timer):
    """The reference workload and the memory reference, each taking the given times in turn."""

    def __init__(self, times: tuple[float, ...], memory: tuple[float, ...], compute: tuple[float, ...] = ()) -> None:
        super().__init__(*times)
        self.memory_times, self.compute_times = list(memory), list(compute)

    @property
    def memory_median(self) -> float:
        return float(np.median(self.memory_times))

    @property
    def compute_median(self) -> float | None:
        return float(np.median(self.compute_times)) if self.compute_times else None


def test_the_memory_reference_scales_the_memory_traffic_by_its_own_ratio() -> None:
    from perfsdk.simulation.calibration.measure import COMPUTE_REFERENCE_LABEL, MEMORY_REFERENCE_LABEL

    prof = _calibrated([[0.1, -0.1]], [1.0], reference_s=0.040, tracking=0.8, apart=(0.9, 0.25))
    cal = prof.calibration
    assert cal is not None
    cal = cal.model_copy(update={"memory_reference": MEMORY_REFERENCE_LABEL, "memory_reference_s": 0.010})
    prof = prof.model_copy(update={"calibration": cal})
    # the memory reference now 20 % slower, the reference workload 10 %: the memory traffic by the
    # memory reference's ratio in proportion, the rest by the reference's to its exponent
    assert cal.speed_factors(0.044, 0.012) == (pytest.approx(1.1 ** 0.9), pytest.approx(1.2), pytest.approx(1.1 ** 0.9))
    assert cal.speed_factors(0.044)[:2] == (pytest.approx(1.1 ** 0.9), pytest.approx(1.1 ** 0.25))  # not timed now
    one = cal.model_copy(update={"rest_tracking": None, "memory_tracking": None})
    assert one.speed_factors(0.044, 0.009) == (pytest.approx(1.1 ** 0.8), pytest.approx(0.9), pytest.approx(1.1 ** 0.8))
    # the compute reference: the arithmetic by its ratio, where the calibration timed it
    assert one.speed_factors(0.044, 0.009, 0.006) == (pytest.approx(1.1 ** 0.8), pytest.approx(0.9),
                                                      pytest.approx(1.1 ** 0.8))
    timed = one.model_copy(update={"compute_reference": COMPUTE_REFERENCE_LABEL, "compute_reference_s": 0.005})
    assert timed.speed_factors(0.044, 0.009, 0.006) == (pytest.approx(1.1 ** 0.8), pytest.approx(0.9),
                                                        pytest.approx(1.2))
    both = prof.model_copy(update={"calibration": timed})
    now3, _, said3 = at_current_speed(both, ticks=3, min_time_s=0.0, timer=_TimerWithMemory(
        (0.044, 0.044, 0.044), (0.012, 0.013, 0.011), (0.006, 0.0055, 0.007)))  # type: ignore[arg-type]
    assert now3.peak_tflops.fp32 == pytest.approx(prof.peak_tflops.fp32 / 1.2)  # type: ignore[operator]
    assert now3.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.2)
    assert now3.op_overhead_s == pytest.approx(prof.op_overhead_s * 1.1 ** 0.8)
    assert ("every predicted time but the memory traffic and the arithmetic x 1.079 (that ratio to the power 0.80), "
            "the memory traffic's x 1.200 (the memory reference took 12.00 ms against 10.00 ms), the arithmetic's "
            "x 1.200 (the compute reference took 6.00 ms against 5.00 ms); the median of 3 timings") in said3
    # a profile slowed down keeps its memory reference's time at the memory traffic's factor
    slow = prof.slower_by(1.2, 1.05)
    assert slow.calibration is not None and slow.calibration.memory_reference_s == pytest.approx(0.0105)
    back = parse_profile(yaml.safe_load(profile_to_yaml(prof)))
    assert back.calibration is not None
    assert (back.calibration.memory_reference, back.calibration.memory_reference_s) == (MEMORY_REFERENCE_LABEL, 0.010)
    # re-timed with both: the memory bandwidth by the memory reference's 1.2, the rest by 1.1 ** 0.9
    now, factor, said = at_current_speed(prof, ticks=3, min_time_s=0.0, timer=_TimerWithMemory(
        (0.044, 0.044, 0.044), (0.012, 0.013, 0.011)))  # type: ignore[arg-type]
    assert factor == pytest.approx(1.1 ** 0.9)
    assert now.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.2)
    assert now.peak_tflops.fp32 == pytest.approx(prof.peak_tflops.fp32 / 1.1 ** 0.9)  # type: ignore[operator]
    assert ("every predicted time but the memory traffic x 1.090 (that ratio to the power 0.90), the memory traffic's "
            "x 1.200 (the memory reference took 12.00 ms against 10.00 ms); the median of 3 timings") in said
    # a calibration whose memory reference is another than this version's: the memory by its exponent
    other = prof.model_copy(update={"calibration": cal.model_copy(update={"memory_reference": "something else"})})
    now2, _, said2 = at_current_speed(other, ticks=3, min_time_s=0.0, timer=_TimerWithMemory(
        (0.044, 0.044, 0.044), (0.012, 0.013, 0.011)))  # type: ignore[arg-type]
    assert now2.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.1 ** 0.25)
    assert "memory reference" not in said2
    # the compute reference alone: the arithmetic by its ratio, the memory traffic by its exponent
    alone = other.model_copy(update={"calibration": other.calibration.model_copy(  # type: ignore[union-attr]
        update={"compute_reference": COMPUTE_REFERENCE_LABEL, "compute_reference_s": 0.005})})
    now4, _, said4 = at_current_speed(alone, ticks=3, min_time_s=0.0, timer=_TimerWithMemory(
        (0.044, 0.044, 0.044), (0.012, 0.013, 0.011), (0.006, 0.006, 0.006)))  # type: ignore[arg-type]
    assert now4.peak_tflops.fp32 == pytest.approx(prof.peak_tflops.fp32 / 1.2)  # type: ignore[operator]
    assert now4.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.1 ** 0.25)
    assert ("every predicted time but the arithmetic x 1.090 (that ratio to the power 0.90), the memory traffic's "
            "x 1.024 (to the power 0.25, the one the calibration's memory-bound phases followed it with), the "
            "arithmetic's x 1.200 (the compute reference took 6.00 ms against 5.00 ms); the median") in said4


def test_the_reference_timer_times_the_memory_reference_after_each_reference_timing() -> None:
    from perfsdk.simulation.calibration import ReferenceTimer
    from perfsdk.simulation.calibration.measure import (COMPUTE_REFERENCE_LABEL, MEMORY_REFERENCE_COPIES,
                                                        MEMORY_REFERENCE_LABEL, MEMORY_REFERENCE_WEIGHT)

    # 8 weights of 2048 x 2048 fp32: 128 MiB, each read once per call
    assert MEMORY_REFERENCE_COPIES * MEMORY_REFERENCE_WEIGHT[0] * MEMORY_REFERENCE_WEIGHT[1] * 4 == 128 * 2 ** 20
    assert MEMORY_REFERENCE_LABEL == "one-row linear products over 8 fp32 [2048, 2048] weights, streamed"
    plain = ReferenceTimer(repeats=1)
    plain.tick()
    assert plain.memory_times == [] and plain.memory_median is None
    timer = ReferenceTimer(repeats=1, model=plain.model, memory=True)
    _, index = timer.around(lambda: None)
    assert index == 0 and len(timer.times) == 2 and len(timer.memory_times) == 2
    assert all(t > 0 for t in timer.memory_times)
    assert timer.memory_median == pytest.approx(float(np.median(timer.memory_times)))
    assert timer.compute_times == [] and timer.compute_median is None
    both = ReferenceTimer(repeats=1, model=plain.model, memory=True, compute=True)
    both.tick()
    assert len(both.memory_times) == len(both.compute_times) == 1 and both.compute_median == both.compute_times[0] > 0
    assert COMPUTE_REFERENCE_LABEL == "a linear product of 128 rows over one fp32 [2048, 1024] weight, in cache"


def test_a_profile_slowed_by_three_factors_scales_the_arithmetic_apart() -> None:
    prof = _calibrated([[0.1, -0.1]], [1.0], reference_s=0.040, tracking=0.8)
    cal = prof.calibration
    assert cal is not None
    prof = prof.model_copy(update={"calibration": cal.model_copy(update={"memory_reference_s": 0.01,
                                                                         "compute_reference_s": 0.005})})
    slow = prof.slower_by(1.2, 1.05, 0.9)
    assert slow.peak_tflops.fp32 == pytest.approx(prof.peak_tflops.fp32 / 0.9)  # type: ignore[operator]
    assert slow.memory_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs / 1.05)
    assert slow.op_overhead_s == pytest.approx(prof.op_overhead_s * 1.2)
    now = slow.calibration
    assert now is not None
    want = {"s_per_byte": 1.05, "s_per_packed_byte": 1.05, "s_per_flop": 0.9, "s_per_row_flop": 0.9}
    assert now.coefficients == pytest.approx([c * want.get(p, 1.2) for p, c in zip(cal.params, cal.coefficients)])
    assert (now.reference_s, now.memory_reference_s, now.compute_reference_s) == (
        pytest.approx(0.048), pytest.approx(0.0105), pytest.approx(0.0045))
    with pytest.raises(ValueError, match="a speed factor must be positive"):
        prof.slower_by(1.2, 1.0, -1.0)


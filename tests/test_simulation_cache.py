"""The cache size measured by the micro-kernels' working sets and held in the calibration's fit:
what the working sets say, what the fit keeps, and what the calibration prints of it."""

from __future__ import annotations

import numpy as np
import pytest

from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS, FitResult
from perfsdk.simulation.calibration.measure import (_CACHE, CACHE_SETS_MIB, CACHE_WEIGHT, cache_levels,
                                                    cache_shares, cache_shares_text, fit_with_micro, measured_cache,
                                                    measured_cache_note)
from perfsdk.simulation.costmodel import cost_op

from tests.test_simulation_fit import TRUTH, _attention, _linear

MIB = float(2**20)


def _set(mib: float, seconds: float) -> Observation:
    n, k = CACHE_WEIGHT
    return Observation(f"{_CACHE}: {mib:.0f} MiB", "micro", seconds, np.array([2.0 * n * k]), np.array([4.0 * n * k]),
                       np.ones(1), 0.0, np.array([1.0]), resident=np.array([mib * MIB]),
                       weight_bytes=np.array([4.0 * n * k]), calls=1.0)


def _sets(cache_mib: float, t_cache: float = 50e-6, t_memory: float = 220e-6) -> list[Observation]:
    """Working sets whose products follow the cost model's share f = min(1, C / S) exactly."""
    out = []
    for mib in CACHE_SETS_MIB:
        f = min(1.0, cache_mib / mib)
        out.append(_set(mib, f * t_cache + (1 - f) * t_memory))
    return out


def test_the_working_sets_measure_the_cache_size() -> None:
    assert CACHE_SETS_MIB[0] == 4 and CACHE_SETS_MIB[-1] == 384
    # products that follow the model with a 20 MiB cache: 20 MiB, on the 1 MiB grid, one level
    assert measured_cache(_sets(20.0)) == pytest.approx(20 * MIB)
    assert cache_levels(_sets(20.0)) == pytest.approx((20 * MIB,))
    assert measured_cache(_sets(11.0)[::-1]) == pytest.approx(11 * MIB)  # the order does not matter
    # as timed on a 2-core x86 host with a 32 MiB L3 (µs a product at 4 ... 64 and 256 MiB): one
    # level, where the time starts to rise
    timed = [_set(m, t * 1e-6) for m, t in
             ((4, 53.4), (8, 53.4), (16, 59.9), (24, 120.9), (32, 180.9), (48, 216.4), (64, 221.0), (256, 229.0))]
    levels = cache_levels(timed)
    assert levels is not None and len(levels) == 1
    c = measured_cache(timed)
    assert c == levels[0] and 14 * MIB <= c <= 24 * MIB and c % MIB == 0
    # every working set streams alike (within 1.5x): no cache
    assert measured_cache([_set(m, 200e-6 + m * 1e-7) for m in CACHE_SETS_MIB]) == 0.0
    # fewer than three working sets: nothing measured
    assert measured_cache(_sets(20.0)[:2]) is None
    assert measured_cache([]) is None


def two_step(c1: float, c2: float, t1: float = 20e-6, t2: float = 45e-6, tm: float = 90e-6) -> list[Observation]:
    """Working sets that follow two levels of the cost model's share exactly: ``c1`` and ``c2`` MiB."""
    out = []
    for mib in CACHE_SETS_MIB:
        f1, f2 = min(1.0, c1 / mib), min(1.0, c2 / mib)
        out.append(_set(mib, f1 * t1 + (f2 - f1) * t2 + (1 - f2) * tm))
    return out


def test_two_cache_levels_hold_the_last() -> None:
    """Working sets that step twice, a small level and a last one well above it, each at a rate of
    its own: both levels found, and the last one held (the rate a model past it pays)."""
    assert cache_levels(two_step(4.0, 48.0)) == pytest.approx((4 * MIB, 48 * MIB))
    assert measured_cache(two_step(4.0, 48.0)) == pytest.approx(48 * MIB)
    assert measured_cache(two_step(6.0, 80.0)[::-1]) == pytest.approx(80 * MIB)  # 4 MiB steps above 64 MiB
    # a middle rate too close to the first level's is one level: the last step
    levels = cache_levels(two_step(4.0, 48.0, t2=21e-6))
    assert levels is not None and len(levels) == 1 and levels[0] == pytest.approx(48 * MIB, rel=0.1)
    # as timed on a 2-core Intel host, two threads (GB/s a product streams at each working set,
    # MiB; 4 and 8 MiB in its L2): a first level at 4 MiB and a last one where the rate falls
    # from about 48 to about 25 GB/s
    rate = {4: 90.0, 8: 60.0, 16: 48.9, 24: 48.7, 32: 48.5, 48: 46.0, 64: 43.6, 96: 36.2, 128: 29.9, 192: 26.2,
            256: 25.0, 384: 24.1}
    levels = cache_levels([_set(m, 4 * MIB / (r * 1e9)) for m, r in rate.items()])
    assert levels is not None and len(levels) == 2
    assert levels[0] == pytest.approx(4 * MIB) and 48 * MIB <= levels[1] <= 96 * MIB
    res = FitResult(coefficients={}, errors_pct={}, iterations=0, observations=0)
    assert measured_cache_note(levels[1], res, levels) == (
        f"{levels[1] / 1e6:.1f} MB measured by the working sets (the last of two levels; the first, 4.2 MB, not held), "
        "not held: the models' fit gave it no rate between free and the memory's")


def _observations(cache_bytes: float, truth: np.ndarray,
                  sets: list[Observation] | None = None) -> tuple[list[Observation], list[list]]:
    """Decode steps of stacks of one-row linear layers with 2 to 160 MB of weights, timed as the
    cost model says with a cache of ``cache_bytes``, its share of each step's bytes the one that
    the working sets ``sets`` measure where given (:func:`cache_shares`)."""
    shares = cache_shares(sets, cache_bytes) if sets is not None else None
    rng = np.random.default_rng(4)
    obs, lists = [], []
    for i in range(18):
        k, n = int(rng.choice([512, 1024, 2048])), int(rng.choice([1024, 2048, 4096]))
        layers = int(rng.integers(1, 6))
        rows = int(rng.choice([1, 1, 4]))
        ops = [_linear(rows, k, n, 0) for _ in range(layers)] + [_attention(rows, int(rng.integers(8, 300)), 8, 0)]
        o = Observation.from_ops(f"o{i}", "decode", 1.0, ops)
        o.cache_shares = shares
        o.measured_s = o.predict(truth, cache_bytes=cache_bytes)
        obs.append(o)
        lists.append(ops)
    return obs, lists


def test_the_fit_holds_the_measured_cache_and_fits_its_rate() -> None:
    truth_d = {**TRUTH, "s_per_cached_byte": 0.25 * TRUTH["s_per_byte"], "s_per_row_flop": 0.0}
    truth = np.array([truth_d[p] for p in PARAMS])
    c = 20 * MIB
    obs, lists = _observations(c, truth, _sets(20.0))
    resident = sorted(float(o.resident[0]) for o in obs)  # type: ignore[index]
    assert resident[0] < c < resident[-1]  # some steps fit the cache, some do not
    res, kept = fit_with_micro(_sets(20.0), obs, pack_rows=(0.0,), half_rows=(0.0,))
    assert res.cache_bytes == pytest.approx(c) and not res.cache_rate_tied  # a rate of its own
    assert kept == []  # the working sets are not fitted as observations
    assert res.coefficients["s_per_cached_byte"] == pytest.approx(truth_d["s_per_cached_byte"], rel=1e-6)
    assert res.coefficients["s_per_byte"] == pytest.approx(truth_d["s_per_byte"], rel=1e-6)
    # the profile prices every step as the fit did
    prof = profile_from_fit(res, name="cached")
    assert prof.cache_mb == pytest.approx(c / 1e6)
    for o, ops in zip(obs, lists):
        resident_bytes = float(o.resident[0])  # type: ignore[index]
        simulated = sum(cost_op(op, prof, resident_bytes=resident_bytes).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)
    assert prof.cache_shares == res.cache_shares == cache_shares(_sets(20.0), c)
    assert prof.calibration is not None and prof.calibration.cache_shares == prof.cache_shares
    note = measured_cache_note(measured_cache(_sets(20.0)), res)
    assert res.cache_note == note  # the fit that held the size says what became of it
    assert note.startswith("21.0 MB measured by the working sets and held; its rate fitted on the models, ")
    assert note.endswith(f"{1e-9 / truth_d['s_per_cached_byte']:.1f} GB/s against "
                         f"{1e-9 / truth_d['s_per_byte']:.1f} GB/s from memory; "
                         + cache_shares_text(res.cache_shares))  # type: ignore[arg-type]
    # working sets that stream alike: no cache held, and the fit has one memory rate
    flat, _ = fit_with_micro([_set(m, 200e-6) for m in CACHE_SETS_MIB], obs, pack_rows=(0.0,), half_rows=(0.0,))
    assert flat.cache_bytes == 0.0 and flat.cache_note == measured_cache_note(0.0, flat)
    assert measured_cache_note(0.0, flat) == "none: the working sets of 4 to 384 MiB streamed within 1.5x of each other"
    assert measured_cache_note(None, flat) == "none: no working sets timed"
    # a cache the models' fit finds no faster than memory is not held, and the note says so
    assert measured_cache_note(c, FitResult(coefficients={}, errors_pct={}, iterations=0, observations=0)) == (
        "21.0 MB measured by the working sets, not held: the models' fit gave it no rate between free and the "
        "memory's")


def test_a_cache_no_faster_than_memory_keeps_its_size_at_the_memory_rate() -> None:
    """Steps timed with the cache's bytes slower than memory's: the fit ties the cache's rate to
    the memory's instead of dropping the cache, so its size still divides the weights' rows
    between the cache (free of the per-row cost) and memory."""
    truth_d = {**TRUTH, "s_per_cached_byte": 1.3 * TRUTH["s_per_byte"], "s_per_row_flop": 0.0}
    truth = np.array([truth_d[p] for p in PARAMS])
    c = 20 * MIB
    obs, _ = _observations(c, truth, _sets(20.0))
    res, _ = fit_with_micro(_sets(20.0), obs, pack_rows=(0.0,), half_rows=(0.0,))
    k = res.coefficients
    assert res.cache_bytes == pytest.approx(c) and res.cache_rate_tied
    assert k["s_per_cached_byte"] == k["s_per_byte"]
    # one rate for every byte: between the two it was timed at
    assert TRUTH["s_per_byte"] < k["s_per_byte"] < 1.3 * TRUTH["s_per_byte"]
    prof = profile_from_fit(res, name="tied")
    assert prof.cache_mb == pytest.approx(c / 1e6)
    assert prof.cache_bandwidth_gbs == pytest.approx(prof.memory_bandwidth_gbs)
    assert res.cache_note == (
        f"21.0 MB measured by the working sets and held; fitted on the models, its rate came out no faster than "
        f"the memory's or free, so it takes the memory's, {1e-9 / k['s_per_byte']:.1f} GB/s from memory: it only "
        f"divides the weights' rows between the cache and memory; {cache_shares_text(res.cache_shares)}")  # type: ignore[arg-type]


def test_two_levels_hold_the_memory_rate_past_the_last() -> None:
    """Where most measured phases fit the held cache (here its last of two levels), the rate past
    it is the working sets' (held), not the models' fit's: they leave that rate to a few bytes of
    the largest; where most lie past it (the 20 MiB test above), the models fit it."""
    from perfsdk.simulation.calibration.measure import memory_past_cache

    truth_d = {**TRUTH, "s_per_cached_byte": 0.25 * TRUTH["s_per_byte"], "s_per_row_flop": 0.0}
    truth = np.array([truth_d[p] for p in PARAMS])
    n, k = CACHE_WEIGHT
    per_product = truth_d["s_per_byte"] * 4.0 * n * k
    sets = two_step(4.0, 48.0, t1=0.2 * per_product, t2=0.5 * per_product, tm=per_product)
    assert memory_past_cache(sets) == pytest.approx(truth_d["s_per_byte"], rel=1e-9)
    # one level: the rate past it (220 µs a product)
    assert memory_past_cache(_sets(20.0)) == pytest.approx(220e-6 / (4.0 * n * k), rel=1e-9)
    assert memory_past_cache([_set(m, 200e-6) for m in CACHE_SETS_MIB]) is None  # no cache
    obs, _ = _observations(48 * MIB, truth, sets)
    res, _ = fit_with_micro(sets, obs, pack_rows=(0.0,), half_rows=(0.0,))
    assert res.cache_bytes == pytest.approx(48 * MIB)
    assert res.held["s_per_byte"] == pytest.approx(truth_d["s_per_byte"], rel=1e-9)
    assert res.coefficients["s_per_byte"] == res.held["s_per_byte"]
    assert res.coefficients["s_per_cached_byte"] == pytest.approx(truth_d["s_per_cached_byte"], rel=1e-6)
    assert res.cache_note == (
        f"{48 * MIB / 1e6:.1f} MB measured by the working sets (the last of two levels; the first, 4.2 MB, not held) "
        f"and held; its rate fitted on the models, {1e-9 / truth_d['s_per_cached_byte']:.1f} GB/s against "
        f"{1e-9 / truth_d['s_per_byte']:.1f} GB/s from memory, as the working sets past it streamed (held); "
        f"{cache_shares_text(res.cache_shares)}")  # type: ignore[arg-type]

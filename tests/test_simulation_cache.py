"""The cache size measured by the micro-kernels' working sets and held in the calibration's fit:
what the working sets say, what the fit keeps, and what the calibration prints of it."""

from __future__ import annotations

import numpy as np
import pytest

from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS, FitResult
from perfsdk.simulation.calibration.measure import (_CACHE, CACHE_SETS_MIB, CACHE_WEIGHT, fit_with_micro,
                                                    measured_cache, measured_cache_note)
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
    assert CACHE_SETS_MIB[0] == 4 and CACHE_SETS_MIB[-1] == 96
    # products that follow the model with a 20 MiB cache: 20 MiB, on the 1 MiB grid
    assert measured_cache(_sets(20.0)) == pytest.approx(20 * MIB)
    assert measured_cache(_sets(11.0)[::-1]) == pytest.approx(11 * MIB)  # the order does not matter
    # as timed on a 2-core x86 host with a 32 MiB L3 (µs a product at 4 ... 48 MiB; at 96 MiB the
    # 221 µs of 64 MiB, 222 µs at 128): a cache of 16 to 24 MiB, where the time starts to rise
    timed = [_set(m, t * 1e-6) for m, t in zip(CACHE_SETS_MIB, (53.4, 53.4, 59.9, 120.9, 180.9, 216.4, 221.0))]
    c = measured_cache(timed)
    assert c is not None and 16 * MIB <= c <= 24 * MIB and c % MIB == 0
    # every working set streams alike (within 1.5x): no cache
    assert measured_cache([_set(m, 200e-6 + m * 1e-7) for m in CACHE_SETS_MIB]) == 0.0
    # fewer than three working sets: nothing measured
    assert measured_cache(_sets(20.0)[:2]) is None
    assert measured_cache([]) is None


def _observations(cache_bytes: float, truth: np.ndarray) -> tuple[list[Observation], list[list]]:
    """Decode steps of stacks of one-row linear layers with 2 to 160 MB of weights, timed as the
    cost model says with a cache of ``cache_bytes``."""
    rng = np.random.default_rng(4)
    obs, lists = [], []
    for i in range(18):
        k, n = int(rng.choice([512, 1024, 2048])), int(rng.choice([1024, 2048, 4096]))
        layers = int(rng.integers(1, 6))
        rows = int(rng.choice([1, 1, 4]))
        ops = [_linear(rows, k, n, 0) for _ in range(layers)] + [_attention(rows, int(rng.integers(8, 300)), 8, 0)]
        o = Observation.from_ops(f"o{i}", "decode", 1.0, ops)
        o.measured_s = o.predict(truth, cache_bytes=cache_bytes)
        obs.append(o)
        lists.append(ops)
    return obs, lists


def test_the_fit_holds_the_measured_cache_and_fits_its_rate() -> None:
    truth_d = {**TRUTH, "s_per_cached_byte": 0.25 * TRUTH["s_per_byte"], "s_per_row_flop": 0.0}
    truth = np.array([truth_d[p] for p in PARAMS])
    c = 20 * MIB
    obs, lists = _observations(c, truth)
    resident = sorted(float(o.resident[0]) for o in obs)  # type: ignore[index]
    assert resident[0] < c < resident[-1]  # some steps fit the cache, some do not
    res, kept = fit_with_micro(_sets(20.0), obs, pack_rows=(0.0,), half_rows=(0.0,))
    assert res.cache_bytes == pytest.approx(c)
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
    note = measured_cache_note(measured_cache(_sets(20.0)), res)
    assert res.cache_note == note  # the fit that held the size says what became of it
    assert note.startswith("21.0 MB measured by the working sets and held; its rate fitted on the models, ")
    assert note.endswith(f"{1e-9 / truth_d['s_per_cached_byte']:.1f} GB/s against "
                         f"{1e-9 / truth_d['s_per_byte']:.1f} GB/s from memory")
    # working sets that stream alike: no cache held, and the fit has one memory rate
    flat, _ = fit_with_micro([_set(m, 200e-6) for m in CACHE_SETS_MIB], obs, pack_rows=(0.0,), half_rows=(0.0,))
    assert flat.cache_bytes == 0.0 and flat.cache_note == measured_cache_note(0.0, flat)
    assert measured_cache_note(0.0, flat) == "none: the working sets of 4 to 96 MiB streamed within 1.5x of each other"
    assert measured_cache_note(None, flat) == "none: no working sets timed"
    # a cache the models' fit finds no faster than memory is not held, and the note says so
    assert measured_cache_note(c, FitResult(coefficients={}, errors_pct={}, iterations=0, observations=0)) == (
        "21.0 MB measured by the working sets, not held: the models' fit gave it no rate between free and the "
        "memory's")

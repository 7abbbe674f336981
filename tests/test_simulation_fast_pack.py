"""The further passes of a product of a few rows over a weight that the first pass left in the
cores' own caches: what the core-cache staircase measures, what the fit keeps of it, and how the
cost model and the calibration's fit price such a weight alike."""

from __future__ import annotations

import numpy as np
import pytest

from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import fit
from perfsdk.simulation.calibration.measure import (_FAST_STAIRCASE, _STAIRCASE, STAIRCASE_ROWS, STAIRCASE_WEIGHT,
                                                    fast_pack, fast_pack_text, fast_staircase_weight, fit_with_micro)
from perfsdk.simulation.costmodel import cost_op, fast_pack_share, pack_passes, pack_time_s

from tests.test_simulation_fit import TRUTH, _observations, _packed_observations
from tests.test_simulation_weight_rows import _grouped_op, _linear_op

MIB = float(2**20)


def _stair(label: str, shape: tuple[int, int], per_byte: float, pack_rows: float = 4.0,
           one_row: float = 300e-6) -> list[Observation]:
    """A staircase over an fp32 ``shape`` weight whose products take ``per_byte`` seconds per byte
    of each further pass (at ``pack_rows``) on top of the one-row product."""
    nbytes = 4.0 * shape[0] * shape[1]
    return [Observation(f"{label}: {r} rows", "micro", one_row + float(pack_passes(r, pack_rows)) * nbytes * per_byte,
                        np.zeros(1), np.array([nbytes]), np.ones(1), 0.0, np.array([float(r)]),
                        resident=np.array([96e6]), weight_bytes=np.array([nbytes])) for r in STAIRCASE_ROWS]


def test_the_share_applies_to_weights_that_fit_the_cores_caches() -> None:
    assert fast_pack_share(1e6, 2e6, 0.4) == 0.4
    assert fast_pack_share(2e6, 2e6, 0.4) == 0.4  # at most the capacity
    assert fast_pack_share(3e6, 2e6, 0.4) == 1.0
    assert fast_pack_share(1e6, None, 0.4) == 1.0 and fast_pack_share(1e6, 2e6, None) == 1.0
    assert list(fast_pack_share(np.array([1e6, 3e6]), 2e6, 0.5)) == [0.5, 1.0]
    # the staircase's weight: half of one core's level-2 cache, 64 to 1024 rows of 256
    assert fast_staircase_weight(2 * MIB) == (1024, 256)
    assert fast_staircase_weight(512 * 1024) == (256, 256)
    assert fast_staircase_weight(8 * MIB) == (1024, 256) and fast_staircase_weight(64 * 1024) == (64, 256)


def test_the_core_cache_staircase_measures_the_share() -> None:
    small = fast_staircase_weight(2 * MIB)
    # passes at 30 GB/s over the larger weight, at 75 GB/s over the one in the core's cache (the
    # rates one thread measured on a 2-core x86 host: 30 and 66-82 GB/s)
    slow, quick = 1 / 30e9, 1 / 75e9
    micro = _stair(_STAIRCASE, STAIRCASE_WEIGHT, slow) + _stair(_FAST_STAIRCASE, small, quick, one_row=30e-6)
    got = fast_pack(micro, 4.0, 2 * MIB)
    assert got is not None
    assert got[0] == 2 * MIB and got[1] == pytest.approx(0.4, rel=1e-9)
    # measured at another repacking size: the passes counted at that size
    at_one = _stair(_STAIRCASE, STAIRCASE_WEIGHT, slow, 1.0) + _stair(_FAST_STAIRCASE, small, quick, 1.0)
    assert fast_pack(at_one, 1.0, 4 * MIB) == (4 * MIB, pytest.approx(0.4, rel=1e-9))
    # nothing to say: no capacity known, no repacking, a staircase missing, the larger weight
    # inside the capacity, or the small weight's passes no faster
    assert fast_pack(micro, 4.0, None) is None
    assert fast_pack(micro, 0.0, 2 * MIB) is None
    assert fast_pack(micro[:5], 4.0, 2 * MIB) is None and fast_pack(micro[5:], 4.0, 2 * MIB) is None
    assert fast_pack(micro, 4.0, 16 * MIB) is None
    same = _stair(_STAIRCASE, STAIRCASE_WEIGHT, slow) + _stair(_FAST_STAIRCASE, small, slow)
    assert fast_pack(same, 4.0, 2 * MIB) is None
    assert fast_pack_text((2 * MIB, 0.4)) == ("; over weights of at most 2.1 MB (the cores' level-2 caches) the "
                                              "further passes take 0.40 of that time (the core-cache staircase)")


def test_the_cost_model_and_the_fit_price_the_core_cache_passes_alike() -> None:
    """Observations that follow the cost model with P = 1 and weights of 1 MiB passing at 0.4 of
    the repacking rate: the fit that knows the share recovers the rate, and the profile it makes
    prices every op list as the fit did; a product over a larger weight pays the full rate."""
    fast = (1.5 * MIB, 0.4)
    obs, lists, _ = _packed_observations(7, pack_fast=fast)
    sizes = {float(b) for o in obs for b in o.weight_bytes if b}  # type: ignore[union-attr]
    assert min(sizes) <= fast[0] < max(sizes)  # some weights fit, some do not
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(1.0,), held={"s_per_weight_row": TRUTH["s_per_weight_row"]})
    assert res.coefficients["s_per_packed_byte"] == pytest.approx(2e-11, rel=1e-6)
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    res.pack_fast = fast
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_pack_fast_mb == pytest.approx(1.5 * MIB / 1e6)
    assert prof.matmul_pack_fast_share == 0.4
    assert prof.calibration is not None
    assert (prof.calibration.pack_fast_bytes, prof.calibration.pack_fast_share) == (1.5 * MIB, 0.4)
    for o, ops in zip(obs, lists):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)
    # one product of 4 rows (one repacking pass at P = 1): a [4096, 512] weight (8 MiB) pays the
    # pass at 50 GB/s; the same product over a [256, 512] one (0.5 MiB) 0.4 of it
    plain = builtin_profiles()["host-cpu"].model_copy(update={
        "matmul_pack_rows": 1.0, "matmul_pack_gbs": 50.0, "matmul_ns_per_weight_row": None,
        "matmul_pack_fast_mb": 1.5 * MIB / 1e6, "matmul_pack_fast_share": 0.4})
    big = _linear_op(4)
    assert pack_time_s(big, plain) == pytest.approx(big.weight_bytes / 50e9)
    from dataclasses import replace

    small = replace(big, weight_bytes=256 * 512 * 4, output_shape=(4, 256))
    assert pack_time_s(small, plain) == pytest.approx(0.4 * small.weight_bytes / 50e9)
    # a grouped product: each expert's weight (128 x 512 fp32, 0.25 MiB) fits, whatever the total
    grouped = _grouped_op(8, 4, [3, 0, 1, 4], reached=3)
    no_fast = plain.model_copy(update={"matmul_pack_fast_mb": None, "matmul_pack_fast_share": None})
    assert pack_time_s(grouped, plain) == pytest.approx(0.4 * pack_time_s(grouped, no_fast))
    ob = Observation.from_ops("moe", "decode", 1.0, [grouped])
    whole = float(ob.packed_bytes(1.0)[0])
    ob.pack_fast = fast
    assert float(ob.packed_bytes(1.0)[0]) == pytest.approx(0.4 * whole)


def test_fit_with_micro_keeps_the_core_cache_share_and_says_it() -> None:
    obs, _ = _observations(np.random.default_rng(2))
    small = fast_staircase_weight(2 * MIB)
    micro = _stair(_STAIRCASE, STAIRCASE_WEIGHT, 1 / 30e9) + _stair(_FAST_STAIRCASE, small, 1 / 75e9, one_row=30e-6)
    res, kept = fit_with_micro(micro, obs, cache_bytes=(0.0,), core_cache=2 * MIB)
    assert kept == []  # neither staircase is fitted as observations
    assert res.pack_rows == 4.0
    assert res.pack_fast == (2 * MIB, pytest.approx(0.4, rel=1e-9))
    assert all(o.pack_fast == res.pack_fast for o in obs)
    assert res.pack_note is not None and res.pack_note.endswith(fast_pack_text(res.pack_fast))
    assert res.pack_note.startswith("from 4 rows (the staircase: ")
    # no capacity known: no share, and the note says only the repacking size
    plain, _ = fit_with_micro(micro, obs, cache_bytes=(0.0,), core_cache=0.0)
    assert plain.pack_fast is None and plain.pack_note is not None and "core-cache" not in plain.pack_note

"""The share of a pass's bytes served from the cache, as the calibration's working sets measure
it: the table a profile keeps, the cost model that prices bytes and stored rows with it, and the
calibration that reads it and says it."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.profile import CacheShares, parse_profile, profile_to_yaml
from perfsdk.simulation.calibration.fit import cached_fraction
from perfsdk.simulation.calibration.measure import (CACHE_SETS_MIB, cache_shares, cache_shares_text,
                                                    weight_row_cost)
from perfsdk.simulation.costmodel import cached_share, memory_time_s, pack_time_s

from tests.test_simulation_cache import MIB, _set
from tests.test_simulation_row_lengths import _ladder

T_CACHE, T_MEMORY = 60e-6, 240e-6


def _law(mib: float, cache_mib: float = 12.0) -> float:
    """A cache that keeps a pass whole up to its size and nothing from twice it: linear in log
    bytes between."""
    return float(np.clip(1.0 - np.log(mib / cache_mib) / np.log(2.0), 0.0, 1.0))


def _sets(law=_law) -> list:  # type: ignore[no-untyped-def]
    return [_set(m, law(m) * T_CACHE + (1.0 - law(m)) * T_MEMORY) for m in CACHE_SETS_MIB]


def test_the_working_sets_give_the_share_at_each_size() -> None:
    shares = cache_shares(_sets(), 12 * MIB)
    assert shares is not None
    assert shares.resident_bytes == [m * MIB for m in CACHE_SETS_MIB]
    assert shares.share == pytest.approx([_law(m) for m in CACHE_SETS_MIB])
    assert shares.share[:3] == pytest.approx([1.0, 1.0, 1.0 - np.log(16 / 12) / np.log(2.0)])
    assert shares.share[3:] == [0.0] * (len(CACHE_SETS_MIB) - 3)
    # far below min(1, cache / bytes), which keeps 0.5 of a pass of 24 MiB and 0.375 of 32 MiB
    assert list(cached_fraction(np.array([24 * MIB, 32 * MIB]), 12 * MIB)) == pytest.approx([0.5, 0.375])
    assert list(cached_fraction(np.array([24 * MIB, 32 * MIB]), 12 * MIB, shares)) == [0.0, 0.0]
    # the order the sets were timed in does not matter
    assert cache_shares(_sets()[::-1], 12 * MIB) == shares


def test_the_shares_are_read_between_the_plateaus_and_never_rise() -> None:
    # a set inside the cache is served whole, even one timed slow (the first set timed can be);
    # one past it timed slower than memory counts nothing from the cache, one faster than the
    # cache all of it
    timed = _sets()
    timed[0].measured_s = 1.5 * T_CACHE
    timed[5].measured_s = 1.2 * T_MEMORY
    shares = cache_shares(timed, 12 * MIB)
    assert shares is not None and shares.share[:2] == [1.0, 1.0] and shares.share[5] == 0.0
    timed[2].measured_s = 0.5 * T_CACHE
    assert cache_shares(timed, 12 * MIB).share[2] == 1.0  # type: ignore[union-attr]
    # one set timed faster than the smaller one before it: the two pooled into their mean
    bumped = _sets()
    bumped[2].measured_s = 0.2 * T_CACHE + 0.8 * T_MEMORY  # 0.2 from the cache at 16 MiB
    bumped[3].measured_s = 0.3 * T_CACHE + 0.7 * T_MEMORY  # 0.3 at 24 MiB
    pooled = cache_shares(bumped, 12 * MIB)
    assert pooled is not None and pooled.share[2:4] == pytest.approx([0.25, 0.25])
    # the memory's end is the median of the sets from half the largest: one stall among them moves nothing
    stalled = _sets()
    stalled[-1].measured_s = 3 * T_MEMORY
    assert cache_shares(stalled, 12 * MIB) == cache_shares(_sets(), 12 * MIB)
    # no cache, fewer than three sets, or sets past the cache no slower than inside: none
    assert cache_shares(_sets(), 0.0) is None
    assert cache_shares(_sets()[:2], 12 * MIB) is None
    assert cache_shares([_set(m, T_MEMORY) for m in CACHE_SETS_MIB], 12 * MIB) is None


def test_a_table_is_linear_in_log_bytes_held_beyond_and_checked() -> None:
    table = CacheShares(resident_bytes=[4e6, 16e6, 64e6], share=[1.0, 0.5, 0.0])
    assert table.at(8e6) == pytest.approx(0.75)
    assert table.at(1e3) == 1.0 and table.at(1e9) == 0.0 and table.at(0.0) == 1.0
    assert list(table.at(np.array([4e6, 32e6]))) == pytest.approx([1.0, 0.25])
    with pytest.raises(ValidationError, match="one value per size"):
        CacheShares(resident_bytes=[4e6, 16e6], share=[1.0])
    with pytest.raises(ValidationError, match="positive and ascending"):
        CacheShares(resident_bytes=[16e6, 4e6], share=[1.0, 0.5])
    with pytest.raises(ValidationError, match="between 0 and 1"):
        CacheShares(resident_bytes=[4e6, 16e6], share=[1.2, 0.5])
    with pytest.raises(ValidationError, match="must not rise"):
        CacheShares(resident_bytes=[4e6, 16e6], share=[0.5, 0.7])


def _matvec(n: int, k: int) -> OpRecord:
    w = 4 * n * k
    return OpRecord(module_path="p", op="aten.linear", category="matmul", phase="decode",
                    input_shapes=[(1, k), (n, k)], output_shape=(1, n), flops=2 * n * k, macs=n * k,
                    weight_bytes=w, bytes_read=w + 4 * k, bytes_written=4 * n, elements=n)


def test_the_cost_model_serves_the_measured_share_from_the_cache() -> None:
    from perfsdk.hardware.catalog import builtin_profiles

    table = cache_shares(_sets(), 12 * MIB)
    assert table is not None
    ratio = builtin_profiles()["host-cpu"].model_copy(update={
        "cache_mb": 12 * MIB / 1e6, "cache_bandwidth_gbs": 80.0, "memory_bandwidth_gbs": 20.0, "memory_efficiency": 1.0,
        "matmul_pack_rows": None, "matmul_pack_gbs": None, "matmul_ns_per_weight_row": 50.0,
        "matmul_weight_row_costs": None, "cache_shares": None})
    measured = ratio.model_copy(update={"cache_shares": table})
    resident = 20 * MIB  # a pass of 20 MiB: the ratio keeps 0.6 of it, the working sets 0.263
    f = _law(16) * (1.0 - np.log(20 / 16) / np.log(24 / 16))  # between 16 and 24 MiB, linear in log bytes
    assert cached_share(ratio, resident) == pytest.approx(0.6)
    assert cached_share(measured, resident) == pytest.approx(f) == pytest.approx(0.2630, abs=1e-4)
    op = _matvec(1024, 1024)
    nbytes = op.bytes_read + op.bytes_written
    assert memory_time_s(op, measured, resident) == pytest.approx((1 - f) * nbytes / 20e9 + f * nbytes / 80e9)
    # the stored rows pay their cost on the share streamed from memory
    assert pack_time_s(op, measured, resident) == pytest.approx(1024 * 50e-9 * (1 - f))
    assert pack_time_s(op, ratio, resident) == pytest.approx(1024 * 50e-9 * 0.4)
    # no cache size: no share, whatever the table
    assert cached_share(measured.model_copy(update={"cache_mb": None}), resident) == 0.0
    # the table survives the profile's file
    again = parse_profile(__import__("yaml").safe_load(profile_to_yaml(measured)))
    assert again.cache_shares == table


def test_the_pair_reads_its_rows_on_the_share_the_working_sets_stream() -> None:
    ladder = _ladder()  # every product's working set 400 MB
    plain = weight_row_cost(ladder)
    # min(1, cache / bytes) keeps a quarter of 400 MB in a 100 MB cache; the measured shares none of it
    assert weight_row_cost(ladder, 100e6) == pytest.approx(plain / 0.75)  # type: ignore[operator]
    shares = CacheShares(resident_bytes=[100e6, 200e6], share=[1.0, 0.0])
    assert weight_row_cost(ladder, 100e6, shares) == pytest.approx(plain)


def test_the_calibration_says_the_shares() -> None:
    table = cache_shares(_sets(), 12 * MIB)
    assert table is not None
    assert cache_shares_text(table) == ("served from it by the bytes a pass touches (the working sets): "
                                        "1.00 at 4 MiB, 0.58 at 16 MiB, 0.00 at 24 MiB")


def test_the_bootstrap_re_costs_each_phase_with_the_calibrations_shares() -> None:
    """A refit whose cache is twice as fast as the central fit's re-costs a pass past the cache by
    the share the calibration served from it: none by the measured shares, cache / bytes by the
    ratio."""
    from perfsdk.hardware.profile import CalibrationRecord
    from perfsdk.simulation.calibration.fit import PARAMS
    from perfsdk.simulation.uncertainty import replicate_ratios

    central = {p: 0.0 for p in PARAMS} | {"s_per_flop": 1e-15, "s_per_byte": 1e-10, "s_per_cached_byte": 1e-10}
    refit = central | {"s_per_cached_byte": 0.5e-10}
    op = _matvec(1024, 1024)  # a decode step over 4.2 MB of weights
    resident = float(op.weight_bytes)
    shares = CacheShares(resident_bytes=[1e6, 3e6], share=[1.0, 0.0])
    record = CalibrationRecord(host="h", fitted_at="now", params=list(PARAMS),
                               coefficients=[central[p] for p in PARAMS], replicates=[[refit[p] for p in PARAMS]],
                               cache_bytes=2e6, cache_shares=shares)
    assert list(replicate_ratios(record, {"decode": [op]})["decode"]) == pytest.approx([1.0])
    ratio = 2e6 / resident
    plain = record.model_copy(update={"cache_shares": None})
    assert list(replicate_ratios(plain, {"decode": [op]})["decode"]) == pytest.approx([1.0 - 0.5 * ratio])

"""A matrix product of a few rows priced as its one-row product times the ratio the calibration's
staircase measured: the ratios, what the cost model and the fit make of them (alike), what the
calibration reads from its staircases, and what the profile keeps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.hardware.profile import FewRowRatios, HardwareProfile, load_profile_file, parse_profile, profile_to_yaml
from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS, fit
from perfsdk.simulation.calibration.measure import (_FAST_STAIRCASE, _STAIRCASE, FEW_ROWS, STAIRCASE_ROWS,
                                                    STAIRCASE_WEIGHT, _streamed_products, few_row_ratios, few_row_text,
                                                    fit_with_micro, median_micro, repacking_choice)
from perfsdk.simulation.costmodel import cost_op, few_row_op, matmul_rows, pack_time_s

from tests.test_simulation_fit import TRUTH, _observations, _packed_observations
from tests.test_simulation_weight_rows import _grouped_op, _linear_op

MB = 1e6
#: two threads on a 2-core x86 host: an 8 MB weight streamed from memory, and a 0.5 MB one
STREAMED = [1.87, 2.25, 1.42, 1.15, 1.2, 1.3, 1.45]
CACHED = [1.29, 1.43, 1.42, 1.1, 1.18, 1.29, 1.36]
FEW = FewRowRatios(rows=[2, 3, 4, 6, 8, 12, 16], streamed=STREAMED, streamed_mb=8.0, cached=CACHED, cached_mb=1.0)


def test_the_ratio_at_a_product_s_rows_and_weight_size() -> None:
    assert FEW.ratio(4, 16 * MB) == 1.42 and FEW.ratio(2, 8 * MB) == 1.87
    assert FEW.ratio(2, 0.5 * MB) == 1.29 and FEW.ratio(2, 1 * MB) == 1.29  # at most cached_mb
    assert FEW.ratio(5, 16 * MB) == pytest.approx((1.42 + 1.15) / 2)  # linear between the counts
    assert FEW.ratio(10, 16 * MB) == pytest.approx((1.2 + 1.3) / 2)
    # between the two sizes, linear in log bytes: 2.83 MB lies halfway between 1 and 8 MB
    assert FEW.ratio(2, 8**0.5 * MB) == pytest.approx((1.29 + 1.87) / 2)
    assert FEW.ratio(2, 2 * MB) == pytest.approx(1.29 + (1.87 - 1.29) / 3)
    # outside the staircase: one row (a matrix-vector product) and more than its last count
    assert FEW.ratio(1, 16 * MB) is None and FEW.ratio(17, 16 * MB) is None and FEW.ratio(16, 16 * MB) == 1.45
    streamed_only = FewRowRatios(rows=[2, 4], streamed=[2.0, 1.5], streamed_mb=8.0)
    assert streamed_only.ratio(2, 0.1 * MB) == 2.0 and streamed_only.ratio(3, 0.1 * MB) == 1.75


@pytest.mark.parametrize("bad, says", [
    ({"rows": [1, 2]}, "ascending counts of at least 2"),
    ({"rows": [4, 2]}, "ascending counts of at least 2"),
    ({"streamed": [1.5]}, "streamed needs one positive ratio per row count (2)"),
    ({"cached": [1.2, 1.3]}, "cached and cached_mb go together"),
    ({"streamed": [1.5, 0.0]}, "streamed needs one positive ratio per row count"),
])
def test_a_staircase_that_cannot_be_read_is_refused(bad: dict, says: str) -> None:
    fields = {"rows": [2, 4], "streamed": [1.8, 1.4], "streamed_mb": 8.0, **bad}
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        FewRowRatios(**fields)


def _profile(**update: object) -> HardwareProfile:
    return builtin_profiles()["host-cpu"].model_copy(update={
        "matmul_pack_rows": 1.0, "matmul_pack_gbs": 40.0, "matmul_ns_per_weight_row": 80.0, "matmul_half_rows": 20.0,
        "matmul_few_rows": FEW, **update})


def test_a_few_row_product_costs_its_one_row_price_times_the_ratio() -> None:
    prof = _profile()
    plain = prof.model_copy(update={"matmul_few_rows": None})
    one = _linear_op(1)  # [4096, 512] fp32: 8.4 MB, streamed
    four = _linear_op(4)
    c1, c4 = cost_op(one, prof), cost_op(four, prof)
    assert c1.time_s == cost_op(one, plain).time_s  # one row: as before
    # compute, memory and the cost per stored row of the one-row product, each times 1.42
    assert c4.memory_s == pytest.approx(1.42 * c1.memory_s, rel=1e-6)
    assert c4.compute_s == pytest.approx(1.42 * c1.compute_s, rel=1e-6)
    assert c4.pack_s == pytest.approx(1.42 * 4096 * 80e-9, rel=1e-9) == pytest.approx(1.42 * c1.pack_s, rel=1e-9)
    assert c4.overhead_s == c1.overhead_s
    # the priced op: one row's FLOPs and activations, the whole weight, all times the ratio
    priced = few_row_op(four, prof)
    assert priced.flops == pytest.approx(1.42 * 2 * 512 * 4096) and priced.elements == 4096
    assert priced.bytes_read + priced.bytes_written == pytest.approx(1.42 * (4096 * 512 * 4 + 512 * 4 + 4096 * 4))
    assert priced.weight_rows == pytest.approx(1.42 * 4096) and priced.weight_bytes == four.weight_bytes
    # its energy is the product's own, not the passes the ratio stands for
    assert c4.dynamic_energy_j == cost_op(four, plain).dynamic_energy_j
    # past the staircase, without a repacking size, and a grouped product: the other terms price it
    assert cost_op(_linear_op(17), prof).time_s == cost_op(_linear_op(17), plain).time_s
    assert few_row_op(four, prof.model_copy(update={"matmul_pack_rows": None})) is four
    # a grouped product: each expert's product at its own rows (3, 1 and 4 of the 8 routed rows,
    # each over a 0.26 MB weight: the cached ratios 1.43, 1 and 1.42), as three one-row products
    grouped = _grouped_op(8, 4, [3, 0, 1, 4], reached=3)
    g = few_row_op(grouped, prof)
    mean = (1.43 + 1.0 + 1.42) / 3
    assert g.groups is None and g.group_rows is None and g.elements == 512
    assert g.flops == pytest.approx(3 * 2 * 128 * 512 * mean)
    assert g.bytes_read + g.bytes_written == pytest.approx((3 * 512 * 128 * 4 + 3 * (128 + 512) * 4) * mean)
    assert g.weight_rows == pytest.approx(3 * 128 * mean)
    assert cost_op(grouped, prof).serial_s == 0.0
    # one with an expert's product past the staircase keeps the other terms
    wide = _grouped_op(40, 4, [20, 0, 10, 10], reached=3)
    assert few_row_op(wide, prof) is wide
    # a weight of 0.5 MB takes the cached ratio at 2 rows, 1.29 against 1.87 streamed
    small = replace(_linear_op(2), weight_bytes=256 * 512 * 4, output_shape=(2, 256), elements=512,
                    bytes_read=256 * 512 * 4 + 2 * 512 * 4, bytes_written=2 * 256 * 4, flops=2 * 2 * 512 * 256,
                    weight_rows=256)
    assert few_row_op(small, prof).weight_rows == pytest.approx(1.29 * 256)
    assert pack_time_s(few_row_op(small, prof), prof) == pytest.approx(1.29 * 256 * 80e-9)


def test_the_fit_prices_few_rows_as_the_cost_model_does() -> None:
    """Observations that follow the cost model with the staircase: the fit recovers the
    coefficients, and the profile it makes prices every op list as the fit did."""
    obs, lists, truth = _packed_observations(11, few_rows=FEW)
    few_row_products = sum(1 for ops in lists for op in ops if op.category == "matmul" and 2 <= matmul_rows(op) <= 16)
    assert few_row_products >= 10  # the staircase prices a good share of them
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(1.0,))
    for name in ("s_per_flop", "s_per_byte", "s_per_weight_row", "s_per_score"):
        assert res.coefficients[name] == pytest.approx(truth[PARAMS.index(name)], rel=1e-6), name
    # past 16 rows an fp32 product's FLOPs per row are half its weight bytes, so the small-M term
    # and the repacking pass price the same column: their sum per weight byte is what is fitted
    k = res.coefficients
    assert k["s_per_packed_byte"] + k["s_per_row_flop"] / 2 == pytest.approx(2e-11 + TRUTH["s_per_row_flop"] / 2,
                                                                            rel=1e-6)
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    res.few_rows = FEW
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_few_rows == FEW
    assert prof.calibration is not None and prof.calibration.few_rows == FEW
    for o, ops in zip(obs, lists):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)
    # the profile's YAML keeps the staircase, and prices alike after the round trip
    back = parse_profile(yaml.safe_load(profile_to_yaml(prof)))
    assert back.matmul_few_rows == FEW and back.calibration is not None and back.calibration.few_rows == FEW


def test_the_observation_s_arrays_follow_the_staircase_and_come_back_without_it() -> None:
    ops = [_linear_op(r) for r in (1, 4, 17)] + [_grouped_op(8, 4, [3, 0, 1, 4], reached=3)]
    o = Observation.from_ops("o", "decode", 1.0, ops)
    built = (o.flops.copy(), o.bytes_.copy(), o.rows.copy(), o.weight_rows.copy())  # type: ignore[union-attr]
    o.few_rows = FEW
    prof = _profile()
    for i, op in enumerate(ops):  # the fit's arrays are those of the op the cost model prices
        priced = few_row_op(op, prof)
        assert o.flops[i] == pytest.approx(priced.flops, rel=1e-12)
        assert o.bytes_[i] == pytest.approx(priced.bytes_read + priced.bytes_written, rel=1e-12)
        assert o.weight_rows[i] == pytest.approx(priced.weight_rows, rel=1e-12)  # type: ignore[index]
    assert list(o.rows) == [1.0, 1.0, 17.0, 1.0] and o.grouped == {}  # type: ignore[arg-type]
    # a copy (the bootstrap's) is priced once, not twice
    copy = replace(o, measured_s=2.0)
    assert list(copy.flops) == list(o.flops) and list(copy.bytes_) == list(o.bytes_)
    o.few_rows = None
    for now, then in zip((o.flops, o.bytes_, o.rows, o.weight_rows), built):
        assert list(now) == list(then)  # type: ignore[arg-type]
    assert list(o.grouped) == [3]


def _stair(label: str, nbytes: float, ratios: dict[int, float], one_row: float) -> list[Observation]:
    return [Observation(f"{label}: {r} rows", "micro", one_row * ratios.get(r, 1.0), np.zeros(1), np.array([nbytes]),
                        np.ones(1), 0.0, np.array([float(r)]), resident=np.array([96e6]),
                        weight_bytes=np.array([nbytes])) for r in FEW_ROWS]


def test_the_calibration_reads_the_ratios_from_its_staircases() -> None:
    assert FEW_ROWS == (1, 2, 3, 4, 6, 8, 12, 16) and set(STAIRCASE_ROWS) <= set(FEW_ROWS)
    big = 4.0 * STAIRCASE_WEIGHT[0] * STAIRCASE_WEIGHT[1]
    slow = dict(zip(FEW_ROWS[1:], STREAMED))
    quick = dict(zip(FEW_ROWS[1:], CACHED))
    micro = _stair(_STAIRCASE, big, slow, 800e-6) + _stair(_FAST_STAIRCASE, 512 * 1024.0, quick, 60e-6)
    got = few_row_ratios(micro, 2**20)
    assert got is not None
    assert got.rows == [2, 3, 4, 6, 8, 12, 16]
    assert got.streamed == pytest.approx(STREAMED) and got.cached == pytest.approx(CACHED)
    assert got.streamed_mb == pytest.approx(big / MB) and got.cached_mb == pytest.approx(2**20 / MB)
    assert few_row_text(got) == (
        "a product of 2, 3, 4, 6, 8, 12, 16 rows takes 1.87, 2.25, 1.42, 1.15, 1.20, 1.30, 1.45 times its one-row "
        "time over a weight streamed from memory (8.4 MB), 1.29, 1.43, 1.42, 1.10, 1.18, 1.29, 1.36 over one of at "
        "most 1.0 MB (the cores' caches)")
    upto8 = few_row_ratios(micro, 2**20, max_rows=8)
    assert upto8 is not None and upto8.rows == [2, 3, 4, 6, 8] and upto8.cached == pytest.approx(CACHED[:5])
    assert few_row_ratios(micro, 2**20, max_rows=1) is None
    # held from 4 rows: the 4-row ratio up to the last count (16), the counts between dropped
    held = few_row_ratios(micro, 2**20, held_from=4)
    assert held is not None and held.rows == [2, 3, 4, 16]
    assert held.streamed == pytest.approx([*STREAMED[:3], STREAMED[2]])
    assert held.cached == pytest.approx([*CACHED[:3], CACHED[2]])
    assert held.ratio(8, big) == pytest.approx(STREAMED[2]) and held.ratio(17, big) is None
    assert few_row_text(held) == (
        "a product of 2, 3, 4 rows (one of 5 to 16 rows as one of 4) takes 1.87, 2.25, 1.42 times its one-row time "
        "over a weight streamed from memory (8.4 MB), 1.29, 1.43, 1.42 over one of at most 1.0 MB (the cores' caches)")
    assert few_row_ratios(micro, 2**20, held_from=16) == got  # nothing past the last count to hold
    assert few_row_ratios(micro, 2**20, held_from=1) is None
    # no capacity known, or the core-cache staircase missing: the streamed ratios for every weight
    assert few_row_ratios(micro, None).cached is None  # type: ignore[union-attr]
    assert few_row_ratios(micro[:8], 2**20).cached is None  # type: ignore[union-attr]
    assert few_row_ratios(micro[8:], 2**20) is None  # no streamed staircase
    # the repacking size is read from the staircase's first counts only, as before the others
    only_pack = [ob for ob in micro if float(ob.rows[0]) in STAIRCASE_ROWS]  # type: ignore[index]
    assert repacking_choice(micro, (0.0, 1.0, 2.0)) == repacking_choice(only_pack, (0.0, 1.0, 2.0))


def test_a_staircase_is_read_against_its_one_row_product_and_merged_by_ratio() -> None:
    stair = _streamed_products((64, 32), lambda fn: 1e-3, (1, 2, 4), label=_STAIRCASE, stream_bytes=2 * 64 * 32 * 4)
    assert [ob.label for ob in stair] == [f"{_STAIRCASE}: {r} rows over [64, 32] fp32, streamed" for r in (1, 2, 4)]
    assert [ob.unit for ob in stair] == [None, stair[0].label, stair[0].label]
    # two timings and a third in which the machine slowed down after the one-row product: each
    # staircase's ratios are those of the timings that ran at one speed, the one-row time the median
    runs = []
    for one, rest in ((100e-6, 1.0), (120e-6, 1.0), (90e-6, 1.6)):
        timing = [replace(ob, measured_s=one * (1.0 if ob.unit is None else rest * ratio))
                  for ob, ratio in zip(stair, (1.0, 1.8, 1.4))]
        runs.append((timing, -1))
    merged = median_micro(runs, None, 1.0)
    assert [ob.measured_s for ob in merged] == pytest.approx([100e-6, 180e-6, 140e-6])
    # each median taken apart: the 2-row product's of 180, 216 and 259 µs is the second timing's,
    # the one-row product's the first's, so its ratio reads 2.16 instead of 1.8
    for timing, _ in runs:
        for ob in timing:
            ob.unit = None
    assert [ob.measured_s for ob in median_micro(runs, None, 1.0)] == pytest.approx([100e-6, 216e-6, 168e-6])


def test_fit_with_micro_prices_the_models_with_the_staircase() -> None:
    obs, _ = _observations(np.random.default_rng(2))
    big = 4.0 * STAIRCASE_WEIGHT[0] * STAIRCASE_WEIGHT[1]
    micro = (_stair(_STAIRCASE, big, dict(zip(FEW_ROWS[1:], STREAMED)), 800e-6)
             + _stair(_FAST_STAIRCASE, 512 * 1024.0, dict(zip(FEW_ROWS[1:], CACHED)), 60e-6))
    res, kept = fit_with_micro(micro, obs, cache_bytes=(0.0,), core_cache=2**20)
    assert kept == []
    # read up to 4P rows, where the blocked kernel takes over, and held there up to 16 rows
    assert res.pack_rows == 1.0 and res.few_rows is not None and res.few_rows.rows == [2, 3, 4, 16]
    assert res.few_rows.streamed == pytest.approx([*STREAMED[:3], STREAMED[2]])
    assert res.few_rows.cached == pytest.approx([*CACHED[:3], CACHED[2]])
    assert all(o.few_rows == res.few_rows for o in obs)
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_few_rows == res.few_rows
    # a flat staircase chooses no repacking: no ratios either (the small-M slowdown prices every product)
    flat = _stair(_STAIRCASE, big, {}, 800e-6)
    res0, _ = fit_with_micro(flat, obs, cache_bytes=(0.0,), core_cache=2**20)
    assert res0.pack_rows == 0.0 and res0.few_rows is None and all(o.few_rows is None for o in obs)


def test_a_profile_file_with_the_staircase_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prof = _profile(name="few-rows-host")
    path = tmp_path / "host.yaml"
    path.write_text(profile_to_yaml(prof), encoding="utf-8")
    (back,) = load_profile_file(path)
    assert back.matmul_few_rows == FEW
    text = path.read_text(encoding="utf-8").replace("streamed_mb: 8.0", "streamed_mb: -1")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(Exception, match="streamed_mb"):
        load_profile_file(path)


def test_each_staircase_is_read_with_its_further_shapes() -> None:
    from perfsdk.simulation.calibration.measure import _FAST_SHAPES, _SHAPES, FEW_ROW_INNER, few_row_shapes

    # weights of the staircase's size at the other inner sizes; at least 16 rows each
    assert FEW_ROW_INNER == (256, 512, 1024, 2048)
    assert few_row_shapes(STAIRCASE_WEIGHT) == [(8192, 256), (2048, 1024), (1024, 2048)]
    assert few_row_shapes((1024, 256)) == [(512, 512), (256, 1024), (128, 2048)]
    assert few_row_shapes((64, 256)) == [(32, 512), (16, 1024)]
    big = 4.0 * STAIRCASE_WEIGHT[0] * STAIRCASE_WEIGHT[1]

    def stair(label: str, shape: tuple[int, int], ratios: list[float], one_row: float) -> list[Observation]:
        times = dict(zip(FEW_ROWS, [1.0, *ratios]))
        return [replace(ob, measured_s=one_row * times[int(ob.rows[0])])  # type: ignore[index]
                for ob in _streamed_products(shape, lambda fn: 0.0, FEW_ROWS, label=label, stream_bytes=0.0)]

    first = [1.0, 2.0, 1.25, 1.0, 1.0, 1.0, 1.0]
    second = [4.0, 2.0, 1.8, 1.0, 1.0, 1.0, 1.0]
    third = [2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 4.0]
    micro = (stair(_STAIRCASE, STAIRCASE_WEIGHT, first, 800e-6) + stair(_SHAPES, (8192, 256), second, 900e-6)
             + stair(_SHAPES, (2048, 1024), third, 500e-6))
    got = few_row_ratios(micro, None)
    assert got is not None and got.shapes == 3 and got.rows == [2, 3, 4, 6, 8, 12, 16]
    # the geometric mean over the three weights at each count: 2 rows (1 * 4 * 2)^(1/3) = 2
    assert got.streamed == pytest.approx([2.0, 2.0, (1.25 * 1.8 * 2.0) ** (1 / 3), 1.0, 1.0, 1.0, 4 ** (1 / 3)])
    assert got.streamed_mb == pytest.approx(big / MB)
    # a further shape missing a count: that count is dropped, for all of them
    short = [ob for ob in micro if not (ob.label.startswith(_SHAPES) and float(ob.rows[0]) == 12.0)]  # type: ignore[index]
    assert few_row_ratios(short, None).rows == [2, 3, 4, 6, 8, 16]  # type: ignore[union-attr]
    # alone, the first staircase as before, said without the mean
    alone = few_row_ratios(micro[:8], None)
    assert alone is not None and alone.shapes == 1 and alone.streamed == pytest.approx(first)
    held = few_row_ratios(micro, None, held_from=4)
    assert held is not None and few_row_text(held) == (
        "a product of 2, 3, 4 rows (one of 5 to 16 rows as one of 4) takes 2.00, 2.00, 1.65 times its one-row time "
        "over a weight streamed from memory (8.4 MB; the geometric mean over 3 shapes of that size)")
    # the core-cache staircase is read with its own further shapes, apart from the streamed ones
    fast = (stair(_FAST_STAIRCASE, (1024, 256), first, 60e-6)
            + stair(_FAST_SHAPES, (256, 1024), [4.0, 4.5, 2.0, 1.0, 1.0, 1.0, 1.0], 50e-6))
    both = few_row_ratios(micro + fast, 2**20)
    assert both is not None and both.cached_mb == pytest.approx(2**20 / MB)
    assert both.cached == pytest.approx([2.0, 3.0, 2.5**0.5, 1.0, 1.0, 1.0, 1.0])
    assert both.streamed == pytest.approx(got.streamed)

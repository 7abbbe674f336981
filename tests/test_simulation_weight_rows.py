"""The fixed cost per stored weight row: what a captured matrix product states as its weight's
rows (from the weight's layout, experts reached included), the pair of streamed matrix-vector
products that measures the cost, and the fit that holds it instead of fitting it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from perfsdk.capture.ops import OpRecord
from perfsdk.capture.recorder import OperationCapture, stored_weight_rows
from perfsdk.simulation.calibration import Observation, fit, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS
from perfsdk.simulation.calibration.measure import (MATVEC_PAIR, fit_with_micro, measured_cache_note,
                                                    pair_memory_rate, weight_row_cost)
from perfsdk.simulation.costmodel import cost_op, pack_passes, product_rows, weight_rows

from tests.test_simulation_fit import TRUTH, _observations, _packed_observations

transformers = pytest.importorskip("transformers")


def test_stored_rows_follow_the_layout_not_the_view() -> None:
    w = torch.empty(80, 48)  # a linear layer's [out, in]
    assert stored_weight_rows(w) == 80
    assert stored_weight_rows(w.t()) == 80  # read transposed, still 80 rows of 48 in memory
    assert stored_weight_rows(torch.empty(48, 80)) == 48  # a Conv1D's [in, out]
    assert stored_weight_rows(torch.empty(4, 256, 1024)) == 4 * 256  # experts [E, in, out]
    assert stored_weight_rows(torch.empty(80)) == 1


class _Three(torch.nn.Module):
    """A linear layer, a Conv1D and a grouped expert product over 4 experts."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.lin = torch.nn.Linear(48, 80, bias=False)
        self.conv = Conv1D(80, 48)  # weight [48, 80]
        self.experts = torch.nn.Parameter(torch.randn(4, 48, 32))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        b = self.conv(x)
        c = torch._grouped_mm(x, self.experts, offs=offs)
        return a.sum() + b.sum() + c.sum()


def test_captured_products_state_their_stored_rows() -> None:
    model = _Three()
    x = torch.randn(6, 48)
    # rows 0-2 to expert 0, 3-5 to expert 2: two of the four experts reached
    offs = torch.tensor([3, 3, 6, 6], dtype=torch.int32)
    with torch.inference_mode(), OperationCapture(model) as cap:
        model(x, offs)
    mm = {o.module_path or o.op: o for o in cap.records if o.category == "matmul"}
    by_op = {o.op: o for o in mm.values()}
    assert by_op["aten.linear"].weight_rows == 80
    conv = next(o for o in mm.values() if o.op in ("aten.addmm", "aten.mm"))
    assert conv.weight_rows == 48
    grouped = by_op["aten._grouped_mm"]
    assert grouped.weight_rows == 2 * 48  # the experts its rows reach, 48 stored rows each
    assert grouped.weight_bytes == 2 * 48 * 32 * 4
    assert weight_rows(grouped) == 96
    # the groups and the rows each received, read off the offsets: one product per group reached
    assert grouped.groups == 4 and grouped.group_rows == [3, 0, 3, 0]
    assert product_rows(grouped) == ([3.0, 3.0], [1.0, 1.0])
    assert by_op["aten.linear"].groups is None and product_rows(by_op["aten.linear"]) == ([6.0], [1.0])
    # and only matrix products with a weight state any
    assert all(o.weight_rows is None for o in cap.records if o.category != "matmul")


def _matvec(n: int, k: int, seconds: float, working_set: float = 400e6) -> Observation:
    nbytes = float(n * k * 4)
    return Observation(f"micro matrix-vector [{n}, {k}]", "micro", seconds, np.array([2.0 * n * k]),
                       np.array([nbytes]), np.ones(1), 0.0, np.array([1.0]), resident=np.array([working_set]),
                       weight_bytes=np.array([nbytes]), weight_rows=np.array([float(n)]), calls=1.0)


def test_the_pair_measures_the_cost_per_row() -> None:
    (n1, k1), (n2, k2) = MATVEC_PAIR
    assert n1 * k1 == n2 * k2 and n1 > n2  # the same bytes, different rows
    pair = [_matvec(n1, k1, 1050e-6), _matvec(n2, k2, 450e-6)]
    assert weight_row_cost(pair) == pytest.approx(600e-6 / (n1 - n2))
    assert weight_row_cost(pair[::-1]) == pytest.approx(600e-6 / (n1 - n2))  # order does not matter
    # the narrow rows not slower: no cost per row, never a negative one
    assert weight_row_cost([_matvec(n1, k1, 400e-6), _matvec(n2, k2, 450e-6)]) == 0.0
    assert weight_row_cost(pair[:1]) is None
    # behind a cache of 100 MB, a quarter of the pair's 400 MB streams from it and pays no cost per
    # row: the difference is that of the other three quarters' rows
    assert weight_row_cost(pair, 100e6) == pytest.approx(600e-6 / (0.75 * (n1 - n2)))
    # a pair whose working set fits the cache measures no row streamed from memory
    assert weight_row_cost([_matvec(n1, k1, 1050e-6, 96e6), _matvec(n2, k2, 450e-6, 96e6)], 100e6) is None


def test_a_weight_served_from_the_cache_pays_no_cost_per_row() -> None:
    """The cost per stored row on the share of the weight streamed from memory, in the cost model
    and in the calibration's fit alike."""
    from perfsdk.simulation.costmodel import pack_time_s
    from perfsdk.hardware.catalog import builtin_profiles

    prof = builtin_profiles()["host-cpu"].model_copy(update={
        "matmul_pack_rows": None, "matmul_pack_gbs": None, "matmul_ns_per_weight_row": 20.0,
        "cache_mb": 100.0, "cache_bandwidth_gbs": 50.0})
    (n, k), _ = MATVEC_PAIR
    op = OpRecord(module_path="lm_head", op="aten.linear", category="matmul", phase="decode",
                  input_shapes=[(1, k), (n, k)], output_shape=(1, n), flops=2 * n * k, macs=n * k,
                  weight_bytes=4 * n * k, bytes_read=4 * n * k + 4 * k, bytes_written=4 * n, elements=n)
    assert pack_time_s(op, prof) == pytest.approx(n * 20e-9)  # no working set said: all from memory
    assert pack_time_s(op, prof, 60e6) == 0.0  # inside the cache
    assert pack_time_s(op, prof, 400e6) == pytest.approx(0.75 * n * 20e-9)  # a quarter from the cache
    no_cache = prof.model_copy(update={"cache_mb": None, "cache_bandwidth_gbs": None})
    assert pack_time_s(op, no_cache, 60e6) == pytest.approx(n * 20e-9)
    ob = Observation.from_ops("lm_head", "decode", 1e-3, [op])
    assert ob.stored_rows() == n
    assert ob.stored_rows(0.0, 100e6) == 0.0  # its 8 MiB inside the cache
    assert ob.stored_rows(0.0, 2e6) == pytest.approx(n * (1.0 - 2e6 / (4.0 * n * k)))


def test_micro_kernels_are_normalised_by_the_reference_around_them_and_their_median_kept() -> None:
    from perfsdk.simulation.calibration.measure import median_micro

    (n1, k1), (n2, k2) = MATVEC_PAIR

    class Levels:  # the reference's time around each timing, as ReferenceTimer.level_at gives it
        def level_at(self, index: int) -> float:
            return {0: 0.040, 7: 0.044, 14: 0.036}[index]

    # the same kernels timed at the start, after the first pass and after the second, while the
    # machine ran at 40, 44 and 36 ms of the reference; the calibration's reference median is 40 ms
    runs = [([_matvec(n1, k1, 1000e-6), _matvec(n2, k2, 400e-6)], 0),
            ([_matvec(n1, k1, 1210e-6), _matvec(n2, k2, 495e-6)], 7),
            ([_matvec(n1, k1, 972e-6), _matvec(n2, k2, 342e-6)], 14)]
    timed = median_micro(runs, Levels(), 0.040)  # type: ignore[arg-type]
    # at the reference's median: 1000, 1100, 1080 and 400, 450, 380 µs; the medians
    assert [ob.measured_s for ob in timed] == pytest.approx([1080e-6, 400e-6])
    assert [ob.label for ob in timed] == [ob.label for ob in runs[0][0]]
    assert weight_row_cost(timed) == pytest.approx(680e-6 / (n1 - n2))
    # without a reference the raw times' median
    raw = median_micro([(r, -1) for r, _ in runs], None, 1.0)
    assert [ob.measured_s for ob in raw] == pytest.approx([1000e-6, 400e-6])
    assert median_micro([], None, 1.0) == []


def test_a_held_coefficient_keeps_its_value_and_the_others_are_recovered() -> None:
    obs, _ = _observations(np.random.default_rng(5))
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), held={"s_per_weight_row": TRUTH["s_per_weight_row"]})
    assert res.held == {"s_per_weight_row": TRUTH["s_per_weight_row"]}
    for name in ("s_per_flop", "s_per_byte", "op_overhead_s", "step_overhead_s", "s_per_score",
                 "s_per_weight_row"):
        assert res.coefficients[name] == pytest.approx(TRUTH[name], rel=1e-6), name
    # held at a wrong value it stays there, and the fit no longer matches exactly
    wrong = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), held={"s_per_weight_row": 3 * TRUTH["s_per_weight_row"]})
    assert wrong.coefficients["s_per_weight_row"] == 3 * TRUTH["s_per_weight_row"]
    assert max(abs(e) for e in wrong.errors_pct.values()) > 1e-3
    prof = profile_from_fit(res, name="held")
    assert prof.matmul_ns_per_weight_row == pytest.approx(TRUTH["s_per_weight_row"] * 1e9)


def test_fit_with_micro_holds_the_pairs_cost_and_leaves_the_pair_out() -> None:
    obs, lists = _observations(np.random.default_rng(11))
    (n1, k1), (n2, k2) = MATVEC_PAIR
    row = TRUTH["s_per_weight_row"]
    # the memory's rate left to the models (the default): only the pair's difference is used
    pair = [_matvec(n1, k1, 300e-6 + n1 * row), _matvec(n2, k2, 300e-6 + n2 * row)]
    res, kept = fit_with_micro(pair, obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert res.held["s_per_weight_row"] == pytest.approx(row) and "s_per_byte" not in res.held
    assert res.coefficients["s_per_weight_row"] == pytest.approx(row)
    assert kept == []  # the pair is not fitted as observations
    assert res.coefficients["s_per_byte"] == pytest.approx(TRUTH["s_per_byte"], rel=1e-6)
    # the profile costs an op's rows on top of max(compute, memory), as the fit did
    prof = profile_from_fit(res, name="fitted")
    for o, ops in zip(obs[:4], lists[:4]):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)
    assert PARAMS.index("s_per_weight_row") == 10


def test_the_repacking_staircase_at_one_row_per_block() -> None:
    """With P = 1 a product of 2 or 3 rows streams its weights once per row and one of 4 rows or
    more repacks them once; a one-row product never repacks, at any P."""
    from perfsdk.simulation.calibration.fit import PACK_ROWS_GRID
    from perfsdk.simulation.costmodel import pack_passes

    assert 1.0 in PACK_ROWS_GRID
    assert [pack_passes(r, 1.0) for r in (1, 2, 3, 4, 8, 64)] == [0.0, 2.0, 3.0, 1.0, 1.0, 1.0]
    assert [pack_passes(r, 2.0) for r in (1, 2, 3, 4, 7, 8)] == [0.0, 1.0, 2.0, 2.0, 4.0, 1.0]
    assert list(pack_passes(np.array([1.0, 2.0, 5.0]), 1.0)) == [0.0, 2.0, 1.0]
    assert pack_passes(3, 0.0) == 0.0


def _step(rows: int, seconds: float) -> Observation:
    from perfsdk.simulation.calibration.measure import _STAIRCASE

    return Observation(f"{_STAIRCASE}: {rows} rows", "micro", seconds, np.zeros(1), np.zeros(1), np.ones(1), 0.0,
                       np.array([float(rows)]))


def test_the_staircase_micro_kernels_choose_the_repacking_size_and_the_fit_holds_it() -> None:
    from perfsdk.simulation.calibration.fit import PACK_ROWS_GRID
    from perfsdk.simulation.calibration.measure import STAIRCASE_ROWS, repacking_rows

    assert STAIRCASE_ROWS == (1, 2, 3, 4, 8)
    # measured on a 2-core x86 host, one thread, a [4096, 512] fp32 weight streamed (µs): 2 and 3
    # rows stream it about once more per row, 4 and 8 rows repack it once: P = 1
    one = [_step(r, t * 1e-6) for r, t in zip(STAIRCASE_ROWS, (850, 1636, 2018, 1164, 1308))]
    assert repacking_rows(one, PACK_ROWS_GRID) == 1.0
    # a kernel that streams once more per block of two rows up to 7 rows: P = 2
    two = [_step(r, (500 + 400 * n) * 1e-6) for r, n in zip(STAIRCASE_ROWS, (0, 1, 2, 2, 1))]
    assert repacking_rows(two, PACK_ROWS_GRID) == 2.0
    # no staircase at all: P = 0
    flat = [_step(r, 500e-6) for r in STAIRCASE_ROWS]
    assert repacking_rows(flat, PACK_ROWS_GRID) == 0.0
    assert repacking_rows(one[1:], PACK_ROWS_GRID) is None  # no one-row product to compare with
    # the fit keeps the measured size and leaves the staircase out of the observations
    obs, _ = _observations(np.random.default_rng(2))
    res, kept = fit_with_micro(one, obs, cache_bytes=(0.0,))
    assert res.pack_rows == 1.0 and kept == []
    assert res.pack_note == ("from 1 rows (the staircase: +0.92, +1.37, +0.37, +0.54 one-row products' time more "
                             "at 2, 3, 4, 8 rows; residual 0.005)")
    res2, _ = fit_with_micro(two, obs, cache_bytes=(0.0,))
    assert res2.pack_rows == 2.0


def test_a_staircase_that_cannot_tell_two_sizes_apart_keeps_the_larger() -> None:
    from perfsdk.simulation.calibration.fit import PACK_ROWS_GRID
    from perfsdk.simulation.calibration.measure import PACK_ROWS_TIE, STAIRCASE_ROWS, repacking_choice

    # two calibrations of one 2-core host, two threads, minutes apart (µs): P = 1 fits the first
    # staircase 4 % better than P = 2, P = 2 the second 25 % better; both keep P = 2
    first = [_step(r, t * 1e-6) for r, t in zip(STAIRCASE_ROWS, (639.9, 1225.2, 1514.2, 1215.2, 1068.1))]
    second = [_step(r, t * 1e-6) for r, t in zip(STAIRCASE_ROWS, (631.5, 1229.8, 1589.7, 1274.9, 1074.9))]
    p1, said1 = repacking_choice(first, PACK_ROWS_GRID)
    p2, said2 = repacking_choice(second, PACK_ROWS_GRID)
    assert (p1, p2) == (2.0, 2.0) and PACK_ROWS_TIE == 1.25
    assert said1 == ("from 2 rows (the staircase: +0.91, +1.37, +0.90, +0.67 one-row products' time more at 2, 3, 4, "
                     "8 rows; residual 0.056, and 0.054 at P = 1: within 1.25 times of each other, a tie the "
                     "staircase cannot settle, the larger kept)")
    assert said2 == ("from 2 rows (the staircase: +0.95, +1.52, +1.02, +0.70 one-row products' time more at 2, 3, 4, "
                     "8 rows; residual 0.045)")
    # without the tie, the least residual: the first staircase alone would have given P = 1
    staircase_only = {p: repacking_choice(first, (0.0, p))[0] for p in (1.0, 2.0)}
    assert staircase_only == {1.0: 1.0, 2.0: 2.0}
    # a staircase none of whose sizes explains it: none
    flat = [_step(r, 500e-6) for r in STAIRCASE_ROWS]
    assert repacking_choice(flat, PACK_ROWS_GRID) == (0.0, "none (the staircase: +0.00, +0.00, +0.00, +0.00 one-row "
                                                          "products' time more at 2, 3, 4, 8 rows; residual 0.000)")
    # a grid without P = 0 (a size asked for) keeps its size whatever the staircase
    assert repacking_choice(flat, (2.0,))[0] == 2.0 and repacking_choice(first, (4.0,))[0] == 4.0


def _grouped_op(rows: int, groups: int, group_rows: list[int] | None, reached: float) -> OpRecord:
    """A grouped product of ``rows`` routed rows over [groups, 512, 128] fp32 experts."""
    wb = int(reached * 512 * 128 * 4)
    return OpRecord(module_path="mlp.experts", op="aten._grouped_mm", category="matmul", phase="decode",
                    input_shapes=[(rows, 128), (groups, 128, 512)], output_shape=(rows, 512),
                    flops=2 * rows * 128 * 512, macs=rows * 128 * 512, weight_bytes=wb,
                    bytes_read=wb + rows * 128 * 4, bytes_written=rows * 512 * 4, elements=rows * 512,
                    weight_rows=int(reached * 128), groups=groups, group_rows=group_rows)


def test_a_grouped_product_is_priced_as_one_product_per_group_it_reaches() -> None:
    from math import comb

    from perfsdk.simulation.costmodel import compute_time_s, pack_time_s
    from perfsdk.hardware.catalog import builtin_profiles

    prof = builtin_profiles()["host-cpu"].model_copy(update={
        "matmul_pack_rows": 1.0, "matmul_pack_gbs": 20.0, "matmul_half_rows": 16.0,
        "matmul_ns_per_weight_row": None, "softmax_ns_per_element": None})
    # routed rows 3, 0, 1, 4 over four experts (a real run's offsets): three products; the
    # 3-row one streams its weights three more times, the 1-row one never, the 4-row one repacks
    # once; only the 4-row one is slowed by (4 + 16) / 4
    op = _grouped_op(8, 4, [3, 0, 1, 4], reached=3)
    assert product_rows(op) == ([3.0, 1.0, 4.0], [1.0, 1.0, 1.0])
    assert pack_time_s(op, prof) == pytest.approx((3 + 0 + 1) / 3 * op.weight_bytes / 20e9)
    plain = compute_time_s(replace(op, groups=None, group_rows=None), prof) / (1 + 16 / 8)
    per_row = plain / 8
    assert compute_time_s(op, prof) == pytest.approx(per_row * (8 + 16))
    # as one product of all eight rows (what it was priced as): one repacking pass, (8 + 16) / 8
    whole = replace(op, groups=None, group_rows=None)
    assert pack_time_s(whole, prof) == pytest.approx(op.weight_bytes / 20e9)
    # on the meta device the routing has no values: each of the eight rows picks one of the four
    # experts at random, E * Binomial(k; 8, 1/4) experts expected with k rows
    meta = _grouped_op(8, 4, None, reached=4 * (1 - 0.75 ** 8))
    ks, ws = product_rows(meta)
    expected = {k: 4 * comb(8, k) * 0.25 ** k * 0.75 ** (8 - k) for k in range(1, 9)}
    assert ks == [float(k) for k in range(1, len(ks) + 1)]
    assert ws == pytest.approx([expected[int(k)] for k in ks], rel=1e-9, abs=1e-12)
    assert sum(ws) == pytest.approx(4 * (1 - 0.75 ** 8), rel=1e-6)  # the experts reached
    passes = sum(expected[k] * float(pack_passes(k, 1.0)) for k in expected) / (4 * (1 - 0.75 ** 8))
    assert pack_time_s(meta, prof) == pytest.approx(passes * meta.weight_bytes / 20e9, rel=1e-6)
    assert passes == pytest.approx(1.511, abs=1e-3)  # against 1 pass as one product of 8 rows
    slowed = sum(expected[k] for k in expected if k >= 4)
    assert compute_time_s(meta, prof) == pytest.approx(per_row * (8 + 16 * slowed), rel=1e-6)
    # the calibration's observation prices it the same way
    ob = Observation.from_ops("moe", "decode", 1.0, [meta])
    assert ob.packed_bytes(1.0)[0] == pytest.approx(passes * meta.weight_bytes, rel=1e-6)
    assert ob.row_flops(1.0)[0] == pytest.approx(meta.flops / 8 * slowed, rel=1e-6)


def test_a_routers_top_k_sends_each_tokens_rows_to_different_groups() -> None:
    """With the router's top-k known (``group_picks``), a group receives each token's row with
    probability k/E and at most one: E * Binomial(j; M/k, k/E) groups with j rows."""
    from math import comb

    # one token, top-2 of 4 experts: exactly two experts, one row each (rows picking on their own
    # would reach 1.75 experts, one of them with both rows a quarter of the time)
    one = replace(_grouped_op(2, 4, None, reached=2), group_picks=2)
    assert product_rows(one) == ([1.0], [pytest.approx(2.0)])
    assert product_rows(replace(one, group_picks=None)) == ([1.0, 2.0], [pytest.approx(1.5), pytest.approx(0.25)])
    # four tokens (eight routed rows), top-2 of 4: Binomial(j; 4, 1/2) per expert
    four = replace(_grouped_op(8, 4, None, reached=4 * (1 - 0.5 ** 4)), group_picks=2)
    ks, ws = product_rows(four)
    assert ks == [1.0, 2.0, 3.0, 4.0]
    assert ws == pytest.approx([4 * comb(4, j) * 0.5 ** 4 for j in (1, 2, 3, 4)], rel=1e-12)
    assert sum(ws) == pytest.approx(3.75)
    # every expert picked by every token (top-4 of 4): four products of the tokens' rows
    assert product_rows(replace(four, group_picks=4)) == ([2.0], [4.0])
    # a top-k larger than the groups says nothing: each row picks on its own
    assert product_rows(replace(four, group_picks=8)) == product_rows(replace(four, group_picks=None))


def test_a_grouped_products_products_each_wait_on_their_own_bound() -> None:
    """The products of a grouped product run one after another: those of few rows stream their
    group's weights (memory-bound), those of many rows compute; the op takes the sum of each
    product's own bound, more than the larger of its totals. The calibration's features split the
    op the same way."""
    from perfsdk.hardware.catalog import builtin_profiles
    from perfsdk.simulation.costmodel import compute_time_s, memory_time_s, pack_time_s, serial_products

    base = builtin_profiles()["host-cpu"]
    prof = type(base).model_validate({**base.model_dump(), "matmul_pack_rows": 1.0, "matmul_pack_gbs": 20.0,
                                      "matmul_half_rows": 16.0, "matmul_ns_per_weight_row": None,
                                      "softmax_ns_per_element": None, "cache_mb": None, "call_overhead_s": None,
                                      "memory_bandwidth_gbs": base.memory_bandwidth_gbs * 4})
    # rows 1 and 7 over two of four experts: 8 rows, the 7-row product slowed by (7 + 16) / 7
    op = _grouped_op(8, 4, [1, 0, 0, 7], reached=2)
    compute, memory = compute_time_s(op, prof), memory_time_s(op, prof)
    per_row = compute / (8 + 16)
    one, seven = per_row * 1, per_row * (7 + 16)  # each product's compute
    assert compute == pytest.approx(one + seven)
    mem_each = memory / 2  # each reads one expert's weights
    assert one < mem_each < seven  # the 1-row product streams, the 7-row one computes
    expected = mem_each + seven
    assert expected > max(compute, memory)
    c = cost_op(op, prof)
    assert c.compute_s == pytest.approx(compute) and c.memory_s == pytest.approx(memory)
    assert c.serial_s == pytest.approx(expected - max(compute, memory))
    assert c.time_s == pytest.approx(expected + pack_time_s(op, prof) + c.overhead_s)
    t, c_share, m_share = serial_products(product_rows(op), 1.0, 16.0, compute, memory)
    assert (t, c_share, m_share) == (pytest.approx(expected), pytest.approx(seven / compute), pytest.approx(0.5))
    # a plain product is one product: the larger of its terms, nothing on top
    plain = replace(op, groups=None, group_rows=None)
    assert cost_op(plain, prof).serial_s == 0.0
    assert serial_products(product_rows(plain), 1.0, 16.0, 2.0, 3.0) == (3.0, 0.0, 1.0)
    # the calibration's features: the compute-bound product's FLOPs, the memory-bound one's bytes
    ob = Observation.from_ops("moe", "decode", 1.0, [op])
    x_f, x_b = compute / (op.flops * (8 + 16) / 8), 1.0 / prof.effective_bandwidth_bytes_per_s
    f = ob.features(x_f, x_b, 16.0, pack_rows=1.0)
    assert f[0] == pytest.approx(op.flops * (1 + 16 / 8) * seven / compute, rel=1e-9)
    assert f[1] == pytest.approx(0.5 * (op.bytes_read + op.bytes_written), rel=1e-9)


def _linear_op(rows: int, out_f: int = 4096, in_f: int = 512, *, conv1d: bool = False) -> OpRecord:
    """A product of ``rows`` rows over an fp32 weight of ``out_f`` x ``in_f``, stored [out, in]
    as a linear layer does or [in, out] as a Conv1D does."""
    wb = out_f * in_f * 4
    return OpRecord(module_path="mlp.up", op="aten.mm" if conv1d else "aten.linear", category="matmul",
                    phase="decode", input_shapes=[(rows, in_f), (in_f, out_f) if conv1d else (out_f, in_f)],
                    output_shape=(rows, out_f), flops=2 * rows * in_f * out_f, macs=rows * in_f * out_f,
                    weight_bytes=wb, bytes_read=wb + rows * in_f * 4, bytes_written=rows * out_f * 4,
                    elements=rows * out_f, weight_rows=in_f if conv1d else out_f)


def test_the_cost_per_stored_row_stops_where_the_blocked_kernel_starts() -> None:
    """Below 4P rows a product walks its weight as stored and pays per stored row; from 4P rows
    the blocked kernel runs on the repacked weight, and a linear layer's weight costs what the same
    weight stored as a Conv1D's does. Without a repacking size every product pays."""
    from perfsdk.hardware.catalog import builtin_profiles
    from perfsdk.simulation.costmodel import pack_time_s, weight_row_applies, weight_row_share

    prof = builtin_profiles()["host-cpu"].model_copy(update={
        "matmul_pack_rows": 1.0, "matmul_pack_gbs": 20.0, "matmul_ns_per_weight_row": 50.0})
    assert [weight_row_applies(r, 1.0) for r in (1, 2, 3, 4, 8, 64)] == [True, True, True, False, False, False]
    assert [weight_row_applies(r, 2.0) for r in (1, 7, 8)] == [True, True, False]
    assert weight_row_applies(64, 0.0) is True and weight_row_applies(64, None) is True
    assert list(weight_row_applies(np.array([1.0, 4.0]), 1.0)) == [True, False]
    wb = 4096 * 512 * 4
    for rows, passes, paid in ((1, 0, True), (2, 2, True), (3, 3, True), (4, 1, False), (16, 1, False)):
        for conv1d, stored in ((False, 4096), (True, 512)):
            op = _linear_op(rows, conv1d=conv1d)
            want = passes * wb / 20e9 + (stored * 50e-9 if paid else 0.0)
            assert pack_time_s(op, prof) == pytest.approx(want, rel=1e-12), (rows, conv1d)
            # the calibration's observation counts the same stored rows
            ob = Observation.from_ops("one", "decode", 1.0, [op])
            assert ob.stored_rows(1.0) == (stored if paid else 0.0)
            assert ob.stored_rows(0.0) == stored
    # the two layouts of one weight cost the same from four rows, not below
    lin, conv = _linear_op(4), _linear_op(4, conv1d=True)
    assert pack_time_s(lin, prof) == pack_time_s(conv, prof)
    assert pack_time_s(_linear_op(1), prof) - pack_time_s(_linear_op(1, conv1d=True), prof) == pytest.approx(
        (4096 - 512) * 50e-9)
    # no repacking size: every product pays, whatever its rows
    flat = prof.model_copy(update={"matmul_pack_rows": None})
    assert pack_time_s(_linear_op(16), flat) == pytest.approx(4096 * 50e-9)
    # a grouped product: its groups of 3, 1 and 4 rows reach three experts' stored rows; the
    # 4-row group's product is blocked, so two thirds of them pay
    grouped = _grouped_op(8, 4, [3, 0, 1, 4], reached=3)
    assert weight_row_share(product_rows(grouped), 1.0) == pytest.approx(2 / 3)
    rows_only = prof.model_copy(update={"matmul_pack_gbs": None})
    assert pack_time_s(grouped, rows_only) == pytest.approx(3 * 128 * 2 / 3 * 50e-9)
    assert Observation.from_ops("moe", "decode", 1.0, [grouped]).stored_rows(1.0) == pytest.approx(3 * 128 * 2 / 3)


def test_with_a_repacking_size_the_fit_and_the_simulation_price_stored_rows_alike() -> None:
    """Observations that follow the cost model with P = 1 (products of 1 to 512 rows, the cost
    per stored row only below 4 rows): the fit holding the true cost per row recovers the rest,
    and the profile it makes prices every op list as the fit did."""
    obs, lists, truth = _packed_observations(7)
    assert {o.stored_rows(1.0) == 0.0 for o in obs} == {True, False}  # some products pay, some do not
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(1.0,), held={"s_per_weight_row": TRUTH["s_per_weight_row"]})
    assert res.pack_rows == 1.0
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_pack_rows == 1.0
    for o, ops in zip(obs, lists):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)


def _calls(seconds_each: float, calls: int = 400) -> Observation:
    """The chain of bare kernel calls among the micro-kernels."""
    return Observation(f"micro {calls} kernel calls", "micro", seconds_each * calls, np.zeros(1), np.zeros(1),
                       np.zeros(1), 0.0, np.array([np.inf]), ops=0.0, extra_launches=float(calls))


def test_the_pair_measures_the_memory_rate_its_rows_and_one_call_taken_off() -> None:
    (n1, k1), (n2, k2) = MATVEC_PAIR
    nbytes = float(n2 * k2 * 4)
    row, call, per_byte = 60e-9, 3e-6, 45e-12
    pair = [_matvec(n1, k1, nbytes * per_byte + n1 * row + call), _matvec(n2, k2, nbytes * per_byte + n2 * row + call)]
    micro = [*pair, _calls(call)]
    assert weight_row_cost(micro) == pytest.approx(row)
    assert pair_memory_rate(micro, row) == pytest.approx(per_byte)
    # without the chain of calls, the call stays in the bytes' time
    assert pair_memory_rate(pair, row) == pytest.approx(per_byte + call / nbytes)
    # past a cache of 40 MB, a tenth of the 400 MB working set sits in it: its rows are not paid
    streamed = 1.0 - 40e6 / 400e6
    assert pair_memory_rate(micro, row, 40e6) == pytest.approx(per_byte + n2 * row * (1 - streamed) / nbytes)
    # a working set inside the cache, a pair missing or nothing left: no rate
    assert pair_memory_rate(micro, row, 500e6) is None
    assert pair_memory_rate(pair[:1], row) is None
    assert pair_memory_rate(micro, 1e-3) is None


def test_fit_with_micro_holds_the_memory_rate_the_pair_streams_at() -> None:
    obs, _ = _observations(np.random.default_rng(11))
    (n1, k1), (n2, k2) = MATVEC_PAIR
    row, call = TRUTH["s_per_weight_row"], 3e-6
    nbytes = float(n2 * k2 * 4)
    # the pair streams faster than the models' fit alone would say: its rate is held, not fitted
    per_byte = 0.8 * TRUTH["s_per_byte"]
    micro = [_matvec(n1, k1, nbytes * per_byte + n1 * row + call), _matvec(n2, k2, nbytes * per_byte + n2 * row + call),
             _calls(call)]
    res, kept = fit_with_micro(micro, obs, cache_bytes=(0.0,), pack_rows=(0.0,), hold_memory_rate=True)
    assert res.held["s_per_byte"] == pytest.approx(per_byte)
    assert res.coefficients["s_per_byte"] == pytest.approx(per_byte)
    assert res.held["s_per_weight_row"] == pytest.approx(row)
    assert all(not ob.label.startswith("micro matrix-vector") for ob in kept)
    # at the true rate the fit finds every other coefficient where the models put it
    micro = [_matvec(n1, k1, nbytes * TRUTH["s_per_byte"] + n1 * row + call),
             _matvec(n2, k2, nbytes * TRUTH["s_per_byte"] + n2 * row + call), _calls(call)]
    res, _ = fit_with_micro(micro, obs, cache_bytes=(0.0,), pack_rows=(0.0,), hold_memory_rate=True)
    for name in ("s_per_flop", "s_per_byte", "step_overhead_s"):
        assert res.coefficients[name] == pytest.approx(TRUTH[name], rel=1e-3), name
    # a rate the caller holds wins over the pair's
    res, _ = fit_with_micro(micro, obs, cache_bytes=(0.0,), pack_rows=(0.0,), held={"s_per_byte": 1e-11},
                            hold_memory_rate=True)
    assert res.held["s_per_byte"] == 1e-11
    # by default the rate is fitted on the models, the pair's rows held
    res, _ = fit_with_micro(micro, obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert set(res.held) == {"s_per_weight_row"}


def test_the_cache_note_says_what_measured_the_memory_rate() -> None:
    from perfsdk.simulation.calibration.fit import FitResult

    res = FitResult(coefficients={"s_per_byte": 5e-11, "s_per_cached_byte": 5e-11}, errors_pct={}, iterations=0,
                    observations=0, cache_bytes=8e6, cache_rate_tied=True, held={"s_per_byte": 5e-11})
    assert measured_cache_note(8e6, res, memory_origin="the pair").endswith(
        "20.0 GB/s from memory, as the pair of one-row products streamed it (held): it only divides the weights' "
        "rows between the cache and memory")
    assert "as the working sets past it streamed (held)" in measured_cache_note(8e6, res)

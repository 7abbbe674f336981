"""The cost per stored weight row by the row's length: the ladder of one-row products that
measures it, the table a profile keeps, and the fit and the simulation that price each product's
rows at its own length."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.profile import WeightRowCosts, parse_profile, profile_to_yaml
from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS
from perfsdk.simulation.calibration.measure import (MATVEC_PAIR, ROW_LADDER_INNER, fit_with_micro, pair_memory_rate,
                                                    row_ladder_shapes, weight_row_cost, weight_row_costs)
from perfsdk.simulation.costmodel import cost_op, pack_time_s, weight_row_bytes

from tests.test_simulation_fit import TRUTH, _observations

#: a table as a 2-core host's ladder read it (ns per row at 512 ... 16384 bytes a row)
TABLE = WeightRowCosts(row_bytes=[512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0],
                       ns=[40.0, 55.0, 65.0, 67.0, 38.0, 0.0])
PER_BYTE = 45e-12  # the memory's rate the longest rows stream at


def _matvec(n: int, k: int, seconds: float, working_set: float = 400e6) -> Observation:
    nbytes = float(n * k * 4)
    return Observation(f"micro matrix-vector: 1 rows over [{n}, {k}] fp32, streamed", "micro", seconds,
                       np.array([2.0 * n * k]), np.array([nbytes]), np.ones(1), 0.0, np.array([1.0]),
                       resident=np.array([working_set]), weight_bytes=np.array([nbytes]),
                       weight_rows=np.array([float(n)]), calls=1.0)


def _ladder(table: WeightRowCosts = TABLE, per_byte: float = PER_BYTE) -> list[Observation]:
    """The ladder's products timed as ``table`` and ``per_byte`` say they take."""
    return [_matvec(n, k, n * k * 4 * per_byte + n * table.at(4.0 * k) * 1e-9) for n, k in row_ladder_shapes()]


def test_the_ladder_holds_the_pair_and_weights_of_its_bytes() -> None:
    shapes = row_ladder_shapes()
    assert [k for _, k in shapes] == list(ROW_LADDER_INNER) == [128, 256, 512, 1024, 2048, 4096]
    assert {n * k for n, k in shapes} == {8192 * 256}  # 8 MiB of fp32 each
    assert set(MATVEC_PAIR) <= set(shapes)


def test_the_ladder_reads_each_lengths_cost_against_the_longest_rows() -> None:
    ladder = _ladder()
    table = weight_row_costs(ladder)
    assert table is not None
    assert table.row_bytes == [512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]
    assert table.ns == pytest.approx(TABLE.ns)
    # the pair's figure is its own: the difference of its two products over their rows' difference
    assert weight_row_cost(ladder) == pytest.approx((8192 * 55.0 - 512 * 0.0) / (8192 - 512) * 1e-9)
    # read on the longest rows the memory's rate is theirs: none of their time goes to rows
    assert pair_memory_rate(ladder, 1e-6, costs=table) == pytest.approx(PER_BYTE)
    # a cache of 100 MB holds a quarter of the 400 MB working set: the rows are paid on the rest
    assert weight_row_costs(ladder, 100e6).ns == pytest.approx([c / 0.75 for c in TABLE.ns])  # type: ignore[union-attr]
    # a length whose rows came out faster than the longest costs nothing, never less
    faster = _ladder()
    faster[0].measured_s = faster[-1].measured_s * 0.9
    assert weight_row_costs(faster).ns[0] == 0.0  # type: ignore[union-attr]
    # the order they were timed in does not matter
    assert weight_row_costs(ladder[::-1]) == table
    # two lengths are a pair, not a ladder; a working set inside the cache measures nothing
    assert weight_row_costs([ladder[1], ladder[-1]]) is None
    assert weight_row_costs(ladder, 500e6) is None


def test_a_table_is_linear_in_log_length_and_held_beyond() -> None:
    assert TABLE.at(1024) == pytest.approx(55.0)
    assert TABLE.at(1536) == pytest.approx(55.0 + 10.0 * np.log(1.5) / np.log(2.0))
    assert TABLE.at(100) == 40.0 and TABLE.at(1e6) == 0.0
    assert list(TABLE.at(np.array([512.0, 2048.0, 12288.0]))) == pytest.approx(
        [40.0, 65.0, 38.0 * (1 - np.log(1.5) / np.log(2.0))])
    with pytest.raises(ValidationError, match="one cost per row length"):
        WeightRowCosts(row_bytes=[512.0, 1024.0], ns=[1.0])
    with pytest.raises(ValidationError, match="positive and ascending"):
        WeightRowCosts(row_bytes=[1024.0, 512.0], ns=[1.0, 2.0])
    with pytest.raises(ValidationError, match="at least 0"):
        WeightRowCosts(row_bytes=[512.0, 1024.0], ns=[1.0, -2.0])


def _product(n: int, k: int, *, in_out: bool = False, rows: int = 1) -> OpRecord:
    w = 4 * n * k
    return OpRecord(module_path="p", op="aten.linear", category="matmul", phase="decode",
                    input_shapes=[(rows, k), (n, k)], output_shape=(rows, n), flops=2 * rows * n * k, macs=rows * n * k,
                    weight_bytes=w, bytes_read=w + 4 * rows * k, bytes_written=4 * rows * n, elements=rows * n,
                    weight_rows=k if in_out else None, weight_in_out=in_out)


def test_the_simulation_prices_each_products_rows_at_their_length() -> None:
    from perfsdk.hardware.catalog import builtin_profiles

    base = builtin_profiles()["host-cpu"].model_copy(update={
        "matmul_pack_rows": None, "matmul_pack_gbs": None, "matmul_ns_per_weight_row": 55.0, "cache_mb": None,
        "cache_bandwidth_gbs": None, "matmul_weight_row_costs": None})
    with_table = base.model_copy(update={"matmul_weight_row_costs": TABLE})
    head = _product(8192, 384)  # an output layer tied to a 384-wide embedding: 8192 rows of 1536 bytes
    assert weight_row_bytes(head) == 1536.0
    assert pack_time_s(head, base) == pytest.approx(8192 * 55.0e-9)
    assert pack_time_s(head, with_table) == pytest.approx(8192 * TABLE.at(1536) * 1e-9)
    # a Conv1D's [in, out] weight: 384 stored rows of 1152 fp32 each
    conv = _product(1152, 384, in_out=True)
    assert weight_row_bytes(conv) == 4608.0
    assert pack_time_s(conv, with_table) == pytest.approx(384 * TABLE.at(4608) * 1e-9)
    # other ops have no rows
    add = OpRecord(module_path="a", op="aten.add", category="elementwise", phase="decode", bytes_read=8, elements=1)
    assert weight_row_bytes(add) == 0.0 and pack_time_s(add, with_table) == 0.0
    # the table survives the profile's file
    again = parse_profile(__import__("yaml").safe_load(profile_to_yaml(with_table)))
    assert again.matmul_weight_row_costs == TABLE


def test_the_fit_prices_rows_at_their_length_and_the_profile_keeps_the_table() -> None:
    """Models whose products' rows cost what the table says at their lengths: the fit that holds
    the ladder's table recovers every other coefficient, and the profile made from it prices each op
    as the fit did."""
    truth = {**TRUTH, "s_per_weight_row": 1e-9}
    vec = np.array([truth[p] for p in PARAMS])
    obs, lists = _observations(np.random.default_rng(11))
    for o in obs:  # measured as the table prices their rows (one unit of x_r = 1 ns)
        o.row_costs = (TABLE, 1.0)
        o.measured_s = o.predict(vec)
        o.row_costs = None
    ladder = _ladder(per_byte=truth["s_per_byte"])
    res, kept = fit_with_micro(ladder, obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    row_s = weight_row_cost(ladder)
    assert row_s is not None and res.held["s_per_weight_row"] == pytest.approx(row_s)
    assert res.weight_row_costs is not None and res.weight_row_costs.ns == pytest.approx(TABLE.ns)
    assert kept == []  # the ladder is not fitted as observations
    for name in ("s_per_flop", "s_per_byte", "op_overhead_s", "step_overhead_s", "s_per_score"):
        assert res.coefficients[name] == pytest.approx(truth[name], rel=1e-6), name
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_weight_row_costs is not None and prof.matmul_weight_row_costs.ns == pytest.approx(TABLE.ns)
    assert prof.matmul_ns_per_weight_row == pytest.approx(row_s * 1e9)
    assert prof.calibration is not None and prof.calibration.weight_row_costs == prof.matmul_weight_row_costs
    for o, ops in zip(obs, lists):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)


def test_calibrate_says_the_cost_per_row_by_length() -> None:
    from perfsdk.cli.simulate import _say_held
    from perfsdk.simulation.calibration.fit import FitResult

    res = FitResult(coefficients={}, errors_pct={}, iterations=0, observations=0,
                    held={"s_per_weight_row": 55e-9}, weight_row_costs=TABLE)
    import click

    @click.command()
    def say() -> None:
        _say_held(res)

    out = CliRunner().invoke(say).output
    assert "measured, not fitted: 55.0 ns per stored weight row" in out
    assert ("measured, not fitted: by the row's length, 40.0 ns at 512 B, 55.0 ns at 1024 B, 65.0 ns at 2048 B, "
            "67.0 ns at 4096 B, 38.0 ns at 8192 B, 0.0 ns at 16384 B") in out

"""The weight's layout and the product's inner size in the small-M slowdown: which products read
a weight stored [in, out] (transformers' Conv1D) rather than [out, in] (a linear layer), the
calibration's layout ladder that measures, at several inner sizes, how many rows of the slowdown
each product runs without, and the cost model, the fit and the intervals that price it alike."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from perfsdk.capture.ops import OpRecord
from perfsdk.capture.recorder import OperationCapture
from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.hardware.profile import CalibrationRecord, HardwareProfile, HardwareProfileError, SmallMGaps
from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS
from perfsdk.simulation.calibration.measure import (LAYOUT_INNER, LAYOUT_OUT, LAYOUT_ROWS, _LAYOUT, fit_with_micro,
                                                    _layout_products, anchored_on_products, ladder_half_rows,
                                                    ladder_label, median_micro, small_m_gaps, small_m_text)
from perfsdk.simulation.costmodel import compute_time_s, cost_op, half_rows, inner_size
from perfsdk.simulation.uncertainty import replicate_ratios

from tests.test_simulation_fit import TRUTH, _observations

transformers = pytest.importorskip("transformers")


class _Layers(torch.nn.Module):
    """A linear layer with and without bias, a Conv1D, and a weight used on the left."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.lin = torch.nn.Linear(48, 80)
        self.nobias = torch.nn.Linear(48, 80, bias=False)
        self.conv = Conv1D(80, 48)  # weight [48, 80]
        self.left = torch.nn.Parameter(torch.randn(80, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sum() + self.nobias(x).sum() + self.conv(x).sum() + torch.mm(self.left, x).sum()


def test_captured_products_say_whether_their_weight_is_stored_in_out() -> None:
    model = _Layers()
    with torch.inference_mode(), OperationCapture(model) as cap:
        model(torch.randn(6, 48))
    mm = {o.module_path: o for o in cap.records if o.category == "matmul"}
    assert mm["lin"].weight_in_out is False and mm["nobias"].weight_in_out is False
    assert mm["conv"].weight_in_out is True and mm["conv"].weight_rows == 48
    assert mm[""].weight_in_out is False  # the weight is the left operand: not a layer's x @ W
    # the inner size each product sums over, from the captured FLOPs and output shape
    assert {path: inner_size(o) for path, o in mm.items()} == {"lin": 48.0, "nobias": 48.0, "conv": 48.0, "": 6.0}
    assert not any(o.weight_in_out for o in cap.records if o.category != "matmul")


def test_gpt2_products_read_in_out_weights_and_llama_ones_do_not() -> None:
    """On the meta device (what a prediction captures) and in the analytic generator: GPT-2's
    Conv1D layers state [in, out], its tied head and every Llama product do not."""
    from perfsdk.flops.meta import capture_generation_ops
    from perfsdk.models.arch import architecture_from_config
    from perfsdk.simulation.analytic import generation_ops

    gpt2 = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, bos_token_id=0,
                                   eos_token_id=0)
    llama = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                     num_attention_heads=4, num_key_value_heads=4, vocab_size=256)
    for cfg, layers in ((gpt2, {"c_attn", "c_proj", "c_fc"}), (llama, set())):
        cap = capture_generation_ops(cfg, 1, 8, 3, [1, 2])
        products = [o for o in cap.ops if o.category == "matmul" and o.weight_bytes]
        flagged = {o.module_path.rsplit(".", 1)[-1] for o in products if o.weight_in_out}
        assert flagged == layers, cfg.model_type
        # every layer product of GPT-2 (4 per layer, each phase), none of its head
        assert sum(o.weight_in_out for o in products) == (4 * 2 * 3 if layers else 0)
        # inner sizes on the meta device: 64 into every projection but the MLP's way out (256 / 128)
        down = "c_proj" if layers else "down_proj"
        mlp_out = [inner_size(o) for o in products if o.module_path.endswith(f"mlp.{down}")]
        assert mlp_out and set(mlp_out) == {4 * 64.0 if layers else 128.0}
        assert {inner_size(o) for o in products if "lm_head" in o.module_path} == {64.0}
        analytic = [o for o in generation_ops(architecture_from_config(cfg), 1, 8, 3, "float32")
                    if o.category == "matmul" and o.weight_bytes]
        assert {o.weight_in_out for o in analytic if "lm_head" not in o.module_path} == {bool(layers)}
        assert not any(o.weight_in_out for o in analytic if "lm_head" in o.module_path)


def _product(rows: int, in_out: bool, k: int = 512, n: int = 1536) -> OpRecord:
    w = k * n * 4
    return OpRecord(module_path="c_fc" if in_out else "up_proj", op="addmm" if in_out else "linear",
                    category="matmul", phase="prefill", dtype="float32", input_shapes=[(rows, k)],
                    output_shape=(rows, n), flops=2 * rows * k * n, macs=rows * k * n, weight_bytes=w,
                    bytes_read=w + rows * k * 4, bytes_written=rows * n * 4, elements=rows * n,
                    weight_rows=k if in_out else n, weight_in_out=in_out)


def test_a_product_over_an_in_out_weight_takes_its_own_h() -> None:
    base_prof = builtin_profiles()["host-cpu"]
    prof = base_prof.model_copy(update={
        "matmul_half_rows": 30.0, "matmul_half_rows_in_out": 6.0, "compute_efficiency": 1.0,
        "peak_tflops": base_prof.peak_tflops.model_copy(update={"fp32": 0.1})})
    lin, conv = _product(32, False), _product(32, True)
    base = 2 * 32 * 512 * 1536 / 1e11
    assert half_rows(lin, prof) == 30.0 and half_rows(conv, prof) == 6.0
    assert compute_time_s(lin, prof) == pytest.approx(base * (32 + 30) / 32, rel=1e-12)
    assert compute_time_s(conv, prof) == pytest.approx(base * (32 + 6) / 32, rel=1e-12)
    # a profile without the layout's own h prices both layouts alike
    alike = prof.model_copy(update={"matmul_half_rows_in_out": None})
    assert compute_time_s(conv, alike) == compute_time_s(lin, alike) == pytest.approx(base * 62 / 32)
    # and a profile with no small-M term at all leaves both at the full rate
    flat = prof.model_copy(update={"matmul_half_rows": None, "matmul_half_rows_in_out": None})
    assert compute_time_s(conv, flat) == pytest.approx(base)


GAPS = SmallMGaps(inner=[256, 1024], out_in=[0.0, 40.0], in_out=[30.0, 30.0])


def test_with_gaps_each_product_takes_h_less_its_layouts_gap_at_its_inner_size() -> None:
    base_prof = builtin_profiles()["host-cpu"]
    prof = base_prof.model_copy(update={
        "matmul_half_rows": 50.0, "matmul_half_rows_in_out": 6.0, "matmul_small_m_gaps": GAPS,
        "compute_efficiency": 1.0, "peak_tflops": base_prof.peak_tflops.model_copy(update={"fp32": 0.1})})
    assert inner_size(_product(32, False, k=768)) == 768.0 and inner_size(_product(1, True, k=96)) == 96.0
    # [out, in]: 0 rows off at K <= 256, 40 from K = 1024, 20 halfway between them in log K (512)
    assert half_rows(_product(32, False, k=128), prof) == 50.0
    assert half_rows(_product(32, False, k=256), prof) == 50.0
    assert half_rows(_product(32, False, k=512), prof) == pytest.approx(30.0, rel=1e-12)
    assert half_rows(_product(32, False, k=1024), prof) == 10.0
    assert half_rows(_product(32, False, k=4096), prof) == 10.0
    # [in, out]: 30 off at every size (the table takes the place of matmul_half_rows_in_out)
    assert half_rows(_product(32, True, k=512), prof) == 20.0
    base = 2 * 32 * 512 * 1536 / 1e11
    assert compute_time_s(_product(32, False, k=512), prof) == pytest.approx(base * (32 + 30) / 32, rel=1e-12)
    assert compute_time_s(_product(32, True, k=512), prof) == pytest.approx(base * (32 + 20) / 32, rel=1e-12)
    # a gap beyond h leaves no slowdown, never a speed-up; no h at all: none
    assert half_rows(_product(32, False, k=1024), prof.model_copy(update={"matmul_half_rows": 25.0})) == 0.0
    assert half_rows(_product(32, False, k=256), prof.model_copy(update={"matmul_half_rows": None})) == 0.0
    # a negative gap (a slower kernel than the median's) adds to h
    slower = prof.model_copy(update={"matmul_small_m_gaps": SmallMGaps(inner=[512], out_in=[-8.0], in_out=[0.0])})
    assert half_rows(_product(32, False, k=64), slower) == 58.0


def test_with_an_anchor_each_product_keeps_the_share_of_h_its_kernel_measured() -> None:
    # the ladder measured h = 80 at the anchor: a kernel that measured 20 keeps a quarter of the fitted h
    base_prof = builtin_profiles()["host-cpu"]
    gaps = SmallMGaps(inner=[256, 1024], out_in=[0.0, 60.0], in_out=[40.0, 90.0], anchor=80.0)
    prof = base_prof.model_copy(update={
        "matmul_half_rows": 100.0, "matmul_small_m_gaps": gaps,
        "compute_efficiency": 1.0, "peak_tflops": base_prof.peak_tflops.model_copy(update={"fp32": 0.1})})
    assert gaps.scale(256, False) == 1.0 and gaps.scale(1024, False) == 0.25 and gaps.scale(4096, True) == 0.0
    # a kernel measured slower than the anchor keeps h whole: a small anchor must not multiply noise
    slower = gaps.model_copy(update={"out_in": [-20.0, 60.0]})
    assert slower.scale(256, False) == 1.0 and slower.half_rows(100.0, 200, False) == 100.0
    assert half_rows(_product(32, False, k=128), prof) == 100.0
    assert half_rows(_product(32, False, k=1024), prof) == pytest.approx(25.0, rel=1e-12)
    # halfway in log K (512): a gap of 30 rows, 50 measured of 80
    assert half_rows(_product(32, False, k=512), prof) == pytest.approx(62.5, rel=1e-12)
    assert half_rows(_product(32, True, k=256), prof) == pytest.approx(50.0, rel=1e-12)
    # a measured h at or below 0 rows: no slowdown, never a speed-up
    assert half_rows(_product(32, True, k=2048), prof) == 0.0
    base = 2 * 32 * 512 * 1536 / 1e11
    assert compute_time_s(_product(32, False, k=512), prof) == pytest.approx(base * (32 + 62.5) / 32, rel=1e-12)
    # the anchor must be a slowdown: a table with none subtracts its gaps
    with pytest.raises(ValueError, match="anchor"):
        SmallMGaps(inner=[256], out_in=[0.0], in_out=[0.0], anchor=0.0)
    assert gaps.model_copy(update={"anchor": None}).half_rows(100.0, 1024, False) == 40.0


def test_the_gaps_are_checked_and_round_trip_through_the_profile_yaml() -> None:
    from perfsdk.hardware.profile import load_profile_file, profile_to_yaml

    prof = builtin_profiles()["host-cpu"].model_copy(update={"matmul_half_rows": 50.0,
                                                             "matmul_small_m_gaps": GAPS})
    again = HardwareProfile.model_validate(yaml.safe_load(profile_to_yaml(prof)))
    assert again.matmul_small_m_gaps == GAPS
    with pytest.raises(ValueError, match=r"one gap per inner size \(2\), got 1 and 2"):
        SmallMGaps(inner=[256, 1024], out_in=[0.0], in_out=[1.0, 2.0])
    with pytest.raises(ValueError, match="inner sizes must be positive and ascending"):
        SmallMGaps(inner=[1024, 256], out_in=[0.0, 1.0], in_out=[1.0, 2.0])
    bad = profile_to_yaml(prof).replace("- 1024.0", "- 100.0")
    path = Path(tempfile.mkdtemp()) / "bad.yaml"
    path.write_text(bad)
    with pytest.raises(HardwareProfileError, match="matmul_small_m_gaps"):
        load_profile_file(path)


def _ladder(h: dict[tuple[str, int], dict[int, float]], per_row: dict[int, float] | None = None) -> list[Observation]:
    """The layout ladder of a machine whose products of R rows at inner size K take ``(R + h)``
    rows' time, ``h[(layout, K)][R]`` (the largest row count: ``R`` rows' time)."""
    out = []
    big = max(LAYOUT_ROWS)
    for k in LAYOUT_INNER:
        unit = (per_row or {}).get(k, 1e-6 * k / 256)
        for r in LAYOUT_ROWS:
            for layout in ("[out, in]", "[in, out]"):
                extra = h[(layout, k)][r] if r < big else 0.0
                label, of = ladder_label(layout, r, k), ladder_label("[out, in]", big, k)
                out.append(Observation(label, "micro", (r + extra) * unit, np.array([2.0 * r * LAYOUT_OUT * k]),
                                       np.array([4.0 * LAYOUT_OUT * k]), np.ones(1), 0.0, np.array([float(r)]),
                                       calls=1.0, unit=of if label != of else None))
    return out


def _flat(oi: dict[int, float], io: dict[int, float]) -> dict[tuple[str, int], dict[int, float]]:
    return {**{("[out, in]", k): dict.fromkeys(LAYOUT_ROWS[:-1], v) for k, v in oi.items()},
            **{("[in, out]", k): dict.fromkeys(LAYOUT_ROWS[:-1], v) for k, v in io.items()}}


def test_the_ladder_products_are_read_against_the_large_product_of_their_inner_size() -> None:
    ladder = _layout_products(lambda fn: 1e-3)  # the labels and units only: nothing timed
    assert len(ladder) == 2 * len(LAYOUT_INNER) * len(LAYOUT_ROWS)
    assert ladder[0].label == "micro layout [out, in]: 16 rows over [1152, 256] fp32"
    units = {ob.label: ob.unit for ob in ladder}
    assert units[ladder_label("[in, out]", 32, 768)] == "micro layout [out, in]: 256 rows over [1152, 768] fp32"
    assert units[ladder_label("[in, out]", 256, 768)] == ladder_label("[out, in]", 256, 768)
    assert [k for k in LAYOUT_INNER if units[ladder_label("[out, in]", 256, k)] is None] == list(LAYOUT_INNER)


def test_repeated_ladders_are_merged_by_their_ratios_within_each_timing() -> None:
    # three timings of a machine whose products keep h = 12 rows ([out, in]) and 6 ([in, out]):
    # the first at 0.8 times the speed, the second at 1.2, the third at 1.0 for the small products
    # and 1.5 for the large one timed after them (the machine slowed down within the timing)
    h = _flat(dict.fromkeys(LAYOUT_INNER, 12.0), dict.fromkeys(LAYOUT_INNER, 6.0))
    runs: list[tuple[list[Observation], int]] = []
    for small, large in ((0.8, 0.8), (1.2, 1.2), (1.0, 1.5)):
        timing = _ladder(h)
        for ob in timing:
            ob.measured_s *= small if ob.unit is not None else large
        runs.append((timing, -1))
    merged = median_micro(runs, None, 1.0)
    assert ladder_half_rows(merged) == pytest.approx(
        {**{("[out, in]", float(k)): 12.0 for k in LAYOUT_INNER}, **{("[in, out]", float(k)): 6.0 for k in LAYOUT_INNER}})
    # the large products keep their own medians (1.2 times): 256 rows of 4 ns per unit of K
    assert merged[-2].label == ladder_label("[out, in]", 256, 1024)
    assert merged[-2].measured_s == pytest.approx(1.2 * 256 * 4e-6)
    # each time's median taken apart: the small products' from the third timing, the large one's
    # from the second, so the [out, in] 32 rows read (32 + 12) / 1.2 - 32 rows: 4.67
    for timing, _ in runs:
        for ob in timing:
            ob.unit = None
    apart = ladder_half_rows(median_micro(runs, None, 1.0))
    assert apart[("[out, in]", 384.0)] == pytest.approx(44 / 1.2 - 32)
    assert apart[("[in, out]", 384.0)] == pytest.approx(38 / 1.2 - 32)


def test_the_layout_ladder_measures_h_by_layout_and_inner_size() -> None:
    assert LAYOUT_ROWS == (16, 32, 48, 256) and LAYOUT_OUT == 1152 and LAYOUT_INNER == (256, 384, 512, 768, 1024)
    # two threads on the x86 host: a slow [out, in] kernel up to K = 512, a fast one beyond
    h = _flat({256: 80.0, 384: 90.0, 512: 85.0, 768: 15.0, 1024: 20.0}, dict.fromkeys(LAYOUT_INNER, 10.0))
    h[("[in, out]", 384)] = {16: 40.0, 32: 4.0, 48: 12.0}  # the median over the small row counts
    measured = ladder_half_rows(_ladder(h))
    assert measured[("[out, in]", 384.0)] == pytest.approx(90.0, rel=1e-9)
    assert measured[("[in, out]", 384.0)] == pytest.approx(12.0, rel=1e-9)
    gaps = small_m_gaps(_ladder(h))
    assert gaps is not None and gaps.inner == [256.0, 384.0, 512.0, 768.0, 1024.0]
    # taken from the median [out, in] h (80), the anchor: slower kernels get a negative gap
    assert gaps.anchor == pytest.approx(80.0, rel=1e-9)
    assert gaps.out_in == pytest.approx([0.0, -10.0, -5.0, 65.0, 60.0], rel=1e-9)
    assert gaps.in_out == pytest.approx([70.0, 68.0, 70.0, 70.0, 70.0], rel=1e-9)
    # a ladder with no slowdown at its median keeps the gaps to subtract, no anchor
    flat = small_m_gaps(_ladder(_flat({256: 3.0, 384: -2.0, 512: 0.0, 768: -1.0, 1024: 5.0},
                                      dict.fromkeys(LAYOUT_INNER, 1.0))))
    assert flat is not None and flat.anchor is None and flat.out_in == pytest.approx([-3.0, 2.0, 0.0, 1.0, -5.0])
    # one layout missing at a row count, or no ladder at all: not measured
    assert small_m_gaps(_ladder(h)[1:]) is None and small_m_gaps([]) is None and ladder_half_rows([]) == {}


def test_the_fit_prices_each_product_with_its_gap_and_the_profile_does_the_same() -> None:
    obs, lists = _observations(np.random.default_rng(3))
    h_true = TRUTH["s_per_row_flop"] / TRUTH["s_per_flop"]  # 7.3
    ladder = _ladder(_flat({256: 9.0, 384: 10.0, 512: 10.0, 768: 6.0, 1024: 4.0}, dict.fromkeys(LAYOUT_INNER, 7.0)))
    table = small_m_gaps(ladder)
    assert table is not None and table.out_in == pytest.approx([0.0, -1.0, -1.0, 3.0, 5.0])
    assert table.in_out == pytest.approx([2.0] * 5) and table.anchor == 9.0
    truth = np.array([TRUTH[p] for p in PARAMS])
    for o in obs:  # the machine: each product at the share of h its kernel measured
        o.small_m_gaps = table
        o.measured_s = o.predict(truth)
        o.small_m_gaps = None
    res, kept = fit_with_micro(ladder, obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert kept == []  # the ladder is not fitted as observations
    assert res.small_m_gaps == table and all(o.small_m_gaps == table for o in obs)
    assert res.matmul_half_rows == pytest.approx(h_true, rel=1e-6)
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_small_m_gaps == table and prof.matmul_half_rows_in_out is None
    assert prof.calibration is not None and prof.calibration.small_m_gaps == table
    x = np.array([res.coefficients[p] for p in PARAMS])
    for rows in (16, 64, 300):
        for k in (128, 300, 512, 900, 2048):
            ops = [_product(rows, True, k=k), _product(rows, False, k=k)]
            ob = Observation.from_ops("mixed", "prefill", 1.0, ops)
            ob.small_m_gaps = table
            simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
            assert ob.predict(x) == pytest.approx(simulated, rel=1e-9), (rows, k)
    # K = 1024 [out, in]: 4 of the anchor's 9 rows measured, so 4/9 of h; [in, out] everywhere 7/9
    assert compute_time_s(_product(64, False, k=1024), prof) / compute_time_s(_product(64, True, k=1024), prof) \
        == pytest.approx((64 + h_true * 4 / 9) / (64 + h_true * 7 / 9), rel=1e-6)
    # the same data fitted with the gaps subtracted instead (a table without its anchor) misses h
    plain = table.model_copy(update={"anchor": None})
    for o in obs:
        o.small_m_gaps = plain
    other, _ = fit_with_micro([], obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert other.matmul_half_rows != pytest.approx(h_true, rel=1e-3)
    # no ladder: every product alike
    none, _ = fit_with_micro([], obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert none.small_m_gaps is None and profile_from_fit(none, name="n").matmul_small_m_gaps is None


def test_the_anchor_is_the_h_the_ladder_measured_at_the_calibrations_own_products() -> None:
    """Two threads on the x86 host: the ladder's median [out, in] h (15 rows, at K = 768) is not
    that of the products the models run (K = 512, 25 rows); taken from theirs, a K = 768 product
    keeps 15/25 of the fitted h rather than all of it."""
    h = _flat({256: 10.0, 384: 12.0, 512: 25.0, 768: 15.0, 1024: 20.0}, dict.fromkeys(LAYOUT_INNER, 8.0))
    ladder = small_m_gaps(_ladder(h))
    assert ladder is not None and ladder.anchor == pytest.approx(15.0, rel=1e-9)
    # the models: three 512-wide products of 32 rows, the MLP's way out at K = 1408 (held at 1024's
    # 20 rows), a Conv1D one; FLOPs per row 2 * K * N weigh each
    ops = [_product(32, False, k=512, n=1536), _product(32, False, k=512, n=512), _product(32, False, k=512, n=512),
           _product(32, False, k=1408, n=512), _product(32, True, k=256, n=256)]
    models = [Observation.from_ops("model", "prefill", 1.0, ops)]
    table = anchored_on_products(ladder, models)
    assert table is not None and table.anchor == pytest.approx(25.0, rel=1e-9)
    # each size's own h is what it was: only the rows it is taken from moved
    for k in (256, 512, 768, 1024, 2048):
        for io in (False, True):
            assert table.anchor - table.gap(k, io) == pytest.approx(ladder.anchor - ladder.gap(k, io), abs=1e-9)
    assert table.scale(768, False) == pytest.approx(15.0 / 25.0) and table.scale(512, False) == pytest.approx(1.0)
    assert ladder.scale(768, False) == pytest.approx(1.0)  # before: all of the fitted h
    # the weights follow the FLOPs per row: with the 1408-wide product four times over, it leads
    heavy = [Observation.from_ops("model", "prefill", 1.0, ops[:1] + [ops[3]] * 4)]
    assert anchored_on_products(ladder, heavy).anchor == pytest.approx(20.0, rel=1e-9)  # type: ignore[union-attr]
    # products the small-M term leaves alone (fewer than 4 * pack_rows rows) do not count
    decode = [Observation.from_ops("model", "decode", 1.0, [_product(2, False, k=512)])]
    assert anchored_on_products(ladder, decode, pack_rows=4.0) == ladder
    assert anchored_on_products(ladder, models + decode, pack_rows=4.0).anchor == pytest.approx(25.0)  # type: ignore[union-attr]
    # no anchor (gaps subtracted), no ladder, no products: unchanged
    plain = ladder.model_copy(update={"anchor": None})
    assert anchored_on_products(plain, models) == plain and anchored_on_products(None, models) is None
    assert anchored_on_products(ladder, []) == ladder


def test_the_calibration_says_what_the_ladder_measured() -> None:
    prof = builtin_profiles()["host-cpu"].model_copy(update={"matmul_half_rows": 50.0})
    gaps = SmallMGaps(inner=[256, 512, 1024], out_in=[-4.0, 0.0, 45.5], in_out=[41.0, 40.0, 60.0])
    assert small_m_text(gaps, prof) == (
        "small-M slowdown (rows + h) / rows by inner size K = 256, 512, 1024 (the layout ladder, products of 16-48 "
        "rows): h 54.0 50.0 4.5 over a weight stored [out, in] (a linear layer), 9.0 10.0 0.0 over one stored "
        "[in, out] (a Conv1D); fitted h 50.0")
    # with an anchor of 50 measured rows and a fitted h of 100, each product keeps twice what it
    # measured, at most the fitted h (K = 256 measured 54)
    anchored = gaps.model_copy(update={"anchor": 50.0})
    doubled = prof.model_copy(update={"matmul_half_rows": 100.0})
    assert ("h 100.0 100.0 9.0 over a weight stored [out, in] (a linear layer), 18.0 20.0 0.0 over one stored "
            "[in, out] (a Conv1D); fitted h 100.0") in small_m_text(anchored, doubled)
    flat = prof.model_copy(update={"matmul_half_rows": None})
    assert small_m_text(gaps, flat) == ("products of 16-48 rows measured at inner sizes 256, 512, 1024; no small-M "
                                        "slowdown fitted, so every product is priced alike")


def test_the_intervals_refit_h_of_each_product_less_its_gap_with_every_replicate() -> None:
    """Replicates that differ in h only: each product's cost moves with h less its gap, a
    record from before the gaps (``in_out_rows``) takes that gap off [in, out] products only."""
    x = np.array([{**TRUTH, "s_per_row_flop": 20 * TRUTH["s_per_flop"]}.get(p, 0.0) for p in PARAMS])
    reps = []
    for h in (10.0, 20.0, 30.0):
        r = x.copy()
        r[PARAMS.index("s_per_row_flop")] = h * TRUTH["s_per_flop"]
        reps.append(list(r))
    rows = 64
    flops = 2 * rows * 512 * 1536 * TRUTH["s_per_flop"]  # compute-bound: bytes take a tenth of that
    # the fixed part: one step, one op, the weight's stored rows (512 as [in, out], 1536 as [out, in])
    fixed = TRUTH["step_overhead_s"] + TRUTH["op_overhead_s"]

    def costs(h_of: Any, stored: int) -> list[float]:
        return [flops * (rows + h_of(h)) / rows + fixed + stored * TRUTH["s_per_weight_row"]
                for h in (10.0, 20.0, 30.0)]

    def less(gap: float) -> Any:
        return lambda h: max(0.0, h - gap)

    def share(f: float) -> Any:
        return lambda h: h * f

    table = SmallMGaps(inner=[256, 1024], out_in=[0.0, 16.0], in_out=[12.0, 12.0])
    anchored = table.model_copy(update={"anchor": 24.0})
    for cal, io_h, oi_h in (
            (CalibrationRecord(host="h", fitted_at="now", params=list(PARAMS), coefficients=list(x),
                               replicates=reps, small_m_gaps=table), less(12.0), less(8.0)),  # K = 512: 8 off [out, in]
            (CalibrationRecord(host="h", fitted_at="now", params=list(PARAMS), coefficients=list(x),
                               replicates=reps, small_m_gaps=anchored), share(0.5), share(16 / 24)),
            (CalibrationRecord(host="h", fitted_at="now", params=list(PARAMS), coefficients=list(x),
                               replicates=reps, in_out_rows=12.0), less(12.0), less(0.0))):
        ratios = replicate_ratios(cal, {"prefill": [_product(rows, True)], "decode": [_product(rows, False)]})
        io, lin = costs(io_h, 512), costs(oi_h, 1536)
        assert list(ratios["prefill"]) == pytest.approx([t / io[1] for t in io], rel=1e-9)
        assert list(ratios["decode"]) == pytest.approx([t / lin[1] for t in lin], rel=1e-9)

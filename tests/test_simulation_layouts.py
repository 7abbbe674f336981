"""The weight's layout in the small-M slowdown: which products read a weight stored [in, out]
(transformers' Conv1D) rather than [out, in] (a linear layer), the calibration's layout ladder
that measures how many rows of the slowdown such a product runs without, and the cost model,
the fit and the intervals that price it alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perfsdk.capture.ops import OpRecord
from perfsdk.capture.recorder import OperationCapture
from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.hardware.profile import CalibrationRecord
from perfsdk.simulation.calibration import Observation, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS
from perfsdk.simulation.calibration.measure import (LAYOUT_ROWS, LAYOUT_WEIGHT, _LAYOUT, fit_with_micro,
                                                    in_out_rows, in_out_text)
from perfsdk.simulation.costmodel import compute_time_s, cost_op, half_rows
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


def _ladder(gaps: dict[int, float], h: float = 40.0, per_row: float = 2e-6) -> list[Observation]:
    """The layout ladder of a machine whose [out, in] products take ``(R + h)`` rows' time and
    whose [in, out] ones ``gaps[R]`` rows less (the largest row count: both ``R`` rows)."""
    n, k = LAYOUT_WEIGHT
    out = []
    big = max(LAYOUT_ROWS)
    for r in LAYOUT_ROWS:
        t_lin = (r + (h if r < big else 0.0)) * per_row
        for layout, t in (("[out, in]", t_lin), ("[in, out]", t_lin - (gaps[r] if r < big else 0.0) * per_row)):
            out.append(Observation(f"{_LAYOUT} {layout}: {r} rows over [{n}, {k}] fp32", "micro", t,
                                   np.array([2.0 * r * n * k]), np.array([4.0 * n * k]), np.ones(1), 0.0,
                                   np.array([float(r)]), calls=1.0))
    return out


def test_the_layout_ladder_measures_the_rows_an_in_out_product_runs_without() -> None:
    assert LAYOUT_ROWS == (16, 32, 48, 256) and LAYOUT_WEIGHT == (1152, 384)
    assert in_out_rows(_ladder({16: 24.0, 32: 24.0, 48: 24.0})) == pytest.approx(24.0)
    # the median over the small row counts
    assert in_out_rows(_ladder({16: 70.0, 32: 30.0, 48: 12.0})) == pytest.approx(30.0)
    # an [in, out] product slower than the [out, in] one: a negative gap, said as it is
    assert in_out_rows(_ladder({16: -5.0, 32: -4.0, 48: -6.0})) == pytest.approx(-5.0)
    # one layout missing at a row count, or no ladder at all: not measured
    ladder = _ladder({16: 24.0, 32: 24.0, 48: 24.0})
    assert in_out_rows(ladder[1:]) is None and in_out_rows([]) is None


def test_the_fit_keeps_the_gap_and_the_profile_prices_in_out_products_as_the_fit_does() -> None:
    obs, lists = _observations(np.random.default_rng(3))
    h_true = TRUTH["s_per_row_flop"] / TRUTH["s_per_flop"]  # 7.3
    res, kept = fit_with_micro(_ladder({16: 5.0, 32: 5.0, 48: 5.0}), obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert kept == []  # the ladder is not fitted as observations
    assert res.in_out_rows == pytest.approx(5.0)
    assert res.matmul_half_rows == pytest.approx(h_true, rel=1e-6)  # no [in, out] product among them
    prof = profile_from_fit(res, name="fitted")
    assert prof.matmul_half_rows_in_out == pytest.approx(h_true - 5.0, rel=1e-6)
    assert prof.calibration is not None and prof.calibration.in_out_rows == pytest.approx(5.0)
    # an [in, out] product priced by the profile and by the fit's observation: one model
    x = np.array([res.coefficients[p] for p in PARAMS])
    for rows in (16, 64, 300):
        ops = [_product(rows, True), _product(rows, False)]
        ob = Observation.from_ops("mixed", "prefill", 1.0, ops)
        ob.in_out_rows = res.in_out_rows or 0.0
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert ob.predict(x) == pytest.approx(simulated, rel=1e-9), rows
        # the [in, out] product costs (R + h - gap) / (R + h) of the [out, in] one's compute
        assert compute_time_s(ops[0], prof) / compute_time_s(ops[1], prof) == pytest.approx(
            (rows + h_true - 5.0) / (rows + h_true), rel=1e-6)
    # a gap beyond h: no slowdown left, never a speed-up
    big, _ = fit_with_micro(_ladder({16: 20.0, 32: 20.0, 48: 20.0}), obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert profile_from_fit(big, name="big").matmul_half_rows_in_out == 0.0
    # no ladder: both layouts alike
    none, _ = fit_with_micro([], obs, cache_bytes=(0.0,), pack_rows=(0.0,))
    assert none.in_out_rows is None and profile_from_fit(none, name="n").matmul_half_rows_in_out is None


def test_the_calibration_says_what_the_ladder_measured() -> None:
    prof = builtin_profiles()["host-cpu"].model_copy(update={"matmul_half_rows": 26.0,
                                                             "matmul_half_rows_in_out": 14.5})
    assert in_out_text(11.5, prof) == (
        "a product of 16-48 rows over a weight stored [in, out] (a Conv1D) ran 11.5 rows' time faster than over one "
        "stored [out, in] (a linear layer), median over the row counts; small-M slowdown (rows + h) / rows: h 26.0 "
        "for [out, in], 14.5 for [in, out]")
    flat = prof.model_copy(update={"matmul_half_rows": None, "matmul_half_rows_in_out": None})
    assert in_out_text(-2.0, flat).endswith("ran 2.0 rows' time slower than over one stored [out, in] (a linear "
                                            "layer), median over the row counts; no small-M slowdown fitted, so "
                                            "both layouts are priced alike")


def test_the_intervals_refit_h_of_in_out_products_with_every_replicate() -> None:
    """Replicates that differ in h only: an [in, out] product's cost moves with h less the gap,
    the [out, in] one's with h."""
    x = np.array([{**TRUTH, "s_per_row_flop": 20 * TRUTH["s_per_flop"]}.get(p, 0.0) for p in PARAMS])
    reps = []
    for h in (10.0, 20.0, 30.0):
        r = x.copy()
        r[PARAMS.index("s_per_row_flop")] = h * TRUTH["s_per_flop"]
        reps.append(list(r))
    cal = CalibrationRecord(host="h", fitted_at="now", params=list(PARAMS), coefficients=list(x), replicates=reps,
                            in_out_rows=12.0)
    rows = 64
    ratios = replicate_ratios(cal, {"prefill": [_product(rows, True)], "decode": [_product(rows, False)]})
    flops = 2 * rows * 512 * 1536 * TRUTH["s_per_flop"]  # compute-bound: bytes take a tenth of that
    # the fixed part: one step, one op, the weight's stored rows (512 as [in, out], 1536 as [out, in])
    fixed = TRUTH["step_overhead_s"] + TRUTH["op_overhead_s"]
    io = [flops * (rows + max(0.0, h - 12.0)) / rows + fixed + 512 * TRUTH["s_per_weight_row"]
          for h in (10.0, 20.0, 30.0)]
    lin = [flops * (rows + h) / rows + fixed + 1536 * TRUTH["s_per_weight_row"] for h in (10.0, 20.0, 30.0)]
    assert list(ratios["prefill"]) == pytest.approx([t / io[1] for t in io], rel=1e-9)
    assert list(ratios["decode"]) == pytest.approx([t / lin[1] for t in lin], rel=1e-9)

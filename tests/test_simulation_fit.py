"""The calibration fit: the small-M slowdown, the attention softmax and the cost per weight row
fitted as coefficients, the robust weighting, and decode times taken step by step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.profile import HardwareProfile
from perfsdk.simulation.calibration import (PARAMS, Measurement, Observation, fit, measure_generate, pass_drift_pct,
                                            profile_from_fit)
from perfsdk.simulation.costmodel import cost_op


def _linear(rows: int, k: int, n: int, step: int, in_out: bool = False) -> OpRecord:
    w = k * n * 4
    return OpRecord(module_path=f"l{k}x{n}", op="linear", category="matmul", phase="decode", step=step,
                    dtype="float32", input_shapes=[(rows, k)], output_shape=(rows, n), flops=2 * rows * k * n,
                    macs=rows * k * n, weight_bytes=w, bytes_read=w + rows * k * 4, bytes_written=rows * n * 4,
                    elements=rows * n, weight_rows=k if in_out else None)


def _attention(queries: int, keys: int, heads: int, step: int) -> OpRecord:
    hd = 16
    kv = keys * heads * 2 * hd * 4
    return OpRecord(module_path="attn", op="scaled_dot_product_attention", category="attention", phase="decode",
                    step=step, dtype="float32", input_shapes=[(1, heads, queries, hd)],
                    output_shape=(1, heads, queries, hd), flops=2 * heads * queries * keys * 2 * hd,
                    macs=heads * queries * keys * 2 * hd, bytes_read=heads * queries * hd * 4 + kv, kv_bytes=kv,
                    bytes_written=heads * queries * hd * 4, elements=heads * queries * keys)


def _add(n: int, step: int) -> OpRecord:
    return OpRecord(module_path="add", op="add", category="elementwise", phase="decode", step=step, dtype="float32",
                    input_shapes=[(n,), (n,)], output_shape=(n,), bytes_read=8 * n, bytes_written=4 * n, elements=n)


TRUTH = {"s_per_flop": 1e-11, "s_per_byte": 2.5e-11, "op_overhead_s": 5e-6, "step_overhead_s": 1e-4,
         "prefill_overhead_s": 0.0, "s_per_cached_byte": 0.0, "s_per_packed_byte": 0.0, "launch_overhead_s": 0.0,
         "s_per_row_flop": 7.3e-11, "s_per_score": 1.5e-9, "s_per_weight_row": 4e-8,
         "call_overhead_s": 0.0, "s_per_fresh_byte": 0.0, "prefill_call_overhead_s": 0.0}


def _observations(rng: np.random.Generator, n: int = 24) -> tuple[list[Observation], list[list[OpRecord]]]:
    truth = np.array([TRUTH[p] for p in PARAMS])
    obs, lists = [], []
    for i in range(n):
        rows = int(rng.choice([1, 2, 4, 8, 32, 128, 512]))
        k, m = int(rng.choice([64, 256, 512])), int(rng.choice([128, 512, 1408]))
        ops = [_linear(rows, k, m, 0), _linear(rows, m, k, 0, in_out=i % 3 == 0),
               _attention(rows, int(rng.integers(8, 600)), 8, 0)]
        ops += [_add(rows * k, 0) for _ in range(int(rng.integers(1, 8)))]
        o = Observation.from_ops(f"o{i}", "decode", 1.0, ops)
        o.measured_s = o.predict(truth)
        obs.append(o)
        lists.append(ops)
    return obs, lists


def _packed_observations(seed: int, n: int = 30, **fields: Any
                         ) -> tuple[list[Observation], list[list[OpRecord]], np.ndarray]:
    """:func:`_observations`'s op lists measured as the cost model prices them with a repacking
    size of 1 and a repacking rate of 2e-11 s/byte, each observation with ``fields`` set first
    (say its ``pack_fast`` or ``few_rows``); and the true coefficients."""
    truth = np.array([{**TRUTH, "s_per_packed_byte": 2e-11}.get(p, 0.0) for p in PARAMS])
    _, lists = _observations(np.random.default_rng(seed), n=n)
    obs = []
    for i, ops in enumerate(lists):
        o = Observation.from_ops(f"o{i}", "decode", 1.0, ops)
        for name, value in fields.items():
            setattr(o, name, value)
        o.measured_s = o.predict(truth, pack_rows=1.0)
        obs.append(o)
    return obs, lists, truth


def test_fit_recovers_small_m_softmax_and_weight_row_terms_between_grid_points() -> None:
    obs, lists = _observations(np.random.default_rng(3))
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    # h = x_h / x_f = 7.3: no grid holds it, the linear fit recovers it exactly
    assert res.matmul_half_rows == pytest.approx(7.3, rel=1e-6)
    for name in ("s_per_flop", "s_per_byte", "op_overhead_s", "step_overhead_s", "s_per_row_flop", "s_per_score",
                 "s_per_weight_row"):
        assert res.coefficients[name] == pytest.approx(TRUTH[name], rel=1e-6), name
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    # the profile made from the fit costs every op as the fit did: the simulation and the
    # calibration share one model
    prof = profile_from_fit(res, name="fitted")
    assert isinstance(prof, HardwareProfile)
    assert prof.matmul_half_rows == pytest.approx(7.3, rel=1e-6)
    assert prof.softmax_ns_per_element == pytest.approx(1.5, rel=1e-6)
    assert prof.matmul_ns_per_weight_row == pytest.approx(40.0, rel=1e-6)
    for o, ops in zip(obs, lists):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)


def test_robust_fit_is_not_pulled_by_one_interrupted_measurement() -> None:
    obs, _ = _observations(np.random.default_rng(5), n=30)
    obs[4].measured_s *= 1.8  # measured while something else ran
    robust = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    plain = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), robust=None, weight_row_term=True)
    for name in ("s_per_flop", "s_per_byte", "s_per_row_flop", "s_per_score", "s_per_weight_row"):
        assert robust.coefficients[name] == pytest.approx(TRUTH[name], rel=0.02), name
    # the outlier keeps its error instead of spreading it over the others
    assert robust.errors_pct["o4"] == pytest.approx(100 * (1 / 1.8 - 1), abs=2.0)
    others = [abs(e) for k, e in robust.errors_pct.items() if k != "o4"]
    assert max(others) < 2.0
    worst_plain = max(abs(e) for k, e in plain.errors_pct.items() if k != "o4")
    assert worst_plain > max(others)


def test_fixed_small_m_values_are_still_accepted() -> None:
    obs, _ = _observations(np.random.default_rng(3))
    res = fit(obs, half_rows=(0.0, 8.0), cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    assert res.matmul_half_rows in (0.0, 8.0) and res.coefficients["s_per_row_flop"] == 0.0


def test_decode_steps_are_merged_step_by_step() -> None:
    a = Measurement("m", 1, 8, 4, ttft_s=0.010, decode_s=0.007, repeats=3, decode_steps_s=[0.001, 0.005, 0.001])
    b = Measurement("m", 1, 8, 4, ttft_s=0.012, decode_s=0.005, repeats=3, decode_steps_s=[0.002, 0.001, 0.002])
    m = a.merged(b)
    # neither call alone was this fast: each step keeps its own best
    assert m.decode_steps_s == [0.001, 0.001, 0.001]
    assert m.decode_s == pytest.approx(0.003) and m.ttft_s == 0.010 and m.repeats == 6
    assert m.tpot_s == pytest.approx(0.001)


def test_measure_generate_times_each_decode_step() -> None:
    from perfsdk.simulation.calibration import build_random_model

    model = build_random_model("builtin:tiny-llama-small@layers=1")
    m = measure_generate(model, 1, 8, 5, repeats=2, warmup=1)
    assert m.decode_steps_s is not None and len(m.decode_steps_s) == 4
    assert m.decode_s == pytest.approx(sum(m.decode_steps_s))
    assert all(t > 0 for t in m.decode_steps_s) and m.ttft_s > 0 and m.repeats == 2


def test_cheap_configurations_are_repeated_for_a_minimum_time() -> None:
    from perfsdk.simulation.calibration import build_random_model

    model = build_random_model("builtin:tiny-llama-small@layers=1")
    once = measure_generate(model, 1, 4, 2, repeats=1, warmup=1)
    assert once.repeats == 1
    timed = measure_generate(model, 1, 4, 2, repeats=1, warmup=1, min_time_s=0.05, max_repeats=40)
    # each call takes a few milliseconds: repeated until 50 ms were timed, or 40 calls
    assert 1 < timed.repeats <= 40


def test_weight_rows_follow_the_stored_layout() -> None:
    """A matrix-vector product pays the profile's cost per row of its weight as stored, on top
    of max(compute, memory): the output features of a linear layer ([out, in]), the input
    features of a Conv1D ([in, out]), and once for a fused Conv1D call whose parts share those rows."""
    from perfsdk.models.arch import architecture_from_config
    from perfsdk.simulation.analytic import forward_ops
    from perfsdk.simulation.costmodel import compute_time_s, cost_op, memory_time_s, pack_time_s, weight_rows
    from transformers import GPT2Config, LlamaConfig

    prof = HardwareProfile(name="p", kind="cpu", variant="test", source="test", memory_bandwidth_gbs=10.0,
                           memory_pj_per_bit=1.0,
                           peak_tflops={"fp32": 0.1}, compute_pj_per_flop=1.0, matmul_ns_per_weight_row=40.0)
    lin = _linear(1, 384, 1152, 0)
    conv = _linear(1, 384, 1152, 0, in_out=True)
    flop_s = 2 * 384 * 1152 / 0.1e12
    assert weight_rows(lin) == 1152 and weight_rows(conv) == 384
    assert compute_time_s(lin, prof) == pytest.approx(flop_s)
    assert pack_time_s(lin, prof) == pytest.approx(1152 * 40e-9)
    assert pack_time_s(conv, prof) == pytest.approx(384 * 40e-9)
    assert cost_op(lin, prof).time_s == pytest.approx(max(flop_s, memory_time_s(lin, prof)) + 1152 * 40e-9 + 0.0)
    assert weight_rows(_add(16, 0)) == 0

    gpt2 = architecture_from_config(GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=256, n_positions=64))
    rows = {o.module_path.rsplit(".", 1)[-1]: weight_rows(o)
            for o in forward_ops(gpt2, 1, 1, 8, "float32", "decode", 1) if o.category == "matmul" and o.weight_bytes}
    # c_attn [64, 192] is one call: its 64 rows once; c_proj [64, 64]; c_fc [64, 256]; the MLP's
    # c_proj [256, 64]; the lm_head is a linear layer [256 vocab, 64]
    assert rows == {"q_proj": 64, "k_proj": 0, "v_proj": 0, "o_proj": 64, "fc1": 64, "fc2": 256, "lm_head": 256}
    llama = architecture_from_config(LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=1,
                                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
    rows = {o.module_path.rsplit(".", 1)[-1]: weight_rows(o)
            for o in forward_ops(llama, 1, 1, 8, "float32", "decode", 1) if o.category == "matmul" and o.weight_bytes}
    assert rows == {"q_proj": 64, "k_proj": 32, "v_proj": 32, "o_proj": 64, "gate_proj": 176, "up_proj": 176,
                    "down_proj": 64, "lm_head": 256}


def test_a_term_no_observation_exercises_stays_zero() -> None:
    """Observations without matrix products with weights (stored runs of other ops, say) leave
    the cost per weight row unidentified: it stays 0 and the other coefficients are recovered."""
    obs, _ = _observations(np.random.default_rng(7))
    truth = np.array([0.0 if p == "s_per_weight_row" else TRUTH[p] for p in PARAMS])
    for o in obs:
        o.weight_rows = None
        o.measured_s = o.predict(truth)
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    assert res.coefficients["s_per_weight_row"] == 0.0
    for name in ("s_per_flop", "s_per_byte", "op_overhead_s", "s_per_row_flop", "s_per_score"):
        assert res.coefficients[name] == pytest.approx(TRUTH[name], rel=1e-6), name
    assert profile_from_fit(res, name="fitted").matmul_ns_per_weight_row is None


def _m(total_s: float) -> Measurement:
    return Measurement(model="m", batch_size=1, input_tokens=8, output_tokens=3, ttft_s=total_s / 2,
                       decode_s=total_s / 2, repeats=1)


def test_pass_drift_is_the_median_level_of_the_slowest_pass_over_the_fastest() -> None:
    # each configuration's pass times over its fastest pass: A 1.0 1.1 1.0, B 1.0 1.1 1.2, C 1.0 1.0 1.5;
    # pass levels (medians) 1.0, 1.1, 1.2: the slowest pass ran 20 % slower than the fastest
    runs = [[_m(2.0), _m(2.2), _m(2.0)], [_m(4.0), _m(4.4), _m(4.8)], [_m(1.0), _m(1.0), _m(1.5)]]
    assert pass_drift_pct(runs) == pytest.approx(20.0)
    # one configuration meeting a busy moment in a pass does not move that pass's level
    runs[2][1] = _m(10.0)
    assert pass_drift_pct(runs) == pytest.approx(20.0)
    # a machine steady throughout: 0; fewer than two passes: not measured
    assert pass_drift_pct([[_m(1.0), _m(1.0)], [_m(3.0), _m(3.0)]]) == pytest.approx(0.0)
    assert pass_drift_pct([[_m(1.0)], [_m(2.0)]]) is None
    assert pass_drift_pct([]) is None


def test_profile_source_states_the_drift_and_calibrate_warns_above_five_percent(capsys: pytest.CaptureFixture[str]) -> None:
    from perfsdk.cli.simulate import _warn_drift

    obs, _ = _observations(np.random.default_rng(5), 12)
    res = fit(obs, cache_bytes=None, pack_rows=None, weight_row_term=True)
    assert res.drift_pct is None  # fitted from given observations: no passes to compare
    res.drift_pct = 7.25
    prof = profile_from_fit(res)
    assert "ran 7.2 % slower in the calibration's slowest pass than in its fastest" in prof.source
    _warn_drift(7.25)
    err = capsys.readouterr().err
    assert err.startswith("warning: this machine's speed moved while calibrating (passes: the same configurations "
                          "ran 7.2 % slower in the slowest pass than in the fastest)")
    assert err.endswith("Calibrate with nothing else running, or with --threads 1 on a shared machine\n")
    _warn_drift(7.25, isolated=True)  # already one thread: no advice to use it
    assert capsys.readouterr().err.endswith("may differ by as much. Calibrate with nothing else running\n")
    # with the reference workload: the drift that remains after normalising decides
    _warn_drift(12.0, 2.5)
    assert capsys.readouterr().err == ("passes: the same configurations ran 12.0 % slower in the slowest pass than "
                                       "in the fastest; 2.5 % once each was divided by the reference workload timed "
                                       "around it\n")
    _warn_drift(12.0, 2.5, tracking=0.8)
    assert capsys.readouterr().err == ("passes: the same configurations ran 12.0 % slower in the slowest pass than "
                                       "in the fastest; 2.5 % once each was divided by the reference workload timed "
                                       "around it (to the power 0.80: how closely the passes followed it)\n")
    _warn_drift(12.0, 6.0)
    assert capsys.readouterr().err.startswith("warning: this machine's speed moved while calibrating (passes: the "
                                              "same configurations ran 12.0 % slower")
    _warn_drift(3.0)
    assert capsys.readouterr().err == ("passes: the same configurations ran 3.0 % slower in the slowest pass than "
                                       "in the fastest\n")
    # more passes than asked for were run: said first
    _warn_drift(6.0, 2.0, passes=(3, 5))
    assert capsys.readouterr().err == ("passes: 5 (2 more than 3: the median pass did not yet rest on three that agree "
                                       "within 3 %); the same configurations ran 6.0 % slower in the slowest pass "
                                       "than in the fastest; 2.0 % once each was divided by the reference workload "
                                       "timed around it\n")
    _warn_drift(6.0, 2.0, passes=(3, 3))
    assert capsys.readouterr().err.startswith("passes: the same configurations ran 6.0 %")
    _warn_drift(None)
    assert capsys.readouterr().err == ""


def _stream(rate_s_per_byte: float) -> Observation:
    n = 3 * 64 * 1024 * 1024 * 4
    return Observation("micro add", "micro", n * rate_s_per_byte, np.zeros(1), np.array([float(n)]), np.ones(1), 0.0,
                       np.array([np.inf]))


def test_the_streaming_micro_kernel_anchors_the_memory_rate_only_where_the_models_leave_it_open() -> None:
    from perfsdk.simulation.calibration import fit_with_micro

    # models that identify the memory rate: a stream twice as fast is left out of the fit
    # (one long stream reaches a bandwidth that many separate weight matrices do not)
    measured, _ = _observations(np.random.default_rng(3))
    kw = dict(cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    stream = _stream(TRUTH["s_per_byte"] / 2)
    res, used = fit_with_micro([stream], measured, **kw)
    assert used == []
    assert res.coefficients["s_per_byte"] == pytest.approx(TRUTH["s_per_byte"], rel=1e-6)
    assert "micro add" not in res.errors_pct
    # models that move no bytes (fixed costs only) leave it open: then the stream sets it
    fixed_costs = []
    for i in range(6):
        ops, passes = 10.0 * (i + 1) + i * i, float(i + 1)
        fixed_costs.append(Observation(f"f{i}", "decode", ops * 5e-6 + passes * 1e-4, np.zeros(1), np.zeros(1),
                                       np.ones(1), passes, np.array([np.inf]), ops=ops))
    res, used = fit_with_micro([stream], fixed_costs, **kw)
    assert used == [stream]
    assert res.coefficients["s_per_byte"] == pytest.approx(TRUTH["s_per_byte"] / 2, rel=1e-6)
    assert res.coefficients["op_overhead_s"] == pytest.approx(5e-6, rel=1e-6)


def test_the_small_m_fit_starts_from_several_values_and_keeps_the_best_fixed_point(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    fit_module = importlib.import_module("perfsdk.simulation.calibration.fit")

    # a slow memory and h = 8: started only from the additive model (h = 0), the alternating
    # fit settles at another labelling of the batched products with h near 21 and a 1.8 %
    # loss; started also from the fits at h = 4, 16 and 64, it recovers the truth exactly
    monkeypatch.setitem(TRUTH, "s_per_byte", 1e-10)
    monkeypatch.setitem(TRUTH, "s_per_row_flop", 8.0 * TRUTH["s_per_flop"])
    obs, _ = _observations(np.random.default_rng(0))
    kw = dict(fit_step_overhead=True, max_iter=30, robust=0.1, weight_row_term=True)
    once = fit_module._fit_once(obs, None, 0.0, 0.0, **kw)
    assert once.matmul_half_rows == pytest.approx(20.9, abs=0.1)
    assert max(abs(e) for e in once.errors_pct.values()) > 5.0
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    assert fit_module.HALF_ROWS_STARTS == (4.0, 16.0, 64.0)
    assert res.matmul_half_rows == pytest.approx(8.0, rel=1e-6)
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    # the bootstrap refits go through the same starts
    x = fit_module._refit(res, obs, fit_step_overhead=True, robust=0.1)
    assert x[PARAMS.index("s_per_row_flop")] / x[PARAMS.index("s_per_flop")] == pytest.approx(8.0, rel=1e-6)


def _cache_observations(cache_bytes: float, s_per_cached_byte: float) -> list[Observation]:
    """Observations of the synthetic truth with a cache of ``cache_bytes`` at that rate, without
    the cost per stored row (which the cache also takes off the rows it serves: a second sign of
    the cache, which these tests of its rate alone leave out)."""
    truth = np.array([TRUTH[p] for p in PARAMS])
    truth[PARAMS.index("s_per_cached_byte")] = s_per_cached_byte
    truth[PARAMS.index("s_per_weight_row")] = 0.0
    obs, _ = _observations(np.random.default_rng(7), n=30)
    for o in obs:
        o.measured_s = o.predict(truth, cache_bytes=cache_bytes)
    return obs


def test_a_cache_size_is_kept_only_where_it_lowers_the_loss_by_a_fifth() -> None:
    import importlib

    from perfsdk.simulation.calibration import CACHE_MIN_GAIN

    assert CACHE_MIN_GAIN == 0.2
    # the synthetic forward passes touch 0.3-6.2 MB: candidate caches of 1, 2 and 4 MB
    grid = (0.0, 1e6, 2e6, 4e6)
    # a cache four times faster than memory, 2 MB: the fit finds it and its rate
    fast = fit(_cache_observations(2e6, TRUTH["s_per_byte"] / 4), cache_bytes=grid, pack_rows=(0.0,))
    assert fast.cache_bytes == 2e6
    assert fast.coefficients["s_per_cached_byte"] == pytest.approx(TRUTH["s_per_byte"] / 4, rel=1e-6)
    assert profile_from_fit(fast).cache_mb == pytest.approx(2.0)
    # a cache barely faster than memory, measured with a few percent of noise: the best grid
    # point lowers the loss, by less than a fifth, and is not kept; the fit without one is
    obs = _cache_observations(2e6, TRUTH["s_per_byte"] * 0.9)
    noise = np.random.default_rng(11).normal(0.0, 0.03, len(obs))
    for o, e in zip(obs, noise):
        o.measured_s *= 1.0 + e
    fit_module = importlib.import_module("perfsdk.simulation.calibration.fit")
    loss = {c: fit_module._loss(np.array(list(fit(obs, cache_bytes=(c,), pack_rows=(0.0,)).errors_pct.values()))
                                / 100, 0.1) for c in grid}
    best = min(loss, key=loss.__getitem__)
    assert best > 0 and (1 - CACHE_MIN_GAIN) * loss[0.0] < loss[best] < loss[0.0]
    chosen = fit(obs, cache_bytes=grid, pack_rows=(0.0,))
    assert chosen.cache_bytes == 0.0
    assert profile_from_fit(chosen).cache_mb is None

"""Bytes a decode step writes into fresh memory (the KV cache concatenated one position longer):
which ops write them, what they cost, and the calibration's fit of their rate."""

from __future__ import annotations

import numpy as np
import pytest

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.simulation.calibration import PARAMS, Observation, fit, profile_from_fit
from perfsdk.simulation.costmodel import FRESH_MIN_BYTES, cost_op, fresh_bytes
from tests.test_simulation_fit import TRUTH, _observations

transformers = pytest.importorskip("transformers")


def _cat(batch: int, heads: int, ctx: int, head_dim: int, phase: str = "decode", step: int = 1,
         launches: int = 1, context_len: int | None = None) -> OpRecord:
    out = batch * heads * ctx * head_dim * 4
    return OpRecord(module_path="kv", op="aten.cat", category="other", phase=phase, step=step,  # type: ignore[arg-type]
                    dtype="float32", input_shapes=[(batch, heads, ctx - 1, head_dim), (batch, heads, 1, head_dim)],
                    output_shape=(batch, heads, ctx, head_dim), bytes_read=out, bytes_written=out * launches,
                    elements=batch * heads * ctx * head_dim, launches=launches,
                    context_len=ctx if context_len is None else context_len)


def test_a_decode_output_that_grows_with_the_context_is_written_into_fresh_memory() -> None:
    # [8, 8, 129, 64] fp32: 2,113,536 bytes, past the allocator's 128 KiB
    assert fresh_bytes(_cat(8, 8, 129, 64)) == 8 * 8 * 129 * 64 * 4
    # keys and values in one op of two calls: each tensor is judged by its own size
    assert fresh_bytes(_cat(8, 8, 129, 64, launches=2)) == 2 * 8 * 8 * 129 * 64 * 4
    assert fresh_bytes(_cat(1, 2, 40, 64, launches=2)) == 0  # 20 KiB a tensor: from the heap
    # under the threshold by one element's worth of rows, over it at the threshold itself
    assert fresh_bytes(_cat(1, 1, FRESH_MIN_BYTES // 256, 64)) == FRESH_MIN_BYTES
    assert fresh_bytes(_cat(1, 1, FRESH_MIN_BYTES // 256 - 1, 64)) == 0
    # the prefill, and a sliding-window cache that stays one size (its output is not the context)
    assert fresh_bytes(_cat(8, 8, 129, 64, phase="prefill", step=0)) == 0
    assert fresh_bytes(_cat(8, 8, 16, 64, context_len=129)) == 0


def test_the_fresh_bytes_cost_their_rate_on_top_of_the_memory_time() -> None:
    base = builtin_profiles()["host-cpu"]
    op = _cat(8, 8, 129, 64)
    plain = cost_op(op, base)
    assert plain.alloc_s == 0.0  # no rate, no cost: a catalogue profile is unchanged
    prof = base.model_copy(update={"fresh_write_gbs": 4.0})
    c = cost_op(op, prof)
    assert c.alloc_s == pytest.approx(8 * 8 * 129 * 64 * 4 / 4e9)
    assert c.time_s == pytest.approx(plain.time_s + c.alloc_s)


def test_captured_decode_steps_count_the_kv_cache_concatenations_of_full_attention_layers_only() -> None:
    from perfsdk.flops.meta import capture_generation_ops

    cfg = transformers.Gemma2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=64, sliding_window=16, vocab_size=512,
                                    max_position_embeddings=512)
    batch, prompt = 8, 128
    cap = capture_generation_ops(cfg, batch, prompt, 8, [4])
    step = [o for o in cap.ops if o.step == 4]
    ctx = prompt + 4
    fresh = [o for o in step if fresh_bytes(o)]
    # Gemma 2 alternates sliding-window and full layers: two full layers, each concatenating its
    # keys and values one position longer and repeating them for the 4 query heads (eager attention)
    cats = [o for o in fresh if o.op == "aten.cat"]
    assert len(cats) == 4
    assert all(fresh_bytes(o) == batch * 2 * ctx * 64 * 4 for o in cats)
    copies = [o for o in fresh if o.op != "aten.cat"]
    assert copies and all(fresh_bytes(o) == batch * 4 * ctx * 64 * 4 for o in copies)
    assert sum(fresh_bytes(o) for o in step) == 4 * batch * 2 * ctx * 64 * 4 + len(copies) * batch * 4 * ctx * 64 * 4


def test_the_fit_recovers_the_rate_of_fresh_memory() -> None:
    obs, lists = _observations(np.random.default_rng(5))
    truth_d = {**TRUTH, "s_per_fresh_byte": 2.5e-10}  # 4 GB/s
    truth = np.array([truth_d[p] for p in PARAMS])
    rng = np.random.default_rng(11)
    for i, (o, ops) in enumerate(zip(obs, lists)):
        if i % 3:  # two in three configurations grow a cache this large
            ops.append(_cat(int(rng.choice([2, 4, 8])), 8, int(rng.integers(64, 512)), 64, step=0))
        fresh = Observation.from_ops(o.label, "decode", 1.0, ops)
        assert fresh.fresh == sum(fresh_bytes(op) for op in ops)
        fresh.measured_s = fresh.predict(truth)
        obs[i] = fresh
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    assert res.coefficients["s_per_fresh_byte"] == pytest.approx(2.5e-10, rel=1e-6)
    assert res.coefficients["s_per_byte"] == pytest.approx(TRUTH["s_per_byte"], rel=1e-6)
    prof = profile_from_fit(res, name="fitted")
    assert prof.fresh_write_gbs == pytest.approx(4.0, rel=1e-6)
    for o, ops in zip(obs, lists):
        simulated = sum(cost_op(op, prof).time_s for op in ops) + prof.step_overhead_s
        assert simulated == pytest.approx(o.measured_s, rel=1e-6)


def test_without_growing_outputs_the_rate_stays_unset() -> None:
    obs, _ = _observations(np.random.default_rng(3))
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), weight_row_term=True)
    assert res.coefficients["s_per_fresh_byte"] == 0.0
    assert profile_from_fit(res, name="fitted").fresh_write_gbs is None

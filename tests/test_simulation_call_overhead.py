"""The fixed cost per ATen call of a calibrated host: the cost model, the fit that finds it from
captured ops, the predictions that count a model's own calls, and the weights a grouped
(mixture-of-experts) product reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perfsdk.capture.ops import OpRecord
from perfsdk.capture.recorder import OperationCapture, grouped_weight_share
from perfsdk.hardware.profile import HardwareProfile
from perfsdk.simulation.calibration import Observation, captured_observations_for, fit, profile_from_fit
from perfsdk.simulation.calibration.fit import PARAMS, per_call_fit
from perfsdk.simulation.calibration.measure import Measurement
from perfsdk.simulation.costmodel import cost_op, product_rows
from perfsdk.simulation.predictor import ANALYTIC_CALLS_NOTE, simulate_config, simulate_model

transformers = pytest.importorskip("transformers")


def _profile(**kw: float | None) -> HardwareProfile:
    return HardwareProfile(name="t", kind="cpu", variant="test", source="test", memory_bandwidth_gbs=1.0,
                           memory_pj_per_bit=1.0, compute_pj_per_flop=1.0, peak_tflops={"fp32": 1.0},
                           op_overhead_s=5e-6, launch_overhead_s=1e-6, **kw)  # type: ignore[arg-type]


VIEW = dict(module_path="m", op="aten.view", category="other", phase="decode")
ADD = dict(module_path="m", op="aten.add", category="elementwise", phase="decode", bytes_read=8, bytes_written=4)


def test_call_overhead_prices_every_kernel_call_and_no_view() -> None:
    per_op = _profile()
    per_call = _profile(call_overhead_s=4e-6)
    assert cost_op(OpRecord(**VIEW), per_op).overhead_s == 0.0  # a view makes no kernel call
    assert cost_op(OpRecord(**VIEW), per_call).overhead_s == 0.0  # nor is priced per call
    assert cost_op(OpRecord(**ADD, launches=3), per_call).overhead_s == pytest.approx(12e-6)
    assert cost_op(OpRecord(**ADD, launches=0), per_call).overhead_s == 0.0  # part of a fused call
    assert cost_op(OpRecord(**ADD, launches=3), per_op).overhead_s == pytest.approx(5e-6 + 2e-6)


def _captured_observation(i: int, layers: int, views: int, x: dict[str, float]) -> Observation:
    n = 64 * (i + 1)
    ops = [OpRecord(**{**ADD, "bytes_read": 8 * n, "bytes_written": 4 * n}, step=0) for _ in range(4 * layers)]
    ops += [OpRecord(**VIEW, step=0) for _ in range(views * layers)]
    o = Observation.from_ops(f"o{i}", "decode", 1.0, ops, captured=True)
    o.measured_s = (12 * n * 4 * layers * x["s_per_byte"] + 4 * layers * x["call_overhead_s"]
                    + x["step_overhead_s"])
    return o


def test_fit_finds_the_cost_per_call_from_captured_ops_and_leaves_the_kernel_chain_out() -> None:
    truth = {"s_per_byte": 1e-10, "call_overhead_s": 4e-6, "step_overhead_s": 2e-4}
    obs = [_captured_observation(i, layers, views, truth) for i, (layers, views) in
           enumerate([(1, 2), (2, 5), (4, 3), (8, 1), (3, 7), (6, 4)])]
    assert obs[1].calls == 2 * 4  # every kernel call; the five views a layer are free
    chain = Observation("micro 400 kernel calls", "micro", 400 * 1.2e-6, np.zeros(1), np.zeros(1), np.zeros(1), 0.0,
                        np.array([np.inf]), ops=0.0, extra_launches=400.0)
    assert per_call_fit(obs + [chain]) and not per_call_fit([Observation.from_ops("a", "decode", 1.0, [OpRecord(**ADD)])])
    res = fit(obs + [chain], cache_bytes=(0.0,), pack_rows=(0.0,), half_rows=(0.0,))
    k = res.coefficients
    assert res.per_call
    assert k["call_overhead_s"] == pytest.approx(4e-6, rel=1e-3)
    assert k["step_overhead_s"] == pytest.approx(2e-4, rel=1e-3)
    assert k["op_overhead_s"] == 0.0 and k["launch_overhead_s"] == 0.0  # not fitted per call
    assert "micro 400 kernel calls" not in res.errors_pct  # no fitted feature: left out
    prof = profile_from_fit(res)
    assert prof.call_overhead_s == pytest.approx(4e-6, rel=1e-3)
    assert (prof.op_overhead_s, prof.launch_overhead_s) == (0.0, 0.0)
    assert prof.calibration is not None and prof.calibration.params == list(PARAMS)
    assert prof.calibration.params[-3:] == ["call_overhead_s", "s_per_fresh_byte", "prefill_call_overhead_s"]
    # decode steps only: a prompt's calls take the decode step's cost
    assert k["prefill_call_overhead_s"] == k["call_overhead_s"]
    assert prof.prefill_call_overhead_s == prof.call_overhead_s


def _phase_observation(i: int, layers: int, phase: str, x: dict[str, float]) -> Observation:
    n = 64 * (i + 1)
    ops = [OpRecord(**{**ADD, "phase": phase, "bytes_read": 8 * n, "bytes_written": 4 * n}, step=0)
           for _ in range(4 * layers)]
    ops += [OpRecord(**{**VIEW, "phase": phase}, step=0) for _ in range(3 * layers)]
    o = Observation.from_ops(f"{phase}{i}", phase, 1.0, ops, captured=True)
    per_call = x["prefill_call_overhead_s"] if phase == "prefill" else x["call_overhead_s"]
    o.measured_s = (12 * n * 4 * layers * x["s_per_byte"] + 4 * layers * per_call + x["step_overhead_s"]
                    + (x["prefill_overhead_s"] if phase == "prefill" else 0.0))
    return o


def test_a_prompts_calls_and_a_decode_steps_each_have_their_own_cost() -> None:
    truth = {"s_per_byte": 1e-10, "call_overhead_s": 4e-6, "prefill_call_overhead_s": 6.5e-6,
             "step_overhead_s": 2e-4, "prefill_overhead_s": 1e-3}
    layers = [1, 2, 4, 8, 3, 6]
    obs = [_phase_observation(i, n, ph, truth) for ph in ("prefill", "decode") for i, n in enumerate(layers)]
    assert obs[0].whole_input and not obs[-1].whole_input
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), half_rows=(0.0,))
    k = res.coefficients
    assert k["call_overhead_s"] == pytest.approx(4e-6, rel=1e-3)
    assert k["prefill_call_overhead_s"] == pytest.approx(6.5e-6, rel=1e-3)
    assert k["prefill_overhead_s"] == pytest.approx(1e-3, rel=1e-3)
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    prof = profile_from_fit(res)
    assert prof.prefill_call_overhead_s == pytest.approx(6.5e-6, rel=1e-3)
    # the profile prices each call at its phase's cost; an encoder's pass and a single forward as a prompt's
    add = dict(ADD, launches=2)
    assert cost_op(OpRecord(**add), prof).overhead_s == pytest.approx(2 * 4e-6, rel=1e-3)
    for phase in ("prefill", "encode", "forward"):
        assert cost_op(OpRecord(**{**add, "phase": phase}), prof).overhead_s == pytest.approx(2 * 6.5e-6, rel=1e-3)
    # a profile without the prompt's own cost prices every call at call_overhead_s
    assert cost_op(OpRecord(**{**add, "phase": "prefill"}), _profile(call_overhead_s=4e-6)).overhead_s == \
        pytest.approx(8e-6)


def test_analytic_observations_keep_the_per_operation_fit() -> None:
    obs = []
    for i in range(6):
        ops = [OpRecord(**{**ADD, "bytes_read": 800 * (i + 1)}, launches=6) for _ in range(i + 2)]
        o = Observation.from_ops(f"a{i}", "decode", 1.0, ops)
        o.measured_s = 800 * (i + 1) * (i + 2) * 1e-10 + (i + 2) * (5e-6 + 5 * 1e-6) + 1e-4
        obs.append(o)
    res = fit(obs, cache_bytes=(0.0,), pack_rows=(0.0,), half_rows=(0.0,))
    assert not res.per_call and res.coefficients["call_overhead_s"] == 0.0
    assert profile_from_fit(res).call_overhead_s is None


def _llama() -> object:
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def test_calibration_observations_count_the_models_own_calls() -> None:
    m = Measurement(model="llama", batch_size=1, input_tokens=8, output_tokens=4, ttft_s=0.01, decode_s=0.02,
                    repeats=1)
    pre, dec = captured_observations_for(_llama(), m)
    assert pre.captured and dec.captured
    assert (pre.label, dec.label) == ("llama b1 in8 out4 prefill", "llama b1 in8 out4 decode")
    assert dec.forward_passes == 3.0  # three decode steps
    # a decode step of this two-layer Llama runs dozens of kernels (the norms, the rotary
    # embedding, the attention's pieces), each counted; its views are not
    assert dec.calls / dec.forward_passes > 60
    assert dec.calls == pytest.approx(dec.op_count + dec.extra_launches)


def test_simulate_config_counts_calls_on_a_profile_priced_per_call() -> None:
    prof = _profile(call_overhead_s=5e-6)
    res = simulate_config(_llama(), prof, batch_size=1, input_tokens=8, output_tokens=4, dtype="float32")
    assert res.op_source == "meta-device capture"
    spec = simulate_config(_llama(), _profile(), batch_size=1, input_tokens=8, output_tokens=4, dtype="float32")
    assert spec.op_source == "analytic"
    from perfsdk.models.arch import architecture_from_config

    analytic = simulate_model(architecture_from_config(_llama()), prof, batch_size=1, input_tokens=8,
                              output_tokens=4, dtype="float32")
    assert ANALYTIC_CALLS_NOTE in analytic.notes
    # the capture sees the kernel calls of the model's own code, more than the description writes
    assert res.phases["decode"].overhead_s > analytic.phases["decode"].overhead_s


def test_grouped_product_reads_the_experts_its_rows_reach() -> None:
    w = torch.randn(4, 16, 8)
    x = torch.randn(2, 16)
    two = torch.tensor([1, 2, 2, 2], dtype=torch.int32)
    assert grouped_weight_share((x, w, two), {}) == 0.5
    assert grouped_weight_share((x, w), {"offs": torch.tensor([2, 2, 2, 2], dtype=torch.int32)}) == 0.25
    meta = torch.empty(4, dtype=torch.int32, device="meta")
    assert grouped_weight_share((x, w, meta), {}) == pytest.approx(1 - 0.75 ** 2)  # expected share of 2 rows
    assert grouped_weight_share((x, w[0], two), {}) == 1.0  # not a grouped [E, ...] weight
    # a top-2 router: the two rows are one token's, sent to two different experts
    assert grouped_weight_share((x, w, meta), {}, picks=2) == pytest.approx(0.5)
    assert grouped_weight_share((x, w, two), {}, picks=2) == 0.5  # a real run's offsets decide
    x8 = torch.randn(8, 16)  # four tokens, top-2: an expert missed by all four with probability 1/16
    assert grouped_weight_share((x8, w, meta), {}, picks=2) == pytest.approx(1 - 0.5 ** 4)


class _Experts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 16, 8))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.weight, offs=offs)


class _SparseBlock(torch.nn.Module):
    """A mixture-of-experts block as transformers writes one: its ``top_k`` on the block."""

    def __init__(self) -> None:
        super().__init__()
        self.top_k = 2
        self.experts = _Experts()

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return self.experts(x, offs)


def test_capture_of_a_grouped_product_reads_the_routers_top_k() -> None:
    block = _SparseBlock()
    # the meta device's grouped product takes bf16 operands
    meta_x = torch.empty(2, 16, device="meta", dtype=torch.bfloat16)
    meta_offs = torch.empty(4, dtype=torch.int32, device="meta")
    with torch.inference_mode(), OperationCapture(block.to("meta", torch.bfloat16)) as cap:
        block(meta_x, meta_offs)
    rec = next(r for r in cap.records if r.op == "aten._grouped_mm")
    assert rec.group_picks == 2 and rec.groups == 4 and rec.group_rows is None
    assert rec.weight_bytes == 4 * 16 * 8 * 2 // 2  # one token's two rows: two experts of four
    assert product_rows(rec) == ([1.0], [pytest.approx(2.0)])


def test_meta_capture_of_mixtral_states_its_top_k() -> None:
    from transformers import MixtralConfig

    from perfsdk.flops.meta import capture_generation_ops

    cfg = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=128)
    cap = capture_generation_ops(cfg, 1, 8, 3, [1])
    grouped = [o for o in cap.ops if o.op == "aten._grouped_mm" and o.phase == "decode"]
    assert grouped and all(o.group_picks == 2 and o.groups == 4 for o in grouped)
    # a decode step of one sequence: one token to two of the four experts, each with its one row
    assert all(product_rows(o) == ([1.0], [pytest.approx(2.0)]) for o in grouped)


def test_a_bfloat16_capture_predicted_in_float32_leaves_out_the_casts_a_float32_run_does_not_make() -> None:
    from dataclasses import replace

    from transformers import AutoModelForCausalLM, MixtralConfig

    from perfsdk.flops.meta import capture_generation_ops
    from perfsdk.simulation.predictor import rescale_ops

    cfg = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=128)
    cap = capture_generation_ops(cfg, 1, 8, 3, [1])  # on the meta device in bfloat16 (the grouped product)
    assert cap.element_bytes == 2

    def casts(ops: list[OpRecord], path: str) -> int:
        return sum(1 for o in ops if o.phase == "decode" and o.step == 1 and o.op == "aten._to_copy"
                   and path in o.module_path)

    # every RMSNorm casts to float32 and back: two calls a norm, five norms
    assert casts(cap.ops, "norm") == 10
    as_fp32 = rescale_ops(cap.ops, "float32")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (1, 8))
    with torch.inference_mode(), OperationCapture(model, auto_phase=True) as real:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3, do_sample=False,
                       pad_token_id=0)
    assert casts(real.records, "norm") == casts(as_fp32, "norm") == 0
    assert casts(real.records, "") == casts(as_fp32, "")
    # the norms' own calls, in float32 in both, keep their bytes; the bfloat16 ones double theirs
    norm = [o for o in cap.ops if o.phase == "decode" and o.module_path.endswith("model.norm")]
    kept = [o for o in as_fp32 if o.phase == "decode" and o.module_path.endswith("model.norm")]
    assert [o.op for o in kept] == [o.op for o in norm if o.op != "aten._to_copy"]
    for before, after in zip([o for o in norm if o.op != "aten._to_copy"], kept):
        assert after.bytes_read == (before.bytes_read * 2 if before.dtype == "bfloat16" else before.bytes_read)
    # predicted in bfloat16, the casts a bfloat16 run makes stay, and the float32 ops keep their bytes
    same = rescale_ops(cap.ops, "bfloat16")
    assert casts(same, "norm") == 10 and [o.bytes_read for o in same] == [o.bytes_read for o in cap.ops]
    # a conversion that is not between two floating-point dtypes is never left out
    index = replace(norm[0], op="aten._to_copy", dtype="float32", input_dtype="int64")
    assert rescale_ops([index], "float32") == [index]


def test_capture_of_a_grouped_product_counts_the_weights_read() -> None:
    mod = _Experts()
    x = torch.randn(2, 16)
    try:
        with torch.inference_mode(), OperationCapture(mod) as cap:
            mod(x, torch.tensor([1, 2, 2, 2], dtype=torch.int32))
    except RuntimeError as exc:  # a build without the CPU grouped product
        pytest.skip(f"torch._grouped_mm unavailable: {exc}")
    rec = next(r for r in cap.records if r.op == "aten._grouped_mm")
    full = 4 * 16 * 8 * 4
    assert rec.weight_bytes == full // 2  # two of the four experts reached
    assert rec.bytes_read == full // 2 + 2 * 16 * 4 + 4 * 4  # the rows and the offsets


def test_other_families_are_held_out_whole_and_predicted_by_the_rest() -> None:
    from dataclasses import replace as _replace

    from perfsdk.simulation.calibration import ConfigurationSamples, held_out_errors

    truth = {"s_per_byte": 1e-10, "call_overhead_s": 4e-6, "step_overhead_s": 2e-4}
    configs = []
    # the main family: three models of one width; another family (one model) whose calls cost
    # 25 % more than the main family's fit says
    for i, (model, family, layers, views, slow) in enumerate(
            [("a1", "llama", 1, 2, 1.0), ("a2", "llama", 2, 2, 1.0), ("a4", "llama", 4, 2, 1.0),
             ("b2", "other", 2, 6, 1.25)]):
        dec = _captured_observation(i, layers, views, truth)
        dec = _replace(dec, measured_s=dec.measured_s * slow)
        pre = _replace(dec, phase="prefill", label=dec.label + " prefill")
        configs.append(ConfigurationSamples(model=model, observations=[pre, dec],
                                            per_pass=[[pre.measured_s], [dec.measured_s]], width=64,
                                            family=family))
    res = fit([o for c in configs for o in c.observations], cache_bytes=(0.0,), pack_rows=(0.0,),
              half_rows=(0.0,))
    held = held_out_errors(res, configs, [])
    assert len(held) == 4  # three Llama models one at a time, the other family whole
    other = held[-1]
    # fitted on the Llama models only, the other family comes out 1/1.25 - 1 = -20 % off
    assert other == pytest.approx([-0.2, -0.2], abs=0.02)
    # which entries left a whole family out, and the families, are what the intervals need
    from perfsdk.simulation.calibration import held_out_predictions, keep_held_out

    preds = held_out_predictions(res, configs, [])
    assert [(h.family, h.whole_family) for h in preds] == [("llama", False)] * 3 + [("other", True)]
    assert [h.errors for h in preds] == held
    keep_held_out(res, configs, [])
    assert res.held_out == held and res.held_out_whole_family == [False, False, False, True]
    assert res.families == ["llama", "other"]
    cal = profile_from_fit(res).calibration
    assert cal is not None and cal.held_out_whole_family == [False, False, False, True]
    assert cal.families == ["llama", "other"]


def test_small_configurations_of_other_families_build_by_model_type() -> None:
    from perfsdk.simulation.calibration import build_random_model

    m = build_random_model("type:gpt_bigcode@layers=2")
    assert type(m).__name__ == "GPTBigCodeForCausalLM"
    assert (m.config.n_layer, m.config.n_embd, m.config.multi_query) == (2, 256, True)
    assert type(build_random_model("type:codegen")).__name__ == "CodeGenForCausalLM"
    with pytest.raises(ValueError, match=r"type:nope: no small configuration of model type 'nope' here \(known: "
                                         r"type:gpt_bigcode, type:codegen\)"):
        build_random_model("type:nope")


def test_simulate_command_counts_the_calls_of_the_model_on_a_calibrated_host(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from perfsdk.cli.simulate import simulate_command
    from perfsdk.hardware.profile import profile_to_yaml

    path = tmp_path / "host.yaml"
    path.write_text(profile_to_yaml(_profile(call_overhead_s=4e-6).model_copy(update={"name": "my-host"})))
    args = ["--model", "builtin:tiny-llama", "--hardware", str(path), "--batch-size", "1", "--input-tokens", "16",
            "--output-tokens", "4", "--dtype", "float32", "--json"]
    r = CliRunner().invoke(simulate_command, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["op_source"] == "meta-device capture"
    # an override of the description keeps the analytic ops, and says what they leave out
    r = CliRunner().invoke(simulate_command, args + ["--kv-heads", "2"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["op_source"] == "analytic" and ANALYTIC_CALLS_NOTE in d["notes"]

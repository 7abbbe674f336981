"""Families the architecture description does not cover are counted, simulated and measured by
capturing their own code: ``perfsdk flops`` on a config equals the capture of a real ``generate``
on random weights of the same config."""

from __future__ import annotations

import json

import pytest
import torch
from perfsdk.flops.counter import count_generate
from perfsdk.models.arch import config_from_dict

# small configs of widespread families that the hand-written description does not describe
FAMILIES: dict[str, dict] = {
    "opt": dict(model_type="opt", hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=128,
                vocab_size=256, max_position_embeddings=128, word_embed_proj_dim=64),
    "falcon": dict(model_type="falcon", hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=256,
                   new_decoder_architecture=False, multi_query=True, parallel_attn=True, alibi=False),
    "bloom": dict(model_type="bloom", hidden_size=64, n_layer=3, n_head=4, vocab_size=256),
    "gptj": dict(model_type="gptj", n_embd=64, n_layer=3, n_head=4, vocab_size=256, rotary_dim=8, n_positions=128),
    "stablelm": dict(model_type="stablelm", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=128, vocab_size=256, max_position_embeddings=128),
    # experts routed through transformers' grouped GEMM (whose meta kernel takes bfloat16 only)
    "olmoe": dict(model_type="olmoe", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=32, num_experts=4, num_experts_per_tok=2, vocab_size=256,
                  max_position_embeddings=128),
    # dense MLPs in the first two layers, experts in the rest: no shallow copy shows the difference
    "glm4_moe": dict(model_type="glm4_moe", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=2,
                     n_group=1, topk_group=1, vocab_size=256, max_position_embeddings=128),
    # a state-space model whose layer_types the config derives from the layer count
    "mamba": dict(model_type="mamba", hidden_size=64, num_hidden_layers=3, state_size=8, expand=2, conv_kernel=4,
                  vocab_size=256),
    # a cache of its own (generate hands the model none)
    "minimax": dict(model_type="minimax", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=128, num_local_experts=4,
                    num_experts_per_tok=2, vocab_size=256, max_position_embeddings=128,
                    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
    "bart": dict(model_type="bart", d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
                 max_position_embeddings=128),
}

# layers of several kinds repeating with a period (counted from two shallow copies): sliding
# and full attention, two to one, over 11 layers (a period and a remainder of 2), with a window
# the context outgrows; alternating sliding and full attention with experts; alternating linear
# (gated delta rule) and full attention with experts
PERIODIC: dict[str, dict] = {
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=11, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=256,
                        max_position_embeddings=256, sliding_window=4,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 3
                        + ["sliding_attention"] * 2),
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=7, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4,
                    num_experts_per_tok=2, vocab_size=256, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"] * 3 + ["sliding_attention"]),
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=7, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4, vocab_size=256,
                       max_position_embeddings=256,
                       layer_types=["linear_attention", "full_attention"] * 3 + ["linear_attention"]),
    # a cache of its own whose key/value list grows only up to the last full-attention layer
    "minimax_mixed": dict(model_type="minimax", hidden_size=64, num_hidden_layers=7, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, intermediate_size=64, num_local_experts=4,
                          num_experts_per_tok=2, vocab_size=256, max_position_embeddings=256, block_size=4,
                          layer_types=["linear_attention", "full_attention"] * 3 + ["linear_attention"]),
    # one full to three sliding layers, and a module list beside the layers holding one rotary
    # embedding per layer type (``model.rotary_embs.0``, ``.1``: not layers 0 and 1)
    "granite_swa": dict(model_type="granite_swa", hidden_size=64, num_hidden_layers=14, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, vocab_size=256, max_position_embeddings=256,
                        sliding_window=4,
                        layer_types=(["full_attention"] + ["sliding_attention"] * 3) * 3 + ["full_attention",
                                                                                              "sliding_attention"]),
    # a lead of other layers before the pattern: DeepSeek-style dense MLPs in the first two
    # layers, experts in the five after them
    "glm4_moe_lead": dict(model_type="glm4_moe", hidden_size=64, num_hidden_layers=7, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                          n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=2,
                          n_group=1, topk_group=1, vocab_size=256, max_position_embeddings=256),
    # a full-attention layer ahead of alternating sliding and full ones
    "gpt_oss_lead": dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=11, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4,
                         num_experts_per_tok=2, vocab_size=256, sliding_window=4,
                         layer_types=["full_attention"] * 2 + ["sliding_attention", "full_attention"] * 4
                         + ["sliding_attention"]),
    # Llama 4: experts in every layer (``moe_layers`` names all 13), no RoPE and full attention in
    # every fourth layer, chunked attention in the others
    "llama4_text": dict(model_type="llama4_text", hidden_size=64, num_hidden_layers=13, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=64, intermediate_size_mlp=128,
                        num_local_experts=4, num_experts_per_tok=1, vocab_size=256, interleave_moe_layer_step=1,
                        max_position_embeddings=256, attention_chunk_size=4),
}

BATCH, INPUT, OUTPUT = 2, 8, 6


def write_config(tmp_path, name: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**FAMILIES, **PERIODIC}[name]))
    return str(folder)


def real_generate_count(name: str):
    """Capture a real generate on random weights: every forward's phase from the call order."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    cfg = config_from_dict({**FAMILIES, **PERIODIC}[name])
    torch.manual_seed(0)
    auto = AutoModelForSeq2SeqLM if cfg.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_config(cfg).eval()
    ids = torch.randint(3, 200, (BATCH, INPUT))
    _, count = count_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT,
                              min_new_tokens=OUTPUT, do_sample=False, pad_token_id=0)
    return count


def cli_and_real_counts(perfsdk_cli, tmp_path, name: str):
    """``perfsdk flops --json`` on the config of ``name`` (it must exit 0), and the count of a real
    ``generate`` on random weights of the same config."""
    folder = write_config(tmp_path, name)
    res = perfsdk_cli(["flops", folder, "-b", str(BATCH), "-t", str(INPUT), "-g", str(OUTPUT), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):]), real_generate_count(name)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_flops_cli_equals_capture_of_real_generate(perfsdk_cli, tmp_path, name):
    got, real = cli_and_real_counts(perfsdk_cli, tmp_path, name)
    assert got["flops_decode"] > 0
    assert (got["flops_encode"], got["flops_prefill"], got["flops_decode"]) == (
        real.flops_encode, real.flops_prefill, real.flops_decode)
    assert got["decode_forwards"] == OUTPUT - 1 == real.decode_forwards
    assert got["analytic_flops_total"] is None and got["deviation_pct"] is None
    assert f"analytic cross-check: not available for model type {name}" in got["notes"]


def test_flops_cli_table_says_cross_check_unavailable(perfsdk_cli, tmp_path):
    folder = write_config(tmp_path, "opt")
    res = perfsdk_cli(["flops", folder, "-t", "8", "-g", "4"])
    assert res.exit_code == 0, res.output
    assert "note: analytic cross-check: not available for model type opt" in res.output
    assert "not supported" not in res.output


def test_analytic_backend_on_undescribed_family_is_a_clear_error(perfsdk_cli, tmp_path):
    folder = write_config(tmp_path, "bloom")
    res = perfsdk_cli(["flops", folder, "--backend", "analytic"])
    assert res.exit_code == 2
    assert "analytic cross-check: not available for model type bloom" in res.output


# -- a real `perfsdk run` on random-weight checkpoints -----------------------------------------

# per layer: KV heads x head_dim (keys + values each)
KV_SHAPE = {"opt": (4, 16), "falcon": (1, 16), "bloom": (4, 16), "gptj": (4, 16), "stablelm": (2, 16)}


def save_checkpoint(tmp_path, name: str, with_tokenizer: bool = True) -> str:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from perfsdk.models.tiny import ensure_tiny_llama

    tok = PreTrainedTokenizerFast.from_pretrained(str(ensure_tiny_llama("tiny-llama")))
    cfg = config_from_dict({**FAMILIES[name], "vocab_size": len(tok)})
    torch.manual_seed(0)
    folder = tmp_path / f"ckpt-{name}"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    if with_tokenizer:
        tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KV_SHAPE))
def test_real_run_of_an_undescribed_family(perfsdk_cli, tmp_path, name):
    from perfsdk.store import Store

    folder = save_checkpoint(tmp_path, name)
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--set", f"model.id={folder}", "--set", "workload.num_prompts=4",
                     "--set", "workload.max_input_tokens=48", "--set", "workload.warmup_runs=1",
                     "--set", "workload.min_iterations=1", "--set", "workload.generate.max_new_tokens=8",
                     "--set", "workload.generate.min_new_tokens=8", "--set", "collectors.flops={}",
                     "--set", "collectors.simulation={}", "--set", "collectors.utilization=false",
                     "--set", "collectors.energy=false", "--store", str(store)])
    assert r.exit_code == 0, r.output
    st = Store(store)
    run = st.get(st.resolve_run_id("latest"))
    flops = run.collectors["flops"]
    assert flops["flops_decode"] > 0 and flops["flops_prefill"] > 0
    assert f"analytic cross-check: not available for model type {name}" in flops["notes"]
    assert run.model.attn_implementation in ("sdpa", "eager")
    mem = run.collectors["memory"]
    heads, head_dim = KV_SHAPE[name]
    assert mem["kv_cache_source"] == "cache tensors"
    # keys and values of 3 layers for every cached position of the largest batch, float32
    assert mem["kv_cache_bytes"] == (2 * 3 * heads * head_dim * 4 * mem["kv_cache_batch_size"]
                                     * mem["kv_cache_context_tokens"])
    sim = run.collectors["simulation"]
    assert sim["status"] == "ok", sim
    assert "KV cache (largest batch)" in r.output and "FLOPs prefill / decode" in r.output


def test_checkpoint_without_tokenizer_is_an_exit_2_error(perfsdk_cli, tmp_path):
    folder = save_checkpoint(tmp_path, "opt", with_tokenizer=False)
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--set", f"model.id={folder}", "--store", str(store)])
    assert r.exit_code == 2
    assert f"model.id: {folder} has no tokenizer files (none of tokenizer.json" in r.output
    assert "IndexError" not in r.output
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())


def test_explicit_sdpa_on_a_family_without_it_names_the_alternatives(perfsdk_cli, tmp_path):
    folder = save_checkpoint(tmp_path, "bloom")
    r = perfsdk_cli(["run", "--set", f"model.id={folder}", "--set", "model.attn_implementation=sdpa",
                     "--store", str(tmp_path / "store")])
    assert r.exit_code == 2
    assert "model.attn_implementation: sdpa is not available for BloomForCausalLM (use auto, or one of: eager)" \
        in r.output


def test_simulate_an_undescribed_family(perfsdk_cli, tmp_path):
    folder = write_config(tmp_path, "opt")
    r = perfsdk_cli(["simulate", "--model", folder, "--hardware", "h100-sxm", "--input-tokens", "32",
                     "--output-tokens", "100", "--dtype", "bfloat16", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{"):])
    assert res["ttft_s"] > 0 and res["tpot_s"] > 0
    assert "analytic cross-check: not available for model type opt" in res["notes"]
    # the KV cache the model builds for 32 + 99 positions: 3 layers x (K + V) x 4 heads x 16 x bf16
    assert res["devices"][0]["kv_cache_bytes"] == 3 * 2 * 4 * 16 * 2 * (32 + 99)
    # the layer repeat gives the same prediction as capturing every layer
    from perfsdk.flops.meta import capture_generation_ops
    from perfsdk.models.resolve import resolve_config

    cfg = resolve_config(folder)[0]
    two = capture_generation_ops(cfg, 1, 32, 100, [1, 50, 99])
    assert any("layer 1's operations repeated over all 3 layers" in n for n in two.notes)
    layers = {op.module_path.split(".")[3] for op in two.ops if op.module_path.startswith("model.decoder.layers.")}
    assert layers == {"0", "1", "2"}


# the state each family's own cache holds for 16 + 7 positions at batch 1, in bfloat16 (2 bytes)
OWN_STATE_BYTES = {
    # 3 layers x (K + V) x 4 heads x 16
    "olmoe": 3 * 2 * 4 * 16 * 2 * (16 + 7),
    # 2 full-attention layers x (K + V) x 2 KV heads x 16, and 2 linear-attention layers' state of
    # 4 heads x 16 x 16 (whatever the length)
    "minimax": 2 * 2 * 2 * 16 * 2 * (16 + 7) + 2 * 4 * 16 * 16 * 2,
    # 3 layers x 128 channels x (a 4-wide convolution window + an 8-wide state)
    "mamba": 3 * 128 * (4 + 8) * 2,
}


@pytest.mark.parametrize("name", sorted(OWN_STATE_BYTES))
def test_simulate_experts_own_caches_and_state_space_families(perfsdk_cli, tmp_path, name):
    """Experts captured in bfloat16 (the grouped GEMM's meta kernel), a cache the family builds
    itself, a state-space model: each simulated with its own weights and state, at the dtype asked."""
    from transformers import AutoModelForCausalLM

    folder = write_config(tmp_path, name)
    params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config_from_dict(FAMILIES[name])).parameters())
    for dtype, size in (("bfloat16", 2), ("float32", 4)):
        r = perfsdk_cli(["simulate", "--model", folder, "--hardware", "h100-sxm", "--input-tokens", "16",
                         "--output-tokens", "8", "--dtype", dtype, "--json"])
        assert r.exit_code == 0, r.output
        res = json.loads(r.output[r.output.index("{"):])
        assert res["ttft_s"] > 0 and res["tpot_s"] > 0
        assert f"analytic cross-check: not available for model type {name}" in res["notes"]
        assert res["devices"][0]["weight_bytes"] == params * size
        assert res["devices"][0]["kv_cache_bytes"] == OWN_STATE_BYTES[name] * size // 2


SLIDING = dict(model_type="mistral", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=128, vocab_size=256, sliding_window=12,
               max_position_embeddings=256)


def test_layers_that_differ_by_more_than_layer_types_are_captured_at_full_depth():
    """GLM-4-MoE's first two layers run a dense MLP, the others experts: a two-layer copy would
    show dense layers only, so the capture runs every layer, as the full model does."""
    from perfsdk.flops import meta

    cfg = config_from_dict(FAMILIES["glm4_moe"])
    cap = meta.capture_generation_ops(cfg, 2, 10, 6, [1, 3, 5])
    assert not any("repeated over all" in n for n in cap.notes)
    experts = {o.module_path.split(".")[2] for o in cap.ops if ".mlp.experts" in o.module_path}
    assert experts == {"2", "3"}
    assert meta.uniform_layers(meta.meta_model(cfg), 4) is False
    assert meta.uniform_layers(meta.meta_model(config_from_dict(FAMILIES["olmoe"])), 3) is True


PERIODS = {"gemma3_text": 3, "gpt_oss": 2, "qwen3_next": 2, "minimax_mixed": 2, "granite_swa": 4,
           "glm4_moe_lead": 1, "gpt_oss_lead": 2, "llama4_text": 4}
LEADS = {"glm4_moe_lead": 2, "gpt_oss_lead": 1}


def plan_note(name: str) -> str:
    """How the notes of a count or capture from shallow copies name the pattern of ``name``."""
    which = f"decoder layers after the first {LEADS[name]}" if name in LEADS else "decoder layers"
    return f"{which} are identical" if PERIODS[name] == 1 else f"{which} repeat every {PERIODS[name]} layers"


def _installed(names):
    """``names`` as parameters, those whose family the installed ``transformers`` lacks skipped."""
    from transformers import CONFIG_MAPPING

    return [pytest.param(n, marks=pytest.mark.skipif(PERIODIC[n]["model_type"] not in CONFIG_MAPPING,
                                                     reason=f"transformers has no {PERIODIC[n]['model_type']}"))
            for n in sorted(names)]


@pytest.mark.parametrize("name", _installed(PERIODIC))
def test_flops_cli_of_repeating_layer_kinds_equals_capture_of_real_generate(perfsdk_cli, tmp_path, name):
    got, real = cli_and_real_counts(perfsdk_cli, tmp_path, name)
    assert got["flops_decode"] > 0 and got["decode_forwards"] == OUTPUT - 1 == real.decode_forwards
    assert (got["flops_prefill"], got["flops_decode"]) == (real.flops_prefill, real.flops_decode)
    assert any(plan_note(name) in n for n in got["notes"]), got["notes"]


def test_a_layer_plan_maps_every_layer_to_one_of_the_second_copy():
    """26 layers of period 6 (Gemma 3's five sliding to one full): copies of 8 and 14 layers, and
    each further layer is alike the layer of the second copy a whole number of periods before it."""
    from perfsdk.flops.meta import LayerPlan

    plan = LayerPlan(26, 6)
    assert (plan.first, plan.second, plan.repeats) == (8, 14, 3)
    assert [plan.source(i) for i in (0, 13, 14, 19, 20, 25)] == [0, 13, 8, 13, 8, 13]
    assert all((plan.source(i) - i) % 6 == 0 for i in range(26))
    assert (LayerPlan(36, 1).first, LayerPlan(36, 1).second, LayerPlan(36, 1).repeats) == (1, 2, 35)
    # only paths in the decoder layers' list are layers: not another list's entries beside it
    plan = LayerPlan(26, 6, "model.layers")
    assert plan.layer_of("model.rotary_embs.0") is None and plan.layer_of("lm_head") is None
    m = plan.layer_of("model.layers.13.self_attn.q_proj")
    assert m is not None and (m["pre"], m["idx"], m["post"]) == ("model.layers", "13", ".self_attn.q_proj")


@pytest.mark.parametrize("name", _installed(PERIODS))
def test_layers_of_several_kinds_repeating_count_from_two_copies_as_at_full_depth(name):
    from perfsdk.flops import meta

    cfg = config_from_dict(PERIODIC[name])
    plan = meta.layer_plan(cfg, meta.meta_model(cfg))
    assert plan is not None and (plan.period, plan.lead) == (PERIODS[name], LEADS.get(name, 0))
    fast = meta.count_config(cfg, 2, 10, 12)
    full = meta.count_config(cfg, 2, 10, 12, full_depth=True)
    assert any(plan_note(name) in n for n in fast.notes), fast.notes
    assert not any("decoder layers" in n for n in full.notes)
    assert (fast.flops_prefill, fast.flops_decode, fast.macs_total, fast.decode_forwards) == (
        full.flops_prefill, full.flops_decode, full.macs_total, full.decode_forwards)
    assert fast.modules == full.modules and fast.categories == full.categories and fast.forwards == full.forwards
    layers = {m.split(".")[2] for m in fast.modules if m.startswith("model.layers.")}
    assert layers == {str(i) for i in range(cfg.num_hidden_layers)}
    if name == "glm4_moe_lead":  # the two dense layers counted once, the experts in the five others
        experts = {m.split(".")[2] for m in fast.modules if ".mlp.experts" in m}
        dense = {m.split(".")[2] for m in fast.modules if m.endswith(".mlp.gate_proj")}
        assert (experts, dense) == ({"2", "3", "4", "5", "6"}, {"0", "1"})


@pytest.mark.parametrize("name", _installed(PERIODS))
def test_layers_of_several_kinds_repeating_are_captured_as_at_full_depth(monkeypatch, name):
    """The simulator's capture: the second copy's operations, the further layers' taken from the
    layer each is alike, are those every layer runs, in the same order, and so is the cache."""
    from perfsdk.flops import meta

    cfg = config_from_dict(PERIODIC[name])
    depth = cfg.num_hidden_layers

    def ops(cap):
        return [(o.phase, o.step, o.module_path, o.op, o.flops, o.bytes_read, o.bytes_written) for o in cap.ops]

    fast = meta.capture_generation_ops(cfg, 2, 10, 12, [1, 5, 11])
    assert any(plan_note(name) in n and f"repeated over all {depth} layers" in n
               for n in fast.notes), fast.notes
    monkeypatch.setattr(meta, "layer_plan", lambda config, model: None)
    full = meta.capture_generation_ops(cfg, 2, 10, 12, [1, 5, 11])
    assert not any("repeated over all" in n for n in full.notes)
    assert ops(fast) == ops(full) and len(ops(fast)) > 0
    assert fast.kv_cache_bytes == full.kv_cache_bytes
    if name == "gemma3_text":
        # 3 full-attention layers hold keys and values of all 10 + 11 positions; 8 sliding ones
        # the window's last 3 (the fourth is the position the step adds); 2 KV heads x 16,
        # float32, batch 2
        assert fast.kv_cache_bytes == (3 * 21 + 8 * 3) * 2 * 2 * 16 * 4 * 2
    if name == "glm4_moe_lead":  # lead 2, period 1: copies of 3 and 4 layers, the last one repeated
        assert any("a 4-layer copy captured on the meta device and layer 3's operations repeated over all 7 "
                   "layers" in n for n in fast.notes), fast.notes
    if name == "granite_swa":
        # 4 full-attention layers (0, 4, 8, 12) hold all 21 positions, 10 sliding ones 3
        assert fast.kv_cache_bytes == (4 * 21 + 10 * 3) * 2 * 2 * 16 * 4 * 2
    if name == "minimax_mixed":
        # 3 full-attention layers: keys and values of 21 positions, 2 KV heads x 16; 4 linear-
        # attention layers: a 16 x 16 state per head, 4 heads; batch 2, bfloat16 (the experts'
        # grouped GEMM on the meta device)
        assert fast.kv_cache_bytes == (3 * 21 * 2 * 2 * 16 + 4 * 4 * 16 * 16) * 2 * 2


@pytest.mark.parametrize("name", ["opt", "mamba", "minimax", "bart", "sliding"])
def test_decode_steps_are_captured_alike_from_a_fresh_cache_or_the_one_held(monkeypatch, name):
    """Each sampled decode step's context is reached by one forward into a fresh cache or by
    stepping the cache held: the captured operations and the cache are the same either way."""
    from perfsdk.flops import meta

    cfg = config_from_dict(SLIDING if name == "sliding" else FAMILIES[name])
    got = {}
    for refill in (True, False):
        monkeypatch.setattr(meta, "_refill", lambda gap, step_s, refill_s, r=refill: gap < 0 or (gap > 0 and r))
        cap = meta.capture_generation_ops(cfg, 2, 10, 30, [1, 2, 5, 17, 29])
        got[refill] = ([(o.phase, o.step, o.module_path, o.op, o.flops, o.bytes_read, o.bytes_written)
                        for o in cap.ops], cap.kv_cache_bytes)
    assert got[True][0] and got[True] == got[False]
    assert {s for p, s, *_ in got[True][0] if p == "decode"} == {1, 2, 5, 17, 29}


def both_commands_stop_with(perfsdk_cli, folder: str, said: str, not_said: str, *extra: str) -> None:
    """``perfsdk simulate`` and ``perfsdk flops`` on ``folder`` exit 2 saying ``said``, not ``not_said``."""
    for args in (["simulate", "--model", folder, *extra], ["flops", folder, *extra]):
        r = perfsdk_cli(args)
        assert r.exit_code == 2, r.output
        assert said in r.output and not_said not in r.output, r.output


def test_a_family_whose_code_cannot_run_on_the_meta_device_is_a_clear_error(perfsdk_cli, tmp_path, monkeypatch):
    from perfsdk.flops import meta

    def fails(*args, **kwargs):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    monkeypatch.setattr(meta._Replay, "forward", fails)
    both_commands_stop_with(perfsdk_cli, write_config(tmp_path, "opt"),
                            "model type opt: its code could not run on the meta device (RuntimeError: Tensor.item() "
                            "cannot be called on meta tensors), and no analytic description covers it", "Traceback")


def test_a_family_that_does_not_generate_text_from_tokens_is_a_clear_error(perfsdk_cli, tmp_path):
    folder = tmp_path / "whisper"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(
        model_type="whisper", d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256, num_mel_bins=16)))
    both_commands_stop_with(perfsdk_cli, str(folder),
                            "model type whisper: transformers has no AutoModelForSeq2SeqLM for it; perfsdk counts and "
                            "simulates models that generate text from token ids", "Model type should be one of")


def test_inputs_the_replay_cannot_make_are_said_as_they_are(perfsdk_cli, tmp_path):
    both_commands_stop_with(perfsdk_cli, write_config(tmp_path, "opt"),
                            "perfsdk: error: images: the model has no vision tower", "meta device", "--images", "1")


PALIGEMMA = {"model_type": "paligemma", "image_token_index": 299, "vocab_size": 300, "projection_dim": 64,
             "text_config": {"model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                             "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 128, "vocab_size": 300},
             "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "num_hidden_layers": 2,
                               "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32, "patch_size": 8,
                               "projection_dim": 64}}


def test_an_undescribed_vision_language_family_is_counted_by_capture(perfsdk_cli, tmp_path):
    """PaliGemma: its image tokens per image come from its own image-feature code (16 for a 32x32
    image in 8x8 patches), its vision tower is the encode phase; every phase equals the capture
    of a real generate with one image per sequence."""
    from transformers import AutoModelForImageTextToText

    folder = tmp_path / "pg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PALIGEMMA))
    res = perfsdk_cli(["flops", str(folder), "-b", "2", "-t", "8", "-g", "4", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output[res.output.index("{"):])
    assert got["architecture"] == "vision-language" and got["images"] == 1 and got["image_tokens"] == 16
    assert got["prompt_tokens"] == 24
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config_from_dict(PALIGEMMA)).eval()
    ids = torch.cat([torch.full((2, 16), 299), torch.randint(3, 250, (2, 8))], dim=1)
    _, real = count_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                             pixel_values=torch.zeros(2, 3, 32, 32), max_new_tokens=4, min_new_tokens=4,
                             do_sample=False, pad_token_id=0)
    assert real.flops_encode > 0
    assert (got["flops_encode"], got["flops_prefill"], got["flops_decode"]) == (
        real.flops_encode, real.flops_prefill, real.flops_decode)
    assert "analytic cross-check: not available for model type paligemma" in got["notes"]



def test_multi_query_attention_without_enable_gqa_is_priced_as_the_unfused_path():
    """Falcon's own code passes one key/value head to SDPA without ``enable_gqa``: PyTorch runs the
    unfused path, and with two sequences copies K and V out to the four query heads. From
    transformers 5.25 a masked decode folds the four query heads onto the key/value head instead
    (``[B, 1, 4, D]`` queries): the fused kernel, one call, no copies. The capture on the meta
    device (what ``perfsdk simulate`` prices) and on a real generate say so alike, either way."""
    from transformers import AutoModelForCausalLM

    from perfsdk.capture import OperationCapture
    from perfsdk.flops.meta import capture_generation_ops

    cfg = config_from_dict(FAMILIES["falcon"])
    meta = capture_generation_ops(cfg, BATCH, INPUT, OUTPUT, [3])
    decode = [r for r in meta.ops if r.phase == "decode" and r.category == "attention"]
    assert len(decode) == 3  # one per layer
    hq, d, ctx = 4, 16, INPUT + 3  # step 3 attends the prompt and three generated positions
    q, kv, scores, mask = BATCH * hq * d, BATCH * ctx * d, BATCH * hq * ctx, BATCH * ctx
    fused_read, fused_written = 4 * (q + 2 * kv) + mask, 4 * q  # a boolean mask, one byte a position
    extra_read = q + kv + 3 * scores + 2 * kv * hq  # Q and K scaled; scores; the copies and their reads
    extra_written = q + kv + 3 * scores + 2 * kv * hq
    for r in decode:
        if r.input_shapes[0] == (BATCH, 1, hq, d):  # the query folded onto the key/value head
            assert r.input_shapes[1:4] == [(BATCH, 1, ctx, d), (BATCH, 1, ctx, d), (BATCH, 1, 1, ctx)]
            assert r.launches == 1
            assert (r.bytes_read, r.bytes_written) == (fused_read, fused_written)
        else:
            assert r.input_shapes[:3] == [(BATCH, hq, 1, d), (BATCH, 1, ctx, d), (BATCH, 1, ctx, d)]
            assert r.launches == 8  # scale Q, scale K, copy K, QK^T, add the mask, softmax, copy V, PV
            assert (r.bytes_read, r.bytes_written) == (fused_read + 4 * extra_read,
                                                       fused_written + 4 * extra_written)
        assert r.flops == 2 * scores * 2 * d

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(3, 200, (BATCH, INPUT))
    with torch.inference_mode(), OperationCapture(model, auto_phase=True) as cap:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT,
                       min_new_tokens=OUTPUT, do_sample=False, pad_token_id=0)
    real = [r for r in cap.records if r.phase == "decode" and r.step == 3 and r.category == "attention"]
    assert [(r.bytes_read, r.bytes_written, r.launches) for r in real] == \
        [(r.bytes_read, r.bytes_written, r.launches) for r in decode]

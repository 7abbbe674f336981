"""The one architecture reader: what it reads from each family's config, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers as tf
from click.testing import CliRunner

from perfsdk.cli.flops import flops_command
from perfsdk.models.arch import SUPPORTED_MODEL_TYPES, MissingConfigField, UnsupportedArchitecture, architecture_from_config
from perfsdk.models.resolve import UnknownModel, bundled_config, bundled_names, resolve_config
from perfsdk.cli.simulate import simulate_command

H, L, NH, KV, INTER, V = 64, 2, 4, 2, 128, 256
BASE = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=KV, intermediate_size=INTER,
            vocab_size=V, max_position_embeddings=128)


def test_gqa_head_dim_override_biases_and_tied_embeddings() -> None:
    a = architecture_from_config(tf.LlamaConfig(**BASE, head_dim=32, attention_bias=True, tie_word_embeddings=True))
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.v_head_dim) == (4, 2, 32, 32)
    assert [(l.name, l.in_features, l.out_features, l.bias) for l in a.attention_linears()] == [
        ("self_attn.q_proj", 64, 128, True), ("self_attn.k_proj", 64, 64, True), ("self_attn.v_proj", 64, 64, True),
        ("self_attn.o_proj", 128, 64, True)]
    assert a.tie_word_embeddings and a.gated_mlp and a.norm == "rms" and a.hidden_act == "silu"
    # Qwen2 has biases on q, k, v only
    q = architecture_from_config(tf.Qwen2Config(**BASE))
    assert (q.qkv_bias, q.o_bias) == (True, False)


def test_multi_query_attention() -> None:
    a = architecture_from_config(tf.GPTBigCodeConfig(n_embd=H, n_layer=L, n_head=NH, vocab_size=V, multi_query=True))
    assert a.num_kv_heads == 1 and not a.gated_mlp and a.norm == "layer" and a.intermediate_size == 4 * H
    # 1 KV head of 16: q 64x64, k and v 64x16, o 64x64
    assert sum(l.macs for l in a.attention_linears()) == 2 * 64 * 64 + 2 * 64 * 16
    assert a.kv_cache_bytes(1, 10, 2) == L * 10 * 2 * 16 * 2


def test_per_layer_sliding_windows_as_transformers_decides() -> None:
    # Qwen2: use_sliding_window + max_window_layers -> the layers from max_window_layers on slide
    q = architecture_from_config(tf.Qwen2Config(**{**BASE, "num_hidden_layers": 4}, use_sliding_window=True,
                                                sliding_window=8, max_window_layers=2))
    assert q.layer_windows == (None, None, 8, 8)
    # Gemma2: alternating layer_types; Gemma3: one full layer in sliding_window_pattern
    g2 = architecture_from_config(tf.Gemma2Config(**{**BASE, "num_hidden_layers": 4}, head_dim=16, sliding_window=8))
    assert g2.layer_windows == (8, None, 8, None)
    g3 = architecture_from_config(tf.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 7}, head_dim=16,
                                                      sliding_window=8, sliding_window_pattern=6))
    assert g3.layer_windows == (8, 8, 8, 8, 8, None, 8)
    # Mistral: a sliding_window on every layer; a window of None is full attention
    assert architecture_from_config(tf.MistralConfig(**BASE, sliding_window=8)).layer_windows == (8, 8)
    assert architecture_from_config(tf.MistralConfig(**BASE, sliding_window=None)).sliding_windows == ()
    # a dict without layer_types: the Qwen2 rule applies through transformers' own config class
    d = {"model_type": "qwen2", **BASE, "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 8,
         "max_window_layers": 1}
    assert architecture_from_config(d).layer_windows == (None, 8, 8)
    # keys a sliding layer's kernel gets: every key at the first forward, window - 1 cached + new later
    assert (g2.keys_attended(0, 0, 20), g2.keys_attended(0, 20, 1), g2.keys_attended(1, 20, 1)) == (20, 8, 21)
    # KV cache: a sliding layer keeps at most its window; 2 KV heads x (16 + 16) per position, fp16
    assert g2.kv_cache_bytes(1, 20, 2) == (8 + 20 + 8 + 20) * 2 * 32 * 2


def test_moe_shared_experts_and_experts_per_token() -> None:
    q = architecture_from_config(tf.Qwen2MoeConfig(**{**BASE, "num_hidden_layers": 3}, num_experts=8,
                                                   num_experts_per_tok=2, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=96, mlp_only_layers=[1]))
    assert (q.num_experts, q.experts_per_token, q.expert_intermediate_size) == (8, 2, 32)
    assert q.shared_expert_intermediate_size == 96 and q.shared_expert_gate and q.dense_layers == (1,)
    attn = sum(l.macs for l in q.attention_linears())
    # routed: 2 experts x 3 matrices of 64x32; router 64x8; shared expert 3 x 64x96 and its 64x1 gate
    assert q.layer_linear_macs(0) == attn + 2 * 3 * 64 * 32 + 64 * 8 + 3 * 64 * 96 + 64
    assert q.layer_linear_macs(1) == attn + 3 * 64 * 128  # a dense layer
    d = architecture_from_config(tf.DeepseekV3Config(
        **{**BASE, "num_hidden_layers": 3, "num_key_value_heads": NH}, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1))
    assert (d.shared_expert_intermediate_size, d.shared_expert_gate, d.dense_layers) == (64, False, (0,))
    assert (d.head_dim, d.v_head_dim, d.cache_width()) == (24, 16, 16 + 8)
    m = architecture_from_config(tf.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=1))
    assert m.experts_per_token == 1 and m.expert_intermediate_size == INTER


def test_dict_configs_name_missing_fields() -> None:
    llama = {"model_type": "llama", **BASE}
    assert architecture_from_config(llama).vocab_size == V
    with pytest.raises(MissingConfigField, match="config field vocab_size is missing"):
        architecture_from_config({k: v for k, v in llama.items() if k != "vocab_size"})
    mixtral = {**llama, "model_type": "mixtral", "num_local_experts": 4}
    with pytest.raises(MissingConfigField, match="num_experts_per_tok"):
        architecture_from_config(mixtral)
    llava = bundled_config("tiny-llava")
    del llava["vision_config"]["patch_size"]
    with pytest.raises(MissingConfigField, match="vision_config.patch_size"):
        architecture_from_config(llava)
    with pytest.raises(MissingConfigField, match="model_type"):
        architecture_from_config({"hidden_size": 8})


def test_unsupported_architecture_is_named() -> None:
    with pytest.raises(UnsupportedArchitecture, match="architecture 'bert' is not supported"):
        architecture_from_config(tf.BertConfig())
    with pytest.raises(UnsupportedArchitecture, match="text_config: architecture 'mamba'"):
        architecture_from_config(tf.LlavaConfig(text_config=tf.MambaConfig()))
    assert {"llama", "gpt2", "mixtral", "phi3", "gemma", "qwen2", "mistral", "t5", "llava"} <= set(SUPPORTED_MODEL_TYPES)


def test_tiny_llava_and_tiny_t5_configs() -> None:
    assert {"tiny-llava", "tiny-t5"} <= set(bundled_names())
    llava = architecture_from_config(bundled_config("tiny-llava"))
    vis = llava.encoder
    assert llava.kind == "vision-language" and vis is not None and vis.role == "vision"
    assert (vis.image_size, vis.patch_size, vis.hidden_size, vis.num_layers, vis.num_heads) == (32, 8, 64, 2, 4)
    # (32 / 8)^2 = 16 patches + the class token; the default strategy hands 16 tokens per image on
    assert (vis.tokens_per_image, llava.image_tokens_per_image) == (17, 16)
    assert (llava.hidden_size, llava.num_layers, llava.num_kv_heads, llava.vocab_size) == (64, 2, 2, 4096)
    t5 = architecture_from_config(bundled_config("tiny-t5"))
    assert t5.kind == "encoder-decoder" and t5.cross_attention and t5.gated_mlp and t5.position == "relative"
    assert t5.encoder is not None and (t5.encoder.num_layers, t5.num_layers, t5.head_dim) == (2, 2, 16)
    # builtin: names fall back to the bundled config of the same name
    assert resolve_config("builtin:tiny-t5")[1] == "builtin"


def test_local_folders_of_vlm_and_t5(tmp_path: Path) -> None:
    vlm = tf.LlavaConfig(vision_config=tf.CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=64,
                                                           num_hidden_layers=1, num_attention_heads=4,
                                                           intermediate_size=128),
                         text_config=tf.LlamaConfig(**BASE), vision_feature_select_strategy="full")
    vlm.save_pretrained(tmp_path / "vlm")
    t5 = tf.T5Config(d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2, vocab_size=V)
    t5.save_pretrained(tmp_path / "t5")
    a = architecture_from_config(resolve_config(str(tmp_path / "vlm"))[0])
    assert a.image_tokens_per_image == 17  # 'full' keeps the class token
    b = architecture_from_config(resolve_config(str(tmp_path / "t5"))[0])
    assert b.encoder is not None and not b.gated_mlp and b.hidden_act == "relu"
    for folder in ("vlm", "t5"):
        r = CliRunner().invoke(flops_command, [str(tmp_path / folder), "-t", "4", "-g", "2", "--json"])
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        assert d["flops_encode"] > 0
        assert d["flops_total"] == d["flops_encode"] + d["flops_prefill"] + d["flops_decode"] == d["analytic_flops_total"]


def test_cli_exit_2_for_an_unknown_or_invalid_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nosuchfamily", "hidden_size": 64}))
    for cmd, args in ((flops_command, [str(tmp_path)]), (simulate_command, ["--model", str(tmp_path)])):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 2, r.output
        assert "model_type 'nosuchfamily' is not a family that transformers" in r.output
        assert "Traceback" not in r.output and len(r.output) < 400
    # a family transformers knows, with values it rejects: its own message, exit 2
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64, "vocab_size": 10}))
    for cmd, args in ((flops_command, [str(tmp_path)]), (simulate_command, ["--model", str(tmp_path)])):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 2, r.output
        assert "not a multiple of the number of attention heads" in r.output and "Traceback" not in r.output
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **BASE, "vocab_size": None}))
    r = CliRunner().invoke(simulate_command, ["--model", str(tmp_path)])
    assert r.exit_code == 2 and "config field vocab_size is missing" in r.output
    r = CliRunner().invoke(flops_command, ["gpt2", "--images", "1"])
    assert r.exit_code == 2 and "has no vision tower" in r.output
    with pytest.raises(UnknownModel, match="bundled configs"):
        resolve_config("no-such-model")


def test_memory_kv_cache_follows_the_architecture() -> None:
    import torch

    import perfsdk

    # Gemma2-style alternating windows: a sliding layer keeps at most its 4 positions
    cfg = tf.Gemma2Config(**BASE, head_dim=16, sliding_window=4, attn_implementation="eager")
    torch.manual_seed(0)
    model = tf.Gemma2ForCausalLM(cfg).eval()
    ids = torch.randint(3, V, (2, 6))
    with perfsdk.session({"collectors": {"utilization": False, "energy": False}}, store=None) as s:
        s.load(model=model)
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3,
                   do_sample=False, pad_token_id=0)
    mem = s.result.collectors["memory"]
    assert s.result.model is not None and s.result.model.model_type == "gemma2"
    # the cache the model built: 6 + 3 - 1 = 8 positions (the last token's keys are never computed)
    assert mem["kv_cache_source"] == "cache tensors"
    assert mem["kv_cache_context_tokens"] == 8
    # layer 0 slides and keeps window - 1 = 3 positions, layer 1 (full) keeps 8;
    # 2 KV heads x (16 + 16) x batch 2 x fp32
    assert mem["kv_cache_bytes"] == (3 + 8) * 2 * 32 * 2 * 4
    assert mem["kv_cache_bytes_per_token"] == 2 * 2 * 32 * 4

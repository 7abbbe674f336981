"""Model loading: built-in, local folders, hub ids offline, dtype, attention, quantization, errors."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from perfsdk.config import ConfigError, ModelConfig
from perfsdk.models import loader
from perfsdk.models.loader import load_model, resolve_device
from perfsdk.models.tiny import build_tiny_llama, tiny_llama_config


@pytest.fixture(scope="module", autouse=True)
def _cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.getbasetemp() / "perfsdk-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSDK_CACHE_DIR", str(root))
        yield root


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "_cuda_available", lambda: True)


def _greedy(model: torch.nn.Module, tok: object, n: int = 4) -> torch.Tensor:
    enc = tok(["The cache grows", "Memory is organized as a long row"], return_tensors="pt", padding=True)  # type: ignore[operator]
    return model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False)  # type: ignore[operator]


def test_builtin_defaults() -> None:
    model, tok = load_model(ModelConfig())
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.device.type == "cpu"
    assert model.config._attn_implementation == "sdpa"
    assert model.config.name_or_path == "builtin:tiny-llama"
    assert not model.training
    assert tok.pad_token_id == 3 and tok.padding_side == "left"
    assert _greedy(model, tok).shape == (2, 8 + 4)


def test_builtin_matches_builder_logits() -> None:
    model, tok = load_model(ModelConfig())
    ref, _ = build_tiny_llama(use_cache=False)
    enc = tok(["Batching means serving several requests"], return_tensors="pt")
    with torch.inference_mode():
        assert torch.equal(model(**enc).logits, ref(**enc).logits)


def test_small_variant() -> None:
    model, _ = load_model(ModelConfig(id="builtin:tiny-llama-small"))
    assert model.config.hidden_size == 128
    assert model.config.num_hidden_layers == 2


@pytest.mark.parametrize(("dtype", "expected"), [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                                 ("auto", torch.float32)])
def test_dtypes(dtype: str, expected: torch.dtype) -> None:
    model, tok = load_model(ModelConfig(dtype=dtype, attn_implementation="eager"))  # type: ignore[arg-type]
    assert model.dtype == expected
    assert model.config._attn_implementation == "eager"
    assert _greedy(model, tok, 2).shape == (2, 8 + 2)


def test_dynamic_int8_quantizes_every_linear() -> None:
    model, tok = load_model(ModelConfig(quantization="dynamic-int8"))
    qlinear = torch.ao.nn.quantized.dynamic.Linear
    n_q = sum(isinstance(m, qlinear) for m in model.modules())
    n_float = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert n_q == 4 * 7 + 1  # q, k, v, o, gate, up, down per layer, plus lm_head
    assert n_float == 0
    assert model.lm_head.weight().dtype == torch.qint8
    out = _greedy(model, tok, 3)
    assert out.shape == (2, 8 + 3)


def test_int8_rejected_on_cuda(fake_cuda: None) -> None:
    assert resolve_device("auto") == "cuda"
    with pytest.raises(ConfigError, match=r"^model\.quantization: dynamic-int8 runs on CPU only.*cuda"):
        load_model(ModelConfig(quantization="dynamic-int8"))


def test_int8_needs_float32() -> None:
    with pytest.raises(ConfigError, match=r"^model\.quantization: dynamic-int8 needs model\.dtype float32"):
        load_model(ModelConfig(quantization="dynamic-int8", dtype="bfloat16"))


@pytest.mark.parametrize("q", ["bnb-8bit", "bnb-4bit"])
def test_bnb_without_cuda(q: str) -> None:
    with pytest.raises(ConfigError, match=rf"^model\.quantization: {q} needs a CUDA GPU.*no CUDA device"):
        load_model(ModelConfig(quantization=q))  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_bnb_without_package(fake_cuda: None) -> None:
    with pytest.raises(ConfigError, match=r"^model\.quantization: bnb-4bit needs the bitsandbytes package"):
        load_model(ModelConfig(quantization="bnb-4bit"))


def test_cuda_device_without_cuda() -> None:
    with pytest.raises(ConfigError, match=r"^model\.device: cuda:1 requested but CUDA is not available"):
        load_model(ModelConfig(device="cuda:1"))


def test_missing_folder() -> None:
    with pytest.raises(ConfigError, match=r"^model\.id: folder \./no-such-model not found$"):
        load_model(ModelConfig(id="./no-such-model"))


def test_file_is_not_a_folder(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"^model\.id: .*weights\.bin is not a folder"):
        load_model(ModelConfig(id=str(f)))


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model\.id: folder .* has no config\.json"):
        load_model(ModelConfig(id=str(tmp_path)))


def test_unknown_builtin() -> None:
    with pytest.raises(ConfigError, match=r"^model\.id: unknown built-in model 'builtin:gpt-9'.*builtin:tiny-llama"):
        load_model(ModelConfig(id="builtin:gpt-9"))


def test_hub_id_offline_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"^model\.id: 'perfsdk-test/no-such-model' is not a local folder and not in "
                                          r"the Hugging Face cache, and HF_HUB_OFFLINE is set; point model\.id at a "
                                          r"local folder"):
        load_model(ModelConfig(id="perfsdk-test/no-such-model"))


def test_local_causal_folder(tmp_path: Path) -> None:
    model, tok = build_tiny_llama(use_cache=False, name="tiny-llama-small")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_model(ModelConfig(id=str(tmp_path)))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert ltok is not None and ltok.padding_side == "left" and ltok.pad_token_id == 3
    enc = ltok(["Caches work because programs reuse data"], return_tensors="pt")
    with torch.inference_mode():
        assert torch.equal(loaded(**enc).logits, model(**enc).logits)


def test_local_classifier_folder_without_tokenizer(tmp_path: Path) -> None:
    from transformers import LlamaForSequenceClassification

    cfg = tiny_llama_config("tiny-llama-small")
    cfg.num_labels = 3
    cfg.architectures = ["LlamaForSequenceClassification"]
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path)
    model, tok = load_model(ModelConfig(id=str(tmp_path)))
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert tok is None
    assert not loader.is_causal_lm(model)


def test_local_base_model_folder(tmp_path: Path) -> None:
    from transformers import LlamaModel

    cfg = tiny_llama_config("tiny-llama-small")
    cfg.architectures = ["LlamaModel"]
    LlamaModel(cfg).save_pretrained(tmp_path)
    model, _ = load_model(ModelConfig(id=str(tmp_path)))
    assert type(model).__name__ == "LlamaModel"


def test_missing_pad_token_is_set() -> None:
    model, tok = build_tiny_llama(use_cache=False, name="tiny-llama-small")
    tok.pad_token = None
    model.generation_config.pad_token_id = None
    loader._prepare_tokenizer(tok, model)
    assert tok.pad_token == "</s>"
    assert model.generation_config.pad_token_id == 2


def test_session_load_times_imports_apart_from_loading() -> None:
    import perfsdk
    from perfsdk.models.loader import load_prepared, prepare_load

    prep = prepare_load(ModelConfig())
    assert prep.kind == "builtin" and prep.model_class.__name__ == "AutoModelForCausalLM"
    model, tok = load_prepared(prep)
    assert type(model).__name__ == "LlamaForCausalLM" and tok is not None
    with perfsdk.session({"collectors": {"energy": False, "utilization": False}}, store=None) as s:
        s.load()
    info = s.result.model
    assert info is not None and info.load_s is not None and info.load_s > 0
    assert info.import_s is not None and info.import_s >= 0
    assert s.load_event is not None and s.load_event.import_s == info.import_s
    with perfsdk.session({"collectors": {"energy": False, "utilization": False}}, store=None) as s:
        s.load(model=model, tokenizer=tok)  # adopted: nothing loaded, nothing imported
    assert s.result.model.load_s is None and s.result.model.import_s is None

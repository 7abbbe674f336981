"""The embedded vision-language and encoder-decoder models: builtin:tiny-llava and builtin:tiny-t5."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from perfsdk.config import ModelConfig
from perfsdk.models.loader import _model_class, load_model
from perfsdk.models.tiny import (IMAGE_TOKEN, build_tiny_llava, build_tiny_t5, tiny_llava_config,
                                 tiny_t5_config)


@pytest.fixture(scope="module", autouse=True)
def _cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.getbasetemp() / "perfsdk-cache-mm"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSDK_CACHE_DIR", str(root))
        yield root


def test_tiny_llava_config() -> None:
    cfg = tiny_llava_config()
    v, t = cfg.vision_config, cfg.text_config
    assert (v.image_size, v.patch_size, v.hidden_size, v.num_hidden_layers, v.num_attention_heads,
            v.intermediate_size) == (32, 8, 64, 2, 4, 128)
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
            t.intermediate_size, t.vocab_size) == (64, 2, 4, 2, 128, 4097)
    assert cfg.image_token_id == 4096 and cfg.architectures == ["LlavaForConditionalGeneration"]
    with pytest.raises(KeyError, match="not a Llama model"):
        from perfsdk.models.tiny import tiny_llama_config

        tiny_llama_config("tiny-llava")


def test_tiny_t5_config() -> None:
    cfg = tiny_t5_config()
    assert (cfg.d_model, cfg.d_kv, cfg.num_heads, cfg.d_ff, cfg.num_layers, cfg.num_decoder_layers,
            cfg.feed_forward_proj, cfg.vocab_size) == (64, 16, 4, 128, 2, 2, "gated-gelu", 4096)
    assert cfg.is_encoder_decoder and cfg.decoder_start_token_id == 3


def test_builds_parameters_and_cache() -> None:
    llava, proc = build_tiny_llava()
    # vision 80,640 (patch conv 12,288, class + positions 1,152, 2 layers of 33,472, 2 norms of 128)
    # + projector 8,320 + text 598,464 (embedding and LM head 4097 x 64 each, 2 layers of 36,992, norm 64)
    assert sum(p.numel() for p in llava.parameters()) == 687_424
    assert proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) == 4096 and len(proc.tokenizer) == 4097
    again, proc2 = build_tiny_llava()  # from the cache: same weights, processor read back
    assert all(torch.equal(a, b) for a, b in zip(llava.state_dict().values(), again.state_dict().values()))
    assert type(proc2).__name__ == "LlavaProcessor" and proc2.image_token_id == 4096
    t5, tok = build_tiny_t5()
    # shared embedding 262,144 (tied LM head), encoder 82,368, decoder 115,264
    assert sum(p.numel() for p in t5.parameters()) == 459_776
    assert len(tok) == 4096 and t5.generation_config.decoder_start_token_id == 3


def test_loader_picks_the_auto_class_and_the_processor() -> None:
    import transformers

    assert _model_class(tiny_llava_config()) is transformers.AutoModelForImageTextToText
    assert _model_class(tiny_t5_config()) is transformers.AutoModelForSeq2SeqLM
    model, proc = load_model(ModelConfig(id="builtin:tiny-llava", device="cpu"))
    assert type(model).__name__ == "LlavaForConditionalGeneration" and type(proc).__name__ == "LlavaProcessor"
    assert proc.tokenizer.padding_side == "left" and model.config.name_or_path == "builtin:tiny-llava"
    model, tok = load_model(ModelConfig(id="builtin:tiny-t5", device="cpu"))
    assert type(model).__name__ == "T5ForConditionalGeneration" and tok.pad_token_id == 3


def test_local_vlm_folder_loads_with_its_processor(tmp_path: Path) -> None:
    model, proc = build_tiny_llava(use_cache=False)
    model.save_pretrained(tmp_path / "vlm")
    proc.save_pretrained(tmp_path / "vlm")
    loaded, lproc = load_model(ModelConfig(id=str(tmp_path / "vlm"), device="cpu"))
    assert type(loaded).__name__ == "LlavaForConditionalGeneration" and type(lproc).__name__ == "LlavaProcessor"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))

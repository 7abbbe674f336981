"""The embedded model: config, tokenizer, deterministic builds, the disk cache."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from perfsdk.models import tiny
from perfsdk.models.tiny import (
    BUILD_MARKER,
    build_tiny_llama,
    build_tokenizer,
    builtin_model_names,
    cached_model_dir,
    default_cache_dir,
    ensure_tiny_llama,
    llama_variant_names,
    tiny_llama_config,
)

TEXT = "The processor reads memory through a cache, and a café serves naïve numbers: 42!"


@pytest.fixture(scope="module", autouse=True)
def _cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.getbasetemp() / "perfsdk-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSDK_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return build_tokenizer()


def _logits(model: torch.nn.Module, tok: object) -> torch.Tensor:
    enc = tok(["The cache grows with every token", "Hello"], return_tensors="pt", padding=True)  # type: ignore[operator]
    with torch.inference_mode():
        return model(**enc).logits


def test_config_fields_exact() -> None:
    cfg = tiny_llama_config()
    assert type(cfg).__name__ == "LlamaConfig"
    assert cfg.hidden_size == 256
    assert cfg.num_hidden_layers == 4
    assert cfg.num_attention_heads == 8
    assert cfg.num_key_value_heads == 4
    assert cfg.head_dim == 32
    assert cfg.intermediate_size == 704
    assert cfg.vocab_size == 4096
    assert cfg.max_position_embeddings == 2048
    assert cfg.tie_word_embeddings is False
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 3)
    assert cfg.architectures == ["LlamaForCausalLM"]


def test_variants_grow() -> None:
    assert llama_variant_names() == ["tiny-llama", "tiny-llama-small", "tiny-llama-medium", "tiny-llama-large"]
    assert builtin_model_names() == llama_variant_names() + ["tiny-llava", "tiny-t5"]
    shapes = [(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads)
              for c in (tiny_llama_config(n) for n in llama_variant_names())]
    assert shapes == [(256, 4, 8, 4), (128, 2, 4, 2), (512, 8, 8, 4), (768, 12, 12, 4)]
    assert {tiny_llama_config(n).vocab_size for n in llama_variant_names()} == {4096}
    with pytest.raises(KeyError, match="tiny-llama-huge"):
        tiny_llama_config("tiny-llama-huge")


def test_tokenizer_specials_and_round_trip(tokenizer: object) -> None:
    tok = tokenizer
    assert len(tok) == 4096  # type: ignore[arg-type]
    assert [tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id] == [0, 1, 2, 3]  # type: ignore[attr-defined]
    assert tok.padding_side == "left"  # type: ignore[attr-defined]
    ids = tok(TEXT)["input_ids"]  # type: ignore[operator]
    assert ids[0] == 1  # BOS first
    assert tok.decode(ids, skip_special_tokens=True) == TEXT  # type: ignore[attr-defined]
    # corpus words are single tokens
    assert tok.convert_ids_to_tokens(tok("The processor")["input_ids"]) == ["<s>", "The", "Ġprocessor"]  # type: ignore[attr-defined]


def test_tokenizer_left_padding(tokenizer: object) -> None:
    enc = tokenizer(["a cache", "The processor reads memory"], padding=True)  # type: ignore[operator]
    short, long = enc["input_ids"]
    assert len(short) == len(long) == 5
    assert short[:2] == [3, 3]  # pad id on the left
    assert enc["attention_mask"][0] == [0, 0, 1, 1, 1]


def test_tokenizer_deterministic(tokenizer: object) -> None:
    again = build_tokenizer()
    assert again.get_vocab() == tokenizer.get_vocab()  # type: ignore[attr-defined]
    assert again(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]  # type: ignore[operator]


def test_fresh_and_cached_builds_give_same_logits(tmp_path: Path) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    fresh_a, tok_a = build_tiny_llama(a_dir)  # builds and saves
    target = cached_model_dir("tiny-llama", a_dir)
    assert (target / BUILD_MARKER).is_file()
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(os.listdir(target))
    cached, tok_c = build_tiny_llama(a_dir)  # loads from the cache
    fresh_b, _ = build_tiny_llama(b_dir)  # another fresh build
    uncached, _ = build_tiny_llama(use_cache=False)
    ref = _logits(fresh_a, tok_a)
    assert ref.shape == (2, 7, 4096)
    for other in (cached, fresh_b, uncached):
        assert torch.equal(_logits(other, tok_c), ref)
    assert sum(p.numel() for p in cached.parameters()) == 5_048_576
    assert cached.generation_config.eos_token_id == 2
    assert cached.generation_config.pad_token_id == 3
    assert not cached.training
    # only the finished folder is left, no temporary ones
    assert os.listdir(a_dir) == [target.name]


def test_build_leaves_global_rng_untouched(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    build_tiny_llama(use_cache=False, name="tiny-llama-small")
    assert torch.equal(torch.rand(4), expected)


def test_default_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    assert cached_model_dir("tiny-llama").parent == tmp_path / "models"
    assert cached_model_dir("tiny-llama").name.startswith("tiny-llama-")
    assert cached_model_dir("tiny-llama") != cached_model_dir("tiny-llama-small")


def test_cache_key_changes_with_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    before = tiny.build_key("tiny-llama")
    monkeypatch.setattr(tiny, "SEED", tiny.SEED + 1)
    assert tiny.build_key("tiny-llama") != before


def test_save_keeps_an_existing_finished_build(tmp_path: Path) -> None:
    model, tok = build_tiny_llama(use_cache=False, name="tiny-llama-small")
    target = tmp_path / "tiny-llama-small-x"
    target.mkdir()
    (target / BUILD_MARKER).write_text("{}")
    tiny._save_atomically(model, tok, target, "tiny-llama-small")  # loses the race: no error
    assert os.listdir(tmp_path) == [target.name]
    assert os.listdir(target) == [BUILD_MARKER]


def _build_into(cache_dir: str, queue: Any) -> None:
    queue.put(str(ensure_tiny_llama("tiny-llama-small", cache_dir)))


def test_concurrent_builders_share_one_folder(tmp_path: Path) -> None:
    # forked processes inherit the imported modules, so this stays fast
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_into, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    paths = {queue.get(timeout=5) for _ in procs}
    assert len(paths) == 1
    (folder,) = paths
    assert os.listdir(tmp_path) == [Path(folder).name]
    model, tok = tiny.load_cached(folder)
    assert model.config.num_hidden_layers == 2
    assert len(tok) == 4096


def test_ensure_builds_once(tmp_path: Path) -> None:
    first = ensure_tiny_llama("tiny-llama-small", tmp_path)
    mtime = (first / BUILD_MARKER).stat().st_mtime_ns
    assert ensure_tiny_llama("tiny-llama-small", tmp_path) == first
    assert (first / BUILD_MARKER).stat().st_mtime_ns == mtime


def test_generates_32_tokens_batch_4(tokenizer: object) -> None:
    model, tok = build_tiny_llama()
    enc = tok(["The processor reads memory"] * 4, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert out.shape == (4, enc["input_ids"].shape[1] + 32)
    # greedy decoding of identical prompts gives identical rows
    assert all(torch.equal(out[0], out[i]) for i in range(1, 4))


def test_unwritable_default_cache_falls_back_to_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")  # a file where the cache folder should be: mkdir fails
    monkeypatch.setenv("PERFSDK_CACHE_DIR", str(blocker))
    monkeypatch.setattr(tiny.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    folder = ensure_tiny_llama("tiny-llama-small")
    assert folder.parent == tmp_path / "tmp" / "perfsdk" / "models"
    assert (folder / BUILD_MARKER).is_file()

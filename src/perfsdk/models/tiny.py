"""The embedded model: ``builtin:tiny-llama`` and its size variants.

A small Llama-architecture ``transformers`` model with random weights drawn from a fixed seed,
and a byte-level BPE tokenizer trained locally on the bundled text ``data/corpus.txt``. Nothing
is downloaded. The first build is saved with ``save_pretrained`` into a cache folder whose name
carries a hash of everything that determines the result (config, corpus, seed, library
versions); later loads read that folder. Builds are deterministic: a fresh build and a cached one
give the same weights and the same tokenizer.

Cache location: ``$PERFSDK_CACHE_DIR/models`` when the variable is set, else
``~/.cache/perfsdk/models``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("perfsdk.models.tiny")

#: Seed for the random weights of every variant.
SEED = 20240611
#: Bumped whenever the build procedure changes, so old cache folders are not reused.
BUILDER_VERSION = 1
#: Special tokens, in id order: unk=0, bos=1, eos=2, pad=3.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
#: Marker written last into a finished cache folder.
BUILD_MARKER = "perfsdk-build.json"

_BASE_CONFIG_FILE = "tiny-llama.json"
_VARIANTS_FILE = "tiny-llama-variants.json"
_CORPUS_FILE = "corpus.txt"
_CONFIG_ONLY_KEYS = ("architectures", "model_type", "unk_token_id")
# Weight init touches torch's global RNG (forked and restored); serialise builds in-process.
_BUILD_LOCK = threading.Lock()


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence ``transformers`` progress bars while saving or loading (library code stays quiet)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _read_data(name: str) -> str:
    return (resources.files("perfsdk.models") / "data" / name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _variants() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(_read_data(_VARIANTS_FILE))
    return data


def builtin_model_names() -> list[str]:
    """Names of the embedded models, without the ``builtin:`` prefix."""
    return list(_variants())


def _config_dict(name: str) -> dict[str, Any]:
    variants = _variants()
    if name not in variants:
        raise KeyError(f"unknown embedded model {name!r} (available: {', '.join(variants)})")
    base: dict[str, Any] = json.loads(_read_data(_BASE_CONFIG_FILE))
    base.update(variants[name])
    return base


def tiny_llama_config(name: str = "tiny-llama") -> Any:
    """The ``LlamaConfig`` of an embedded model (``tiny-llama`` or one of its size variants)."""
    from transformers import LlamaConfig

    data = _config_dict(name)
    kwargs = {k: v for k, v in data.items() if k not in _CONFIG_ONLY_KEYS}
    cfg = LlamaConfig(**kwargs)
    cfg.architectures = list(data.get("architectures", ["LlamaForCausalLM"]))
    cfg.dtype = "float32"
    return cfg


def corpus_text() -> str:
    """The bundled English text the tokenizer is trained on."""
    return _read_data(_CORPUS_FILE)


def build_key(name: str = "tiny-llama") -> str:
    """Hash of everything that determines a build: config, corpus, seed and library versions."""
    import tokenizers
    import torch
    import transformers

    payload = json.dumps(
        {
            "config": _config_dict(name),
            "corpus_sha256": hashlib.sha256(corpus_text().encode("utf-8")).hexdigest(),
            "seed": SEED,
            "builder": BUILDER_VERSION,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def default_cache_dir() -> Path:
    """Folder holding built embedded models (``$PERFSDK_CACHE_DIR/models`` or ``~/.cache/perfsdk/models``)."""
    root = os.environ.get("PERFSDK_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "perfsdk"
    return base / "models"


def cached_model_dir(name: str = "tiny-llama", cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the build of ``name`` lives (or will live) in the cache."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / f"{name}-{build_key(name)}"


def build_tokenizer(vocab_size: int | None = None) -> Any:
    """Train the byte-level BPE tokenizer on the bundled corpus; exactly ``vocab_size`` ids.

    Merges learned from the corpus fill the vocabulary first; any ids left over (the corpus is
    small) become unreachable ``<reserved_N>`` entries so that the tokenizer and the model's
    embedding table have the same size. Returns a left-padding ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size is None:
        vocab_size = int(_config_dict("tiny-llama")["vocab_size"])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    lines = [line for line in corpus_text().splitlines() if line.strip()]
    trained.train_from_iterator(lines, trainer=trainer)

    state = json.loads(trained.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in state["model"]["merges"]]
    if len(vocab) > vocab_size:  # pragma: no cover - the trainer respects vocab_size
        raise RuntimeError(f"tokenizer has {len(vocab)} ids, more than vocab_size {vocab_size}")
    for i in range(vocab_size - len(vocab)):
        vocab[f"<reserved_{i}>"] = len(vocab)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    bos, bos_id = SPECIAL_TOKENS[1], vocab[SPECIAL_TOKENS[1]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=SPECIAL_TOKENS[0],
        bos_token=SPECIAL_TOKENS[1],
        eos_token=SPECIAL_TOKENS[2],
        pad_token=SPECIAL_TOKENS[3],
        padding_side="left",
        model_max_length=int(_config_dict("tiny-llama")["max_position_embeddings"]),
    )


def _build_fresh(name: str) -> tuple[Any, Any]:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    config = tiny_llama_config(name)
    tokenizer = build_tokenizer(config.vocab_size)
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.config.name_or_path = f"builtin:{name}"
    model.eval()
    return model, tokenizer


def _save_atomically(model: Any, tokenizer: Any, target: Path, name: str) -> None:
    """Write into a temporary sibling folder, then rename it into place in one step.

    Concurrent builders each write their own temporary folder; the first rename wins and the
    others discard theirs, so readers never see a half-written folder.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        from perfsdk.store import dir_mode

        os.chmod(tmp, dir_mode())  # a shared cache stays readable: mkdtemp makes it private
        with quiet_transformers():
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / BUILD_MARKER).write_text(
            json.dumps({"name": name, "key": build_key(name), "seed": SEED}, indent=2), encoding="utf-8"
        )
        try:
            os.rename(tmp, target)
        except OSError:
            # Another builder renamed its folder into place first: keep theirs.
            if not (target / BUILD_MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_tiny_llama(name: str = "tiny-llama", cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the cache folder of ``name``, building and saving it first if needed."""
    target = cached_model_dir(name, cache_dir)
    if (target / BUILD_MARKER).is_file():
        return target
    model, tokenizer = _build_fresh(name)
    try:
        _save_atomically(model, tokenizer, target, name)
    except OSError as err:
        if cache_dir is not None:
            raise
        # e.g. a read-only home folder: fall back to the system temporary folder
        fallback = cached_model_dir(name, Path(tempfile.gettempdir()) / "perfsdk" / "models")
        log.warning("model cache not writable, using a temporary folder", cache=str(target.parent),
                    fallback=str(fallback.parent), error=str(err))
        if not (fallback / BUILD_MARKER).is_file():
            _save_atomically(model, tokenizer, fallback, name)
        return fallback
    return target


def load_cached(path: str | os.PathLike[str], **model_kwargs: Any) -> tuple[Any, Any]:
    """Load a built embedded model from its cache folder (``from_pretrained`` kwargs pass through)."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    with quiet_transformers():
        model = LlamaForCausalLM.from_pretrained(os.fspath(path), **model_kwargs)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(os.fspath(path), padding_side="left")
    model.eval()
    return model, tokenizer


def build_tiny_llama(
    cache_dir: str | os.PathLike[str] | None = None, *, name: str = "tiny-llama", use_cache: bool = True
) -> tuple[Any, Any]:
    """Build (or load from the cache) an embedded model: ``(LlamaForCausalLM, tokenizer)``.

    ``cache_dir`` holds the built folders (default :func:`default_cache_dir`). With
    ``use_cache=False`` nothing is read or written. The model is float32, on CPU, in eval mode.
    """
    if not use_cache:
        return _build_fresh(name)
    target = cached_model_dir(name, cache_dir)
    if (target / BUILD_MARKER).is_file():
        return load_cached(target)
    model, tokenizer = _build_fresh(name)
    _save_atomically(model, tokenizer, target, name)
    return model, tokenizer

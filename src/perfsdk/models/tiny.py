"""The embedded models: ``builtin:tiny-llama`` (and size variants), ``builtin:tiny-llava``,
``builtin:tiny-t5``.

A small Llama-architecture ``transformers`` model with random weights drawn from a fixed seed,
and a byte-level BPE tokenizer trained locally on the bundled text ``data/corpus.txt``. Nothing
is downloaded. ``tiny-llava`` is a vision-language model (a CLIP vision tower and a projector in
front of a small Llama text model) with a processor built locally from the same tokenizer (plus
an ``<image>`` token) and a CLIP image processor; ``tiny-t5`` is a T5 encoder-decoder using the
same tokenizer. The first build is saved with ``save_pretrained`` into a cache folder whose name
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
    """Silence ``transformers`` progress bars and warnings while saving or loading (library code
    stays quiet)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    # loading reports (weights missing or unused, e.g. with model.config_overrides) are not errors
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if was_enabled:
            hf_logging.enable_progress_bar()


def _read_data(name: str) -> str:
    return (resources.files("perfsdk.models") / "data" / name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _variants() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(_read_data(_VARIANTS_FILE))
    return data


#: The image placeholder token of ``tiny-llava`` (id 4096, after the 4096 text ids).
IMAGE_TOKEN = "<image>"

#: ``builtin:tiny-llava``: a CLIP vision tower (32x32 pixels in 8x8 patches: 16 patch tokens plus
#: a class token) and a two-layer GELU projector in front of a small Llama text model. The
#: projector takes the features of the second-to-last vision layer without the class token
#: (``vision_feature_select_strategy: default``), so each image gives 16 vision tokens.
TINY_LLAVA_CONFIG: dict[str, Any] = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "image_token_id": 4096,
    "projector_hidden_act": "gelu",
    "vision_feature_select_strategy": "default",
    "vision_feature_layer": -2,
    "vision_config": {
        "model_type": "clip_vision_model",
        "image_size": 32,
        "patch_size": 8,
        "num_channels": 3,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_act": "quick_gelu",
    },
    "text_config": {
        "model_type": "llama",
        "vocab_size": 4097,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
    },
    "tie_word_embeddings": False,
}

#: ``builtin:tiny-t5``: a T5 v1.1-style encoder-decoder (gated GELU feed-forward), 2 encoder and
#: 2 decoder layers, with the tiny-llama tokenizer's 4096 ids; the decoder starts from ``<pad>``.
TINY_T5_CONFIG: dict[str, Any] = {
    "architectures": ["T5ForConditionalGeneration"],
    "model_type": "t5",
    "vocab_size": 4096,
    "d_model": 64,
    "d_kv": 16,
    "num_heads": 4,
    "d_ff": 128,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "feed_forward_proj": "gated-gelu",
    "is_encoder_decoder": True,
    "pad_token_id": 3,
    "eos_token_id": 2,
    "decoder_start_token_id": 3,
}

_OTHER_MODELS: dict[str, dict[str, Any]] = {"tiny-llava": TINY_LLAVA_CONFIG, "tiny-t5": TINY_T5_CONFIG}


def llama_variant_names() -> list[str]:
    """``tiny-llama`` and its size variants (the embedded Llama models)."""
    return list(_variants())


def builtin_model_names() -> list[str]:
    """Names of the embedded models, without the ``builtin:`` prefix."""
    return llama_variant_names() + list(_OTHER_MODELS)


def _config_dict(name: str) -> dict[str, Any]:
    if name in _OTHER_MODELS:
        return json.loads(json.dumps(_OTHER_MODELS[name]))
    variants = _variants()
    if name not in variants:
        raise KeyError(f"unknown embedded model {name!r} (available: {', '.join(builtin_model_names())})")
    base: dict[str, Any] = json.loads(_read_data(_BASE_CONFIG_FILE))
    base.update(variants[name])
    return base


def tiny_llama_config(name: str = "tiny-llama") -> Any:
    """The ``LlamaConfig`` of an embedded model (``tiny-llama`` or one of its size variants)."""
    from transformers import LlamaConfig

    if name in _OTHER_MODELS:
        raise KeyError(f"{name!r} is not a Llama model (use tiny_llava_config / tiny_t5_config)")
    data = _config_dict(name)
    kwargs = {k: v for k, v in data.items() if k not in _CONFIG_ONLY_KEYS}
    cfg = LlamaConfig(**kwargs)
    cfg.architectures = list(data.get("architectures", ["LlamaForCausalLM"]))
    cfg.dtype = "float32"
    return cfg


def tiny_llava_config() -> Any:
    """The ``LlavaConfig`` of ``builtin:tiny-llava``."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    data = _config_dict("tiny-llava")
    vision = {k: v for k, v in data.pop("vision_config").items() if k != "model_type"}
    text = {k: v for k, v in data.pop("text_config").items() if k != "model_type"}
    archs = data.pop("architectures")
    data.pop("model_type")
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(**vision), text_config=LlamaConfig(**text), **data)
    cfg.architectures = list(archs)
    cfg.dtype = "float32"
    return cfg


def tiny_t5_config() -> Any:
    """The ``T5Config`` of ``builtin:tiny-t5``."""
    from transformers import T5Config

    data = _config_dict("tiny-t5")
    archs = data.pop("architectures")
    data.pop("model_type")
    cfg = T5Config(**data)
    cfg.architectures = list(archs)
    cfg.dtype = "float32"
    return cfg


def build_llava_processor(tokenizer: Any = None) -> Any:
    """The ``LlavaProcessor`` of ``builtin:tiny-llava``, built locally.

    The tokenizer is the tiny-llama tokenizer with ``<image>`` added as id 4096; the image
    processor resizes the shorter side to 32 pixels, center-crops 32x32 and normalizes with
    CLIP's mean and standard deviation. Each ``<image>`` in a prompt becomes 16 tokens.
    """
    from transformers import LlavaProcessor

    import transformers

    # the PIL flavour needs no torchvision; older releases only have CLIPImageProcessor
    image_processor_cls: Any = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor

    tok = tokenizer if tokenizer is not None else build_tokenizer(4096)
    if IMAGE_TOKEN not in tok.get_vocab():
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    cfg = TINY_LLAVA_CONFIG
    side = int(cfg["vision_config"]["image_size"])
    images = image_processor_cls(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=int(cfg["vision_config"]["patch_size"]),
                          vision_feature_select_strategy=cfg["vision_feature_select_strategy"],
                          image_token=IMAGE_TOKEN, num_additional_image_tokens=1)


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
    from perfsdk.envflags import text

    root = text("PERFSDK_CACHE_DIR")
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
    from transformers import GenerationConfig, LlamaForCausalLM, LlavaForConditionalGeneration, T5ForConditionalGeneration

    tokenizer: Any
    if name == "tiny-llava":
        config = tiny_llava_config()
        tokenizer = build_llava_processor()
        model_cls: Any = LlavaForConditionalGeneration
        ids = config.text_config
    elif name == "tiny-t5":
        config = tiny_t5_config()
        tokenizer = build_tokenizer(config.vocab_size)
        model_cls = T5ForConditionalGeneration
        ids = config
    else:
        config = tiny_llama_config(name)
        tokenizer = build_tokenizer(config.vocab_size)
        model_cls = LlamaForCausalLM
        ids = config
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = model_cls(config)
    model.generation_config = GenerationConfig(
        bos_token_id=getattr(ids, "bos_token_id", None), eos_token_id=ids.eos_token_id, pad_token_id=ids.pad_token_id,
        decoder_start_token_id=getattr(ids, "decoder_start_token_id", None),
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
    """Load a built embedded model from its cache folder (``from_pretrained`` kwargs pass through).

    Returns ``(model, tokenizer)``; for ``tiny-llava`` the second item is its processor.
    """
    from transformers import (
        AutoProcessor,
        LlamaForCausalLM,
        LlavaForConditionalGeneration,
        PreTrainedTokenizerFast,
        T5ForConditionalGeneration,
    )

    folder = os.fspath(path)
    model_type = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    model: Any
    with quiet_transformers():
        if model_type == "llava":
            model = LlavaForConditionalGeneration.from_pretrained(folder, **model_kwargs)
            tokenizer = AutoProcessor.from_pretrained(folder)
        else:
            cls = T5ForConditionalGeneration if model_type == "t5" else LlamaForCausalLM
            model = cls.from_pretrained(folder, **model_kwargs)
            tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, padding_side="left")
    model.eval()
    return model, tokenizer


def build_tiny_llama(
    cache_dir: str | os.PathLike[str] | None = None, *, name: str = "tiny-llama", use_cache: bool = True
) -> tuple[Any, Any]:
    """Build (or load from the cache) an embedded model: ``(model, tokenizer)``.

    ``name`` is any of :func:`builtin_model_names` (``tiny-llava`` gives its processor as the
    tokenizer). ``cache_dir`` holds the built folders (default :func:`default_cache_dir`). With
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


def build_tiny_llava(cache_dir: str | os.PathLike[str] | None = None, *, use_cache: bool = True) -> tuple[Any, Any]:
    """``builtin:tiny-llava``: ``(LlavaForConditionalGeneration, LlavaProcessor)``."""
    return build_tiny_llama(cache_dir, name="tiny-llava", use_cache=use_cache)


def build_tiny_t5(cache_dir: str | os.PathLike[str] | None = None, *, use_cache: bool = True) -> tuple[Any, Any]:
    """``builtin:tiny-t5``: ``(T5ForConditionalGeneration, tokenizer)``."""
    return build_tiny_llama(cache_dir, name="tiny-t5", use_cache=use_cache)

"""Load a model and its tokenizer from a :class:`~perfsdk.config.ModelConfig`.

``model.id`` may be

- ``builtin:<name>``: an embedded model (:mod:`perfsdk.models.tiny`), built locally on first use
  and read from the disk cache afterwards;
- a local folder holding a ``transformers`` checkpoint (``./my-model``);
- a Hugging Face Hub id (``org/name``), passed through to ``from_pretrained``. It is read from
  the local Hugging Face cache when there; otherwise the Hub must be reachable. Before any
  download, a short connection check (:data:`HUB_PROBE_TIMEOUT_S`) decides: with
  ``HF_HUB_OFFLINE`` set, or no connection, an id that is not cached fails at once with a
  message saying how to point ``model.id`` at a local folder (instead of half a minute of
  retries); an id that is cached loads from the cache.

``model.config_overrides`` are set on the model's configuration before the model is built
(``AutoConfig.from_pretrained(..., **overrides)``): fewer layers than the checkpoint keep the
first ones, more get freshly initialized ones. An unknown field is an error naming it.

Every problem the user can fix is raised as :class:`~perfsdk.config.ConfigError` naming the
field (``model.id: folder ./x not found``), which the CLI turns into exit code 2.

Loading is two steps so that the load time is the model's: :func:`prepare_load` does what a
process does only once — importing ``transformers`` and the model's own modules (resolved
lazily by the library), the tokenizer library, building the library's one-time weight-name
tables, building an embedded model on first use — and reads the configuration;
:func:`load_prepared` then loads the weights and the tokenizer. The session times them apart
(``import_s`` and ``load_s``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import urllib.parse
import urllib.request
import warnings
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import structlog

from perfsdk.config import ConfigError, ModelConfig

log = structlog.get_logger("perfsdk.models.loader")

BUILTIN_PREFIX = "builtin:"
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
#: Seconds the Hub connection check may take before the Hub counts as unreachable.
HUB_PROBE_TIMEOUT_S = 1.0
#: File names that hold weights in a checkpoint folder.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (a function so tests can pretend)."""
    import torch

    return bool(torch.cuda.is_available())


def _mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; a requested device must exist."""
    if device == "auto":
        return "cuda" if _cuda_available() else "cpu"
    if device.startswith("cuda") and not _cuda_available():
        raise ConfigError(f"model.device: {device} requested but CUDA is not available on this machine")
    if device == "mps" and not _mps_available():
        raise ConfigError("model.device: mps requested but the MPS backend is not available on this machine")
    return device


def resolve_dtype(dtype: str, device: str = "cpu") -> Any:
    """``auto`` passes through (checkpoint's own dtype); other names become ``torch.dtype``.

    ``float8_e4m3fn`` loads in its compute dtype (bfloat16 on CUDA, float32 elsewhere); the
    linear layers are converted to float8 after loading (:mod:`perfsdk.models.float8`).
    """
    if dtype == "auto":
        return "auto"
    if dtype == "float8_e4m3fn":
        from perfsdk.models.float8 import compute_dtype

        return compute_dtype(device)
    import torch

    return getattr(torch, dtype)


def _check_dtype(cfg: ModelConfig, device: str) -> None:
    if cfg.dtype != "float8_e4m3fn":
        return
    if cfg.quantization != "none":
        raise ConfigError(f"model.dtype: float8_e4m3fn already quantizes the linear layers; "
                          f"set model.quantization: none (not {cfg.quantization})")
    from perfsdk.models.float8 import float8_status

    ok, why = float8_status(device)
    if not ok:
        raise ConfigError(f"model.dtype: float8_e4m3fn is not supported here: {why}")


def bnb_config(cfg: ModelConfig) -> Any:
    """The ``transformers.BitsAndBytesConfig`` for ``model.quantization: bnb-8bit | bnb-4bit``.

    4-bit uses ``bnb_4bit_quant_type`` (nf4 or fp4), ``bnb_4bit_compute_dtype`` (default: the
    model's dtype, float32 for ``auto``) and ``bnb_4bit_use_double_quant``.
    """
    import torch
    from transformers import BitsAndBytesConfig

    if cfg.quantization == "bnb-8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = cfg.bnb_4bit_compute_dtype or (cfg.dtype if cfg.dtype in ("float32", "float16", "bfloat16") else "float32")
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=cfg.bnb_4bit_quant_type,
                              bnb_4bit_compute_dtype=getattr(torch, compute),
                              bnb_4bit_use_double_quant=cfg.bnb_4bit_use_double_quant)


def _check_quantization(cfg: ModelConfig, device: str) -> None:
    q = cfg.quantization
    if q == "dynamic-int8":
        if device != "cpu":
            raise ConfigError(
                f"model.quantization: dynamic-int8 runs on CPU only, but model.device resolves to {device}; "
                "set model.device: cpu"
            )
        if cfg.dtype in ("float16", "bfloat16"):
            raise ConfigError(f"model.quantization: dynamic-int8 needs model.dtype float32 or auto, not {cfg.dtype}")
    elif q in ("bnb-8bit", "bnb-4bit"):
        if not device.startswith("cuda"):
            raise ConfigError(
                f"model.quantization: {q} needs a CUDA GPU, but model.device resolves to {device}"
                + ("" if _cuda_available() else " (no CUDA device on this machine)")
            )
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError(f"model.quantization: {q} needs the bitsandbytes package (pip install bitsandbytes)")


def _looks_like_path(model_id: str) -> bool:
    return (
        model_id.startswith((".", "/", "~"))
        or "\\" in model_id
        or model_id.count("/") > 1
        or (len(model_id) > 1 and model_id[1] == ":")
    )


def _resolve_source(cfg: ModelConfig, build: bool = True) -> tuple[str, str]:
    """Return ``(kind, location)``: kind is ``builtin``, ``local`` or ``hub``.

    With ``build=False`` an embedded model is only checked by name, not built.
    """
    mid = cfg.id.strip()
    if not mid:
        raise ConfigError("model.id: must not be empty")
    if mid.startswith(BUILTIN_PREFIX):
        from perfsdk.models.tiny import builtin_model_names, ensure_tiny_llama

        name = mid[len(BUILTIN_PREFIX):]
        names = builtin_model_names()
        if name not in names:
            avail = ", ".join(BUILTIN_PREFIX + n for n in names)
            raise ConfigError(f"model.id: unknown built-in model {mid!r} (available: {avail})")
        return "builtin", os.fspath(ensure_tiny_llama(name)) if build else mid
    path = Path(mid).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"model.id: {mid} is not a folder (expected a transformers checkpoint folder)")
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.id: folder {mid} has no config.json (not a transformers checkpoint)")
        if not has_weights(path):
            raise ConfigError(f"model.id: folder {mid} has a config.json but no weights "
                              f"({', '.join('*' + s for s in WEIGHT_SUFFIXES[:2])} files); save the model "
                              "with save_pretrained() into it, or point model.id at the folder that holds them")
        return "local", os.fspath(path)
    if _looks_like_path(mid):
        raise ConfigError(f"model.id: folder {mid} not found")
    return "hub", mid


def has_weights(folder: Path) -> bool:
    """Whether a checkpoint folder holds weight files (single, sharded or indexed)."""
    return any(p.is_file() and (p.name.endswith(WEIGHT_SUFFIXES) or p.name.endswith(".index.json"))
               for p in folder.iterdir())


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """Whether the user asked for offline mode (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_endpoint() -> str:
    """The Hub address ``from_pretrained`` would use (``HF_ENDPOINT``, else huggingface.co)."""
    env = os.environ.get("HF_ENDPOINT", "").strip()
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def hub_reachable(endpoint: str | None = None, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Whether a TCP connection to the Hub (or the proxy for it) opens within ``timeout_s``.

    Name resolution is inside the time limit too: the check runs in a daemon thread that is
    abandoned when it takes longer. Returns ``(reachable, reason)``.
    """
    url = urllib.parse.urlsplit(endpoint or hub_endpoint())
    proxy = urllib.request.getproxies().get(url.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    outcome: list[tuple[bool, str]] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                outcome.append((True, "reachable"))
        except OSError as exc:
            outcome.append((False, exc.strerror or str(exc) or type(exc).__name__))

    worker = threading.Thread(target=probe, name="perfsdk-hub-check", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return False, f"no answer within {timeout_s:g} s"
    return outcome[0]


def _hub_cached(mid: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(mid, "config.json", revision=revision), str)
    except Exception:  # a malformed id or cache folder: not usable from the cache
        return False


def _local_hint(mid: str) -> str:
    return (f"point model.id at a local folder holding the checkpoint (config.json and weights), e.g. "
            f"--set model.id=./models/{mid.rsplit('/', 1)[-1]}, or download {mid} once where the Hub is reachable")


def hub_access(cfg: ModelConfig) -> bool:
    """Decide how a Hub id loads: ``True`` = from the local cache only, ``False`` = from the Hub.

    Raises :class:`~perfsdk.config.ConfigError` at once when it can do neither: offline mode or
    no connection, and the id is not in the cache.
    """
    mid = cfg.id.strip()
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(mid)
    except Exception:
        raise ConfigError(f"model.id: {mid!r} is not a built-in model (builtin:...), an existing folder, "
                          "or a valid Hugging Face Hub id (org/name)") from None
    cached = _hub_cached(mid, cfg.revision)
    if hub_offline():
        if cached:
            return True
        raise ConfigError(f"model.id: {mid!r} is not a local folder and not in the Hugging Face cache, and "
                          f"HF_HUB_OFFLINE is set; {_local_hint(mid)}")
    ok, why = hub_reachable()
    if ok:
        return False
    if cached:
        log.warning("Hugging Face Hub unreachable; loading from the local cache", model=mid, endpoint=hub_endpoint(),
                    reason=why)
        return True
    raise ConfigError(f"model.id: {mid!r} is not a local folder and not in the Hugging Face cache, and the Hub "
                      f"({hub_endpoint()}) cannot be reached: {why}; {_local_hint(mid)}")


def check_model_available(cfg: ModelConfig) -> None:
    """Check that ``cfg.id`` can be loaded without loading it: an embedded name, a checkpoint
    folder with weights, or a Hub id that is cached or reachable (a short connection check).

    Raises the :class:`~perfsdk.config.ConfigError` that :func:`load_model` would, in well under
    two seconds.
    """
    kind, _ = _resolve_source(cfg, build=False)
    if kind == "hub":
        hub_access(cfg)


def _hub_error(mid: str, err: BaseException) -> ConfigError:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else "no network or no such model"
    return ConfigError(f"model.id: could not load {mid!r} from the Hugging Face Hub ({why}): {err}")


def takes_images(config: Any) -> bool:
    """Whether a model config describes a vision-language model (it has a vision config)."""
    return getattr(config, "vision_config", None) is not None


def _supports(auto_cls: Any, config: Any) -> bool:
    try:
        return type(config) in auto_cls._model_mapping
    except Exception:
        return False


def _model_class(config: Any) -> Any:
    """The ``transformers`` auto class to load ``config`` with.

    Causal LMs and classifiers by their ``architectures``; vision-language models (a
    ``vision_config``) as image-text-to-text (or vision-to-sequence, on versions that have it);
    encoder-decoders as sequence-to-sequence (text, else speech); the first of these auto classes
    that knows the config's type wins, anything else is ``AutoModel``.
    """
    import transformers

    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith(_CAUSAL_SUFFIXES) for a in archs):
        return transformers.AutoModelForCausalLM
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return transformers.AutoModelForSequenceClassification
    candidates: list[str] = []
    if takes_images(config):
        candidates += ["AutoModelForImageTextToText", "AutoModelForVision2Seq"]
    if getattr(config, "is_encoder_decoder", False):
        candidates += ["AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq"]
    for name in candidates:
        cls = getattr(transformers, name, None)
        if cls is not None and _supports(cls, config):
            return cls
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModel


def is_causal_lm(model: Any) -> bool:
    """Whether the model can ``generate`` text (a causal or seq2seq language model)."""
    return callable(getattr(model, "generate", None)) and getattr(model, "can_generate", lambda: False)()


def _quantize_dynamic_int8(model: Any) -> Any:
    import torch
    from torch import nn

    quantize_dynamic = torch.ao.quantization.quantize_dynamic
    with warnings.catch_warnings():
        # torch flags its quantized tensor types as deprecated; the API still works as documented.
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=False)


#: Files any of which makes a checkpoint folder's tokenizer loadable.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "vocab.txt", "sentencepiece.bpe.model")


def tokenizer_missing(location: str) -> str | None:
    """Why the checkpoint folder ``location`` has no tokenizer (None when it has one).

    ``transformers`` would otherwise build an empty tokenizer from nothing, whose every prompt
    encodes to zero tokens.
    """
    folder = Path(location)
    if not folder.is_dir() or any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    return f"{folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)})"


def _load_tokenizer(kind: str, location: str, cfg: ModelConfig, hf_config: Any = None, local_only: bool = False) -> Any:
    """The tokenizer, or for a vision-language model its processor (tokenizer + image processor);
    None for a checkpoint folder without tokenizer files."""
    from perfsdk.models.tiny import quiet_transformers

    if kind == "local":
        why = tokenizer_missing(location)
        if why is not None:
            log.warning("no tokenizer", model=cfg.id, reason=why)
            return None

    if hf_config is not None and takes_images(hf_config):
        try:
            from transformers import AutoProcessor

            with quiet_transformers():
                return AutoProcessor.from_pretrained(location, trust_remote_code=cfg.trust_remote_code,
                                                     revision=cfg.revision, local_files_only=local_only)
        except (OSError, ValueError, TypeError, KeyError) as err:
            log.warning("no processor could be loaded; images cannot be used", model=cfg.id, error=str(err))
    try:
        with quiet_transformers():
            if kind == "builtin":
                from transformers import PreTrainedTokenizerFast

                return PreTrainedTokenizerFast.from_pretrained(location, padding_side="left")
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(
                location, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision,
                local_files_only=local_only,
            )
    except (OSError, ValueError, TypeError, KeyError) as err:
        log.warning("no tokenizer could be loaded", model=cfg.id, error=str(err))
        return None


def _prepare_tokenizer(tokenizer: Any, model: Any) -> None:
    if tokenizer is None:
        return
    tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer  # a processor's own tokenizer
    if getattr(tokenizer, "pad_token", None) is None:
        fallback = getattr(tokenizer, "eos_token", None) or getattr(tokenizer, "unk_token", None)
        if fallback is not None:
            tokenizer.pad_token = fallback
    if is_causal_lm(model) and hasattr(tokenizer, "padding_side"):
        tokenizer.padding_side = "left"
    gc = getattr(model, "generation_config", None)
    if gc is not None and getattr(gc, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        gc.pad_token_id = tokenizer.pad_token_id


def check_model_config(cfg: ModelConfig) -> None:
    """Check ``cfg`` without loading anything heavy: device, quantization, and that ``model.id``
    names a known embedded model or an existing checkpoint folder (Hub ids are not contacted).

    Raises the same :class:`~perfsdk.config.ConfigError` that :func:`load_model` would.
    """
    device = resolve_device(cfg.device)
    _check_quantization(cfg, device)
    _check_dtype(cfg, device)
    _resolve_source(cfg, build=False)


@dataclass
class PreparedLoad:
    """What :func:`prepare_load` resolved: where the checkpoint is, its configuration and class."""

    cfg: ModelConfig
    device: str
    kind: str
    location: str
    hf_config: Any
    model_class: Any
    local_only: bool = False


def _warm_library(hf_config: Any, cls: Any) -> None:
    """Import the modules ``from_pretrained`` would import lazily and build its one-time tables.

    Each part is best effort: a ``transformers`` version without it simply skips it, and what is
    left is paid inside the load timer, as before.
    """
    try:  # the concrete class (e.g. LlamaForCausalLM) imports the model's module and modeling_utils
        mapping = getattr(cls, "_model_mapping", None)
        if mapping is not None:
            _ = mapping[type(hf_config)]
    except (KeyError, ValueError, ImportError, AttributeError):
        pass
    try:  # the checkpoint key-renaming tables: about a thousand regular expressions, compiled once
        from transformers import conversion_mapping

        conversion_mapping.get_checkpoint_conversion_mapping(getattr(hf_config, "model_type", None))
    except (ImportError, AttributeError, TypeError, ValueError):
        pass
    try:
        import tokenizers  # noqa: F401
        from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
    except ImportError:
        pass


def prepare_load(cfg: ModelConfig) -> PreparedLoad:
    """Check ``cfg``, resolve the checkpoint, read its configuration and do the one-time imports."""
    from perfsdk.models.tiny import quiet_transformers

    device = resolve_device(cfg.device)
    _check_quantization(cfg, device)
    _check_dtype(cfg, device)
    kind, location = _resolve_source(cfg)
    local_only = hub_access(cfg) if kind == "hub" else False

    from transformers import AutoConfig

    try:
        with quiet_transformers():
            hf_config, unused = AutoConfig.from_pretrained(
                location, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision,
                return_unused_kwargs=True, local_files_only=local_only, **cfg.config_overrides,
            )
    except (OSError, ValueError, TypeError) as err:
        if kind == "hub" and not isinstance(err, TypeError):
            raise _hub_error(cfg.id, err) from None
        where = "model.config_overrides" if cfg.config_overrides else "model.id"
        raise ConfigError(f"{where}: {cfg.id}: cannot read the model configuration: {err}") from None
    if unused:
        name = next(iter(unused))
        raise ConfigError(f"model.config_overrides.{name}: not a field of {type(hf_config).__name__}")

    cls = _model_class(hf_config)
    _warm_library(hf_config, cls)
    return PreparedLoad(cfg, device, kind, location, hf_config, cls, local_only)


def load_model(cfg: ModelConfig) -> tuple[Any, Any]:
    """Load ``cfg`` into ``(model, tokenizer)``: on its device, in its dtype, quantized, in eval mode.

    The tokenizer is ``None`` when the checkpoint has none (e.g. a bare encoder folder); for a
    vision-language model it is the processor (``AutoProcessor``), whose tokenizer is prepared
    the same way. A missing pad token is set to the EOS (or UNK) token, and models that generate
    pad on the left.
    Raises :class:`~perfsdk.config.ConfigError` naming the field for anything the user can fix.
    """
    return load_prepared(prepare_load(cfg))


def load_prepared(prep: PreparedLoad) -> tuple[Any, Any]:
    """Load the weights and the tokenizer that :func:`prepare_load` resolved (see :func:`load_model`)."""
    from perfsdk.models.tiny import quiet_transformers

    cfg, device, kind, location, hf_config = prep.cfg, prep.device, prep.kind, prep.location, prep.hf_config
    local_only = prep.local_only
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(cfg.dtype, device), "trust_remote_code": cfg.trust_remote_code}
    if local_only:
        kwargs["local_files_only"] = True
    if cfg.config_overrides:
        kwargs["config"] = hf_config
    if cfg.revision is not None:
        kwargs["revision"] = cfg.revision
    if cfg.attn_implementation != "auto":
        kwargs["attn_implementation"] = cfg.attn_implementation
    if cfg.quantization in ("bnb-8bit", "bnb-4bit"):
        kwargs["quantization_config"] = bnb_config(cfg)
        kwargs["device_map"] = {"": device}

    cls = prep.model_class
    try:
        with quiet_transformers():
            model = cls.from_pretrained(location, **kwargs)
    except OSError as err:
        if kind == "hub":
            raise _hub_error(cfg.id, err) from None
        raise ConfigError(f"model.id: {cfg.id}: cannot load the weights: {err}") from None
    except (ValueError, ImportError, TypeError, RuntimeError) as err:
        text = str(err).lower()
        if "attn" in text or "attention" in text or "flash" in text:
            from perfsdk.models.internals import concrete_model_class, supported_attn_implementations

            real = concrete_model_class(cls, hf_config)
            alts = [a for a in supported_attn_implementations(real) if a != cfg.attn_implementation]
            raise ConfigError(f"model.attn_implementation: {cfg.attn_implementation} is not available for "
                              f"{getattr(real, '__name__', real)} (use auto, or one of: {', '.join(alts)})") from None
        if cfg.config_overrides:
            shown = ", ".join(f"{k}={v!r}" for k, v in cfg.config_overrides.items())
            raise ConfigError(f"model.config_overrides: the model cannot be built with {shown}: {err}") from None
        raise

    if "device_map" not in kwargs:
        model = model.to(device)
    if cfg.quantization == "dynamic-int8":
        model = _quantize_dynamic_int8(model)
    if cfg.dtype == "float8_e4m3fn":
        from perfsdk.models.float8 import quantize_float8

        model = quantize_float8(model)
    if kind == "builtin":
        model.config.name_or_path = cfg.id
    model.eval()

    tokenizer = _load_tokenizer(kind, location, cfg, hf_config, local_only)
    _prepare_tokenizer(tokenizer, model)
    return model, tokenizer

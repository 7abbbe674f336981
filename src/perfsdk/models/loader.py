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

Every problem the user can fix is raised as :class:`~perfsdk.config.ConfigError` naming the
field (``model.id: folder ./x not found``), which the CLI turns into exit code 2.
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


def resolve_dtype(dtype: str) -> Any:
    """``auto`` passes through (checkpoint's own dtype); other names become ``torch.dtype``."""
    if dtype == "auto":
        return "auto"
    import torch

    return getattr(torch, dtype)


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


def _model_class(config: Any) -> Any:
    import transformers

    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith(_CAUSAL_SUFFIXES) for a in archs):
        return transformers.AutoModelForCausalLM
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return transformers.AutoModelForSequenceClassification
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


def _load_tokenizer(kind: str, location: str, cfg: ModelConfig, local_only: bool = False) -> Any:
    from perfsdk.models.tiny import quiet_transformers

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
    _resolve_source(cfg, build=False)


def load_model(cfg: ModelConfig) -> tuple[Any, Any]:
    """Load ``cfg`` into ``(model, tokenizer)``: on its device, in its dtype, quantized, in eval mode.

    The tokenizer is ``None`` when the checkpoint has none (e.g. a bare encoder folder); a
    missing pad token is set to the EOS (or UNK) token, and causal models pad on the left.
    Raises :class:`~perfsdk.config.ConfigError` naming the field for anything the user can fix.
    """
    from perfsdk.models.tiny import quiet_transformers

    device = resolve_device(cfg.device)
    _check_quantization(cfg, device)
    kind, location = _resolve_source(cfg)
    local_only = hub_access(cfg) if kind == "hub" else False

    from transformers import AutoConfig

    try:
        with quiet_transformers():
            hf_config = AutoConfig.from_pretrained(
                location, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision,
                local_files_only=local_only,
            )
    except (OSError, ValueError) as err:
        if kind == "hub":
            raise _hub_error(cfg.id, err) from None
        raise ConfigError(f"model.id: {cfg.id}: cannot read the model configuration: {err}") from None

    kwargs: dict[str, Any] = {"dtype": resolve_dtype(cfg.dtype), "trust_remote_code": cfg.trust_remote_code}
    if local_only:
        kwargs["local_files_only"] = True
    if cfg.revision is not None:
        kwargs["revision"] = cfg.revision
    if cfg.attn_implementation != "auto":
        kwargs["attn_implementation"] = cfg.attn_implementation
    if cfg.quantization in ("bnb-8bit", "bnb-4bit"):
        from transformers import BitsAndBytesConfig

        if cfg.quantization == "bnb-8bit":
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True)
        kwargs["device_map"] = {"": device}

    cls = _model_class(hf_config)
    try:
        with quiet_transformers():
            model = cls.from_pretrained(location, **kwargs)
    except OSError as err:
        if kind == "hub":
            raise _hub_error(cfg.id, err) from None
        raise ConfigError(f"model.id: {cfg.id}: cannot load the weights: {err}") from None
    except (ValueError, ImportError) as err:
        text = str(err).lower()
        if "attn" in text or "attention" in text or "flash" in text:
            raise ConfigError(f"model.attn_implementation: {cfg.attn_implementation}: {err}") from None
        raise

    if "device_map" not in kwargs:
        model = model.to(device)
    if cfg.quantization == "dynamic-int8":
        model = _quantize_dynamic_int8(model)
    if kind == "builtin":
        model.config.name_or_path = cfg.id
    model.eval()

    tokenizer = _load_tokenizer(kind, location, cfg, local_only)
    _prepare_tokenizer(tokenizer, model)
    return model, tokenizer

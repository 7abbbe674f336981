"""The one place where perfsdk reads ``transformers`` internals.

Everything that depends on how ``transformers`` hands data to a model's ``forward`` (the name
of the argument that carries the KV cache, the cache classes and their methods, the attention
implementations a class supports, the range of releases the suite is tested on) sits here, so
that a rename in a new release is one change in this module, covered by its tests
(``tests/test_internals.py``).

Rules the rest of perfsdk relies on:

- A KV cache is found **by type**, whatever the keyword that carries it (``past_key_values``
  up to 5.23, ``cache`` from 5.24, or a positional argument): an instance of
  ``transformers.Cache``, or anything with a callable ``get_seq_length``, or a legacy tuple of
  per-layer ``(key, value)`` tensors.
- Phases are not read from the cache: the caller knows where a ``generate`` call starts, and
  its first top-module forward is the prefill, each later one a decode step. The cache only
  gives the context length (and, when it disagrees with the call order, a reason to say that
  the phase split cannot be trusted).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

#: ``transformers`` releases the test suite runs on: the declared lower bound and the newest
#: release tested (CI runs both ends).
TESTED_TRANSFORMERS = ("5.22.0", "5.24.0")

_INPUT_KEYS = ("input_ids", "decoder_input_ids", "inputs_embeds", "decoder_inputs_embeds")
_POSITION_KEYS = ("cache_position", "position_ids", "decoder_position_ids")


def _cache_base() -> type | None:
    try:
        from transformers import Cache
    except ImportError:  # pragma: no cover - every supported release has it
        return None
    return Cache


def is_cache(obj: Any) -> bool:
    """Whether ``obj`` is a KV cache: a ``transformers.Cache``, an object with
    ``get_seq_length()``, or a legacy tuple of per-layer ``(key, value)`` tensors."""
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return False
    base = _cache_base()
    if base is not None and isinstance(obj, base):
        return True
    if callable(getattr(obj, "get_seq_length", None)):
        return True
    return _is_legacy_cache(obj)


def _is_legacy_cache(obj: Any) -> bool:
    import torch

    if not isinstance(obj, (tuple, list)) or not obj:
        return False
    first = obj[0]
    return (isinstance(first, (tuple, list)) and len(first) >= 2
            and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in first[:2]))


def find_cache(args: Iterable[Any], kwargs: dict[str, Any]) -> Any | None:
    """The KV cache handed to a forward call, found by its type (keyword or positional)."""
    for value in kwargs.values():
        if is_cache(value):
            return value
    for value in args:
        if is_cache(value):
            return value
    return None


def cache_length(cache: Any) -> int | None:
    """Positions already held in ``cache`` (0 for no cache); None when it cannot be read."""
    if cache is None:
        return 0
    fn = getattr(cache, "get_seq_length", None)
    if callable(fn):
        try:
            n = int(fn())
        except Exception:
            return None
        if n == 0 and isinstance(getattr(cache, "layers", None), (list, tuple)):
            # a hybrid cache whose first layer holds no positions (linear attention, filled by
            # index): the longest of its layers
            n = max([0, *(_layer_length(layer) for layer in cache.layers)])
        return n
    if _is_legacy_cache(cache):
        return int(cache[0][0].shape[-2])
    return None


def _layer_length(layer: Any) -> int:
    fn = getattr(layer, "get_seq_length", None)
    try:
        return int(fn()) if callable(fn) else 0
    except Exception:
        return 0


def new_positions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Positions a forward call adds (its sequence length), from its inputs."""
    import torch

    for key in _INPUT_KEYS:
        t = kwargs.get(key)
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            return int(t.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        return int(args[0].shape[1])
    return None


def _first_position(kwargs: dict[str, Any]) -> int | None:
    import torch

    for key in _POSITION_KEYS:
        t = kwargs.get(key)
        if isinstance(t, torch.Tensor) and t.numel() > 0 and t.device.type != "meta":
            try:
                return int(t.reshape(-1)[0].item()) if key == "cache_position" else int(t[..., 0].min().item())
            except Exception:
                continue
    return None


def cached_positions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Positions already cached when a forward call starts: from the cache object it was handed
    (found by type), else from its position ids; None when neither can be read."""
    cache = find_cache(args, kwargs)
    if cache is not None:
        n = cache_length(cache)
        if n is not None:
            return n
    return _first_position(kwargs)


def forward_context(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(cached, new)`` positions of a forward call; either is None when unreadable."""
    return cached_positions(args, kwargs), new_positions(args, kwargs)


def context_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Cached plus new positions of a forward call, when both can be read."""
    past, new = forward_context(args, kwargs)
    if new is None:
        return None
    return (past or 0) + new


class PhaseTracker:
    """Attributes the top-module forwards of one ``generate`` call to phases.

    The first forward after :meth:`start` is the prefill (step 0), each later one a decode step
    (1, 2, …). The cache is read only for the context length and a consistency check: a forward
    after the first whose cache is known to be empty, or that feeds as many positions as the
    prefill with no cache at all, means the call order does not describe the phases (a model
    that scores the whole sequence again at every token, say), and :attr:`unavailable` then
    holds the reason.
    """

    def __init__(self) -> None:
        self.forwards = 0
        self.decode_steps = 0
        self.first_new: int | None = None
        self.unavailable: str | None = None

    def start(self) -> None:
        """A new ``generate`` call begins."""
        self.forwards = 0
        self.decode_steps = 0
        self.first_new = None

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int, int | None]:
        """``(phase, step, context_len)`` of the top-module forward that starts now."""
        past, new = forward_context(args, kwargs)
        self.forwards += 1
        if self.forwards == 1:
            phase, step = "prefill", 0
            self.first_new = new
        else:
            self.decode_steps += 1
            phase, step = "decode", self.decode_steps
            why = None
            if past == 0:
                why = "started from an empty KV cache"
            elif past is None and new is not None and self.first_new is not None and new >= self.first_new > 1:
                why = f"fed {new} positions without a cache, as many as the prefill"
            if why and self.unavailable is None:
                self.unavailable = (f"phase split unavailable: forward {self.forwards} of a generate call {why}, "
                                    f"so the call order does not tell prefill from decode")
        ctx = None if new is None else (past or 0) + new
        return phase, step, ctx


def forward_parameters(model: Any) -> set[str]:
    """Names of the keyword arguments ``model.forward`` takes."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return set()


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to ``model``'s forward, under the name this
    ``transformers`` release uses (``cache`` from 5.24, ``past_key_values`` before;
    ``cache_params`` for the state-space families of earlier releases)."""
    params = forward_parameters(model)
    if "cache" in params:
        return {"cache": cache}
    if "cache_params" in params and "past_key_values" not in params:
        return {"cache_params": cache}
    return {"past_key_values": cache}


def new_cache(config: Any, encoder_decoder: bool = False) -> Any:
    """An empty dynamic KV cache for ``config`` (self- and cross-attention for encoder-decoders)."""
    from transformers import DynamicCache

    def one() -> Any:
        try:
            return DynamicCache(config=config)
        except TypeError:
            return DynamicCache()

    if encoder_decoder:
        from transformers import EncoderDecoderCache

        return EncoderDecoderCache(one(), one())
    return one()


def cache_tensors(cache: Any) -> list[Any]:
    """Every distinct tensor a KV cache holds (keys, values, cross-attention, states)."""
    import torch
    from torch.utils._pytree import tree_flatten

    seen: dict[int, torch.Tensor] = {}

    def visit(obj: Any, depth: int) -> None:
        if depth > 6 or obj is None:
            return
        if isinstance(obj, torch.Tensor):
            seen.setdefault(id(obj), obj)
            return
        if isinstance(obj, (list, tuple)):
            for x in obj:
                visit(x, depth + 1)
            return
        if isinstance(obj, dict):
            for x in obj.values():
                visit(x, depth + 1)
            return
        if isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
            return
        attrs = getattr(obj, "__dict__", None)
        if attrs is None:
            flat, _ = tree_flatten(obj)
            for x in flat:
                if isinstance(x, torch.Tensor):
                    seen.setdefault(id(x), x)
            return
        for name, x in attrs.items():
            if name == "config" or callable(x) and not isinstance(x, torch.nn.Module):
                continue
            visit(x, depth + 1)

    visit(cache, 0)
    return list(seen.values())


def cache_bytes(cache: Any) -> int | None:
    """Bytes of the state tensors a KV cache holds: keys, values, recurrent states (tensors of two
    or more dimensions; position counters and other bookkeeping left out). None when ``cache``
    is not a cache."""
    if not is_cache(cache):
        return None
    return sum(int(t.numel()) * int(t.element_size()) for t in cache_tensors(cache) if t.dim() >= 2)


def cache_layer_bytes(cache: Any, layers: int) -> list[int] | None:
    """Bytes of the state each of a cache's ``layers`` layers holds (as :func:`cache_bytes`
    counts them), from its per-layer list (``layers`` in ``transformers`` caches) or the lists a
    family's own cache keeps by layer index (keys, values, convolution and recurrent states; a
    list grown as layers first write to it may stop at the last layer that does). None when those
    lists do not account for every byte of the cache."""
    total = cache_bytes(cache)
    if total is None:
        return None
    per_layer = getattr(cache, "layers", None)
    lists = [v for v in getattr(cache, "__dict__", {}).values() if isinstance(v, (list, tuple))]
    tries: list[list[Any]] = []
    if isinstance(per_layer, (list, tuple)) and len(per_layer) == layers:
        tries.append([per_layer])
    tries.append([v for v in lists if len(v) == layers])
    tries.append([v for v in lists if 0 < len(v) <= layers])
    for found in tries:
        out = [0] * layers
        seen: set[int] = set()
        for lst in found:
            for i, entry in enumerate(lst):
                for t in cache_tensors(entry) if entry is not None else ():
                    if t.dim() >= 2 and id(t) not in seen:
                        seen.add(id(t))
                        out[i] += int(t.numel()) * int(t.element_size())
        if sum(out) == total:
            return out
    return None


def output_cache(output: Any) -> Any | None:
    """The KV cache a forward or ``generate`` output carries (any attribute name), or None."""
    if output is None:
        return None
    values: Iterable[Any]
    if isinstance(output, dict):
        values = output.values()
    else:
        values = (getattr(output, k, None) for k in ("cache", "past_key_values"))
        keys = getattr(output, "keys", None)
        if callable(keys):
            try:
                values = [output[k] for k in keys()]
            except Exception:
                pass
    for v in values:
        if is_cache(v):
            return v
    return None


def attn_implementation(model: Any) -> str | None:
    """The attention implementation a loaded model runs (``sdpa``, ``eager``, …)."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    return str(impl) if impl else None


def supported_attn_implementations(model_class: Any) -> list[str]:
    """Attention implementations a model class declares support for (``eager`` always)."""
    out = ["eager"]
    if getattr(model_class, "_supports_sdpa", False):
        out.append("sdpa")
    if getattr(model_class, "_supports_flash_attn", False) or getattr(model_class, "_supports_flash_attn_2", False):
        out.append("flash_attention_2")
    if getattr(model_class, "_supports_flex_attn", False):
        out.append("flex_attention")
    return out


def concrete_model_class(model_class: Any, config: Any) -> Any:
    """The model class an ``AutoModel…`` class builds for ``config`` (``model_class`` itself when
    it is already concrete or cannot be resolved)."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None or config is None:
        return model_class
    try:
        from transformers.models.auto.auto_factory import _get_model_class

        return _get_model_class(config, mapping)
    except Exception:
        return model_class


def transformers_version() -> str | None:
    """The installed ``transformers`` release, or None."""
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return None


def tested_range_text() -> str:
    """``"5.22.0 – 5.24.0"``: the releases the suite is tested on."""
    low, high = TESTED_TRANSFORMERS
    return f"{low} – {high}"


def within_tested_range(installed: str | None) -> bool | None:
    """Whether ``installed`` lies in :data:`TESTED_TRANSFORMERS` (None if unknown)."""
    if not installed:
        return None
    try:
        from packaging.version import Version

        low, high = (Version(v) for v in TESTED_TRANSFORMERS)
        return low <= Version(installed) <= high
    except Exception:
        return None

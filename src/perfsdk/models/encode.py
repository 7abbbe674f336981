"""The ``encode`` phase: which parts of a model encode its inputs before the language model runs.

Encoder-decoder models (T5, BART, Whisper...) run their encoder once per ``generate``, before
the first decoder step; multimodal models run their vision (or audio) tower and its projector
on the pixels (or audio features) and hand the result to the language model as embeddings. Both
are a phase of their own, ``encode``, next to ``prefill`` and ``decode``.

The parts are found in the model itself, never in user stages:

- encoder-decoder: ``config.is_encoder_decoder`` and ``model.get_encoder()``;
- vision / audio: a ``vision_config`` / ``audio_config`` in the model config, and the
  shallowest modules named like a tower (``vision_tower``, ``vision_model``, ``visual``,
  ``audio_tower``...) or a projector (``multi_modal_projector``, ``mm_projector``...).

:class:`EncodeTracker` puts forward hooks on those modules for one ``generate`` call: the end
of the last encode module before the language model starts is where ``encode`` hands over to
``prefill`` (``transformers`` 5 runs the towers, and the encoder, before the first forward of
the language model; a model that runs them inside its first forward is handled too, the switch
then happens when its language model or decoder starts). The tracker also reads the real number
of vision tokens from the features the projector (else the tower) returns — not from the
placeholder tokens in the prompt (those only say how to share the total among the requests of
a batch).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

EncodeKind = Literal["encoder-decoder", "vision", "audio"]

#: Module names (last path component) of vision and audio towers.
TOWER_NAMES: dict[str, tuple[str, ...]] = {
    "vision": ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder", "vision_backbone",
               "vit"),
    "audio": ("audio_tower", "audio_model", "audio_encoder"),
}
#: Module names of the projectors that map tower features into the language model's embeddings.
PROJECTOR_NAMES = ("multi_modal_projector", "mm_projector", "vision_projector", "visual_projection",
                   "image_projector", "audio_projector", "connector", "merger")
#: Module names of the language model that consumes the encoded features.
LANGUAGE_MODEL_NAMES = ("language_model", "text_model", "llm")
#: ``generate`` keyword arguments that make a tower run.
MEDIA_INPUTS: dict[str, tuple[str, ...]] = {
    "vision": ("pixel_values", "pixel_values_images", "pixel_values_videos", "image_patches"),
    "audio": ("input_features", "input_values", "audio_values", "input_audio_embeds"),
}


def is_processor(obj: Any) -> bool:
    """A ``transformers`` processor (tokenizer plus image/audio processor), not a bare tokenizer."""
    return hasattr(obj, "tokenizer") and any(
        hasattr(obj, a) for a in ("image_processor", "feature_extractor", "video_processor"))


@dataclass
class EncodeParts:
    """The encode modules of one model and what follows them."""

    kind: EncodeKind
    modules: list[tuple[str, Any]]
    followers: list[tuple[str, Any]] = field(default_factory=list)
    features: tuple[str, Any] | None = None
    inputs: tuple[str, ...] = ()

    @property
    def paths(self) -> list[str]:
        """Module paths (as ``named_modules`` names them) of the encode modules."""
        return [p for p, _ in self.modules]

    def runs_for(self, kwargs: dict[str, Any]) -> bool:
        """Whether a ``generate`` call with these arguments runs the encode modules."""
        if self.kind == "encoder-decoder":
            return kwargs.get("encoder_outputs") is None
        return any(kwargs.get(k) is not None for k in self.inputs)


def _paths(model: Any) -> dict[int, str]:
    return {id(m): p for p, m in model.named_modules()}


def _shallowest(model: Any, names: tuple[str, ...], skip: set[int] | None = None) -> list[tuple[str, Any]]:
    """Modules whose last path component is in ``names``, leaving out those nested in another hit."""
    hits: list[tuple[str, Any]] = []
    for path, module in model.named_modules():
        if not path or path.rsplit(".", 1)[-1] not in names or (skip and id(module) in skip):
            continue
        if any(path.startswith(h + ".") for h, _ in hits):
            continue
        hits.append((path, module))
    return hits


def _nested_in(path: str, others: list[tuple[str, Any]]) -> bool:
    return any(path.startswith(p + ".") for p, _ in others)


def encode_parts(model: Any) -> EncodeParts | None:
    """The encode modules of ``model`` (an ``nn.Module``), or ``None`` when it has none."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "named_modules"):
        return None
    if getattr(cfg, "is_encoder_decoder", False) and callable(getattr(model, "get_encoder", None)):
        try:
            encoder = model.get_encoder()
        except Exception:
            encoder = None
        paths = _paths(model)
        if encoder is not None and encoder is not model and id(encoder) in paths:
            followers: list[tuple[str, Any]] = []
            get_decoder = getattr(model, "get_decoder", None)
            decoder = get_decoder() if callable(get_decoder) else None
            if decoder is not None and decoder is not model and id(decoder) in paths:
                followers.append((paths[id(decoder)], decoder))
            return EncodeParts("encoder-decoder", [(paths[id(encoder)], encoder)], followers, None, ())
    for kind in ("vision", "audio"):
        if getattr(cfg, f"{kind}_config", None) is None:
            continue
        towers = _shallowest(model, TOWER_NAMES[kind])  # type: ignore[index]
        if not towers:
            continue
        projectors = [(p, m) for p, m in _shallowest(model, PROJECTOR_NAMES) if not _nested_in(p, towers)]
        modules = towers + projectors
        followers = [(p, m) for p, m in _shallowest(model, LANGUAGE_MODEL_NAMES) if not _nested_in(p, modules)]
        features = projectors[-1] if projectors else towers[-1]
        return EncodeParts(kind, modules, followers, features, MEDIA_INPUTS[kind])  # type: ignore[arg-type]
    return None


_CACHE: weakref.WeakKeyDictionary[Any, EncodeParts | None] = weakref.WeakKeyDictionary()


def cached_encode_parts(model: Any) -> EncodeParts | None:
    """:func:`encode_parts`, computed once per model object."""
    try:
        return _CACHE[model]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable: no caching
        return encode_parts(model)
    parts = encode_parts(model)
    try:
        _CACHE[model] = parts
    except TypeError:
        pass
    return parts


def encode_paths(model: Any) -> set[str]:
    """Paths of ``model``'s encode modules (empty when it has none)."""
    parts = cached_encode_parts(model)
    return set(parts.paths) if parts is not None else set()


def feature_tokens(output: Any) -> tuple[int, int] | None:
    """``(items, tokens per item)`` of a tower or projector output.

    ``(N, T, H)`` features are N images (or clips) of T tokens; ``(T, H)`` features (towers
    that pack every image into one sequence) are one item of T tokens.
    """
    t = output
    if not hasattr(t, "shape"):
        t = getattr(output, "last_hidden_state", None)
        if t is None and isinstance(output, (tuple, list)) and output and hasattr(output[0], "shape"):
            t = output[0]
    shape = getattr(t, "shape", None)
    if shape is None or len(shape) < 2:
        return None
    if len(shape) == 2:
        return 1, int(shape[0])
    tokens = 1
    for d in shape[1:-1]:
        tokens *= int(d)
    return int(shape[0]), tokens


def split_per_request(total: int, batch_size: int, weights: list[int] | None = None) -> list[int]:
    """Split ``total`` vision tokens over the requests of a batch, in whole tokens.

    With ``weights`` (e.g. each request's image placeholders) the split is proportional to them
    (largest remainders get the leftover tokens, so the parts add up to ``total``); without, or
    when they are all zero, it is as even as whole tokens allow.
    """
    if batch_size < 1:
        return []
    if weights is None or len(weights) != batch_size or sum(weights) <= 0:
        weights = [1] * batch_size
    wsum = sum(weights)
    exact = [total * w / wsum for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(batch_size), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def placeholder_counts(model: Any, kwargs: dict[str, Any]) -> list[int] | None:
    """Image (or audio) placeholder tokens per request in ``input_ids``, when the config names
    the placeholder id; used only to split the real feature count over the requests."""
    cfg = getattr(model, "config", None)
    ids = kwargs.get("input_ids")
    token = None
    for name in ("image_token_id", "image_token_index", "audio_token_id", "audio_token_index"):
        token = getattr(cfg, name, None)
        if isinstance(token, int):
            break
    if not isinstance(token, int) or ids is None or not hasattr(ids, "shape") or len(ids.shape) != 2:
        return None
    try:
        return [int(x) for x in (ids == token).sum(dim=1).tolist()]
    except Exception:
        return None


class EncodeTracker:
    """Forward hooks that find where ``encode`` ends inside one ``generate`` call.

    ``on_end(t_ns)`` is called once, when the first follower (the language model or decoder, or
    the top module) starts after the encode modules ran; ``t_ns`` is when the last encode module
    finished. :meth:`vision_tokens` sums the feature tokens of every encode pass and splits them
    over the requests.
    """

    def __init__(self, model: Any, parts: EncodeParts, now: Callable[[], int], on_end: Callable[[int], None]) -> None:
        self.model = model
        self.parts = parts
        self.now = now
        self.on_end = on_end
        self.depth = 0
        self.last_end_ns: int | None = None
        self.switched = False
        self.feature_items: list[tuple[int, int]] = []
        self._handles: list[Any] = []
        self._start_handles: list[Any] = []

    def __enter__(self) -> EncodeTracker:
        try:
            for path, module in self.parts.modules:
                is_features = self.parts.features is not None and module is self.parts.features[1]
                self._handles.append(module.register_forward_pre_hook(self._pre))
                self._handles.append(module.register_forward_hook(self._make_post(is_features), always_call=True))
            for _, module in [("", self.model)] + list(self.parts.followers):
                self._start_handles.append(module.register_forward_pre_hook(self._start))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        for h in self._handles + self._start_handles:
            h.remove()
        self._handles.clear()
        self._start_handles.clear()

    def _pre(self, module: Any, args: Any) -> None:
        self.depth += 1

    def _make_post(self, is_features: bool) -> Callable[..., None]:
        def post(module: Any, args: Any, output: Any) -> None:
            self.depth = max(0, self.depth - 1)
            if self.depth == 0:
                self.last_end_ns = self.now()
            if is_features:
                ft = feature_tokens(output)
                if ft is not None:
                    self.feature_items.append(ft)

        return post

    def _start(self, module: Any, args: Any) -> None:
        if self.switched or self.depth > 0 or self.last_end_ns is None:
            return
        self.switched = True
        for h in self._start_handles:  # no cost on the decode steps
            h.remove()
        self._start_handles.clear()
        self.on_end(self.last_end_ns)

    def vision_tokens(self, batch_size: int, kwargs: dict[str, Any] | None = None) -> list[int] | None:
        """Real vision (or audio) tokens per request, from the features; ``None`` for encoders.

        The total is what the projector (else the tower) returned; it is split over the
        requests by their placeholder counts when the config names the placeholder token
        (requests with more images get more), else evenly.
        """
        if self.parts.kind == "encoder-decoder" or not self.feature_items:
            return None
        total = sum(items * tokens for items, tokens in self.feature_items)
        return split_per_request(total, batch_size, placeholder_counts(self.model, kwargs or {}))

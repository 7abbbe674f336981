"""Count FLOPs without weights: the architecture instantiated on the meta device.

A model is named by a local folder holding ``config.json`` (or the file itself), a built-in
name (``builtin:tiny-llama``), or a bundled config of a well-known architecture (see
:func:`~perfsdk.models.resolve.bundled_names`; names are resolved by
:func:`perfsdk.models.resolve.resolve_config`). The architecture is built from its config under
``torch.device("meta")`` (``AutoModelForCausalLM``, ``AutoModelForSeq2SeqLM`` for
encoder-decoders, ``AutoModelForImageTextToText`` for vision-language models): shapes only, no
memory for weights, so a 70B configuration counts on a small machine.

The encode phase runs first where the model has one: an encoder-decoder's encoder over the input
tokens, or a vision-language model's vision tower and projector over blank images of the
configured size (the text model's prompt then holds the image tokens as well).

``generate`` with ``G`` output tokens is replayed as transformers runs it: one prefill forward
over the ``T`` input positions with a KV cache and last-position logits (it yields the first
token), then ``G - 1`` decode forwards of one position each, decode step ``k`` attending
``T + k`` positions. Long generations are not replayed step by step: a decode step's FLOPs are
affine in its context length (per module), so steps 1, 2 and 3 are counted and the rest summed
in closed form once step 3 confirms the straight line. Where the line can bend — a sliding
window that fills during decode — every step is counted.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from perfsdk.capture import OperationCapture
from perfsdk.flops.analytic import generate_shape
from perfsdk.flops.counter import FlopsCount, count_analytic, count_from_records
from perfsdk.models.arch import Architecture, GenerateShape, UnsupportedArchitecture, architecture_from_config
from perfsdk.models.internals import cache_kwargs, output_cache
from perfsdk.models.resolve import UnknownModel, bundled_config, bundled_names, resolve_config

log = structlog.get_logger("perfsdk.flops.meta")


class ReplayUnavailable(ValueError):
    """The meta-device replay cannot run a config, for a reason it states itself (no
    text-generation class, images it cannot make): passed to the user as it is."""


def _architecture_or_none(config: Any) -> Architecture | None:
    try:
        return architecture_from_config(config)
    except (UnsupportedArchitecture, TypeError, ValueError):
        return None


def meta_model(config: Any, attn_implementation: str = "auto", dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Instantiate the generating architecture of ``config`` on the meta device (no weights).

    Causal LMs through ``AutoModelForCausalLM``; encoder-decoders (``config.is_encoder_decoder``)
    through ``AutoModelForSeq2SeqLM``; vision-language models (a ``vision_config``) through
    ``AutoModelForImageTextToText``. ``attn_implementation="auto"`` takes the one
    ``transformers`` picks for the family (sdpa where supported, else eager). Mixture-of-experts
    models (described as such, or built with fused expert weights that ``transformers`` routes
    through its grouped GEMM) are built in bfloat16 by default: PyTorch's meta kernel of that GEMM
    accepts only bfloat16 (FLOPs do not depend on the dtype; byte counts are rescaled to the
    simulated dtype from :attr:`CapturedGeneration.element_bytes`).
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM

    arch = _architecture_or_none(config)
    moe = dtype is None and arch is not None and arch.is_moe
    kwargs: dict[str, Any] = {}
    if attn_implementation != "auto":
        kwargs["attn_implementation"] = attn_implementation
    if dtype is not None or moe:
        kwargs["dtype"] = dtype or torch.bfloat16
    auto: Any = AutoModelForCausalLM
    if getattr(config, "is_encoder_decoder", False):
        auto = AutoModelForSeq2SeqLM
    elif getattr(config, "vision_config", None) is not None:
        auto = AutoModelForImageTextToText
    try:
        with _quiet(), torch.device("meta"):
            model = auto.from_config(config, **kwargs)
            if dtype is None and not moe and _routes_experts(model):
                model = auto.from_config(config, **{**kwargs, "dtype": torch.bfloat16})
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        model_type = getattr(config, "model_type", None) or type(config).__name__
        raise ReplayUnavailable(f"model type {model_type}: transformers has no {auto.__name__} for it; perfsdk "
                                f"counts and simulates models that generate text from token ids (causal LMs, "
                                f"encoder-decoders, vision-language models), not from audio or other inputs") from None
    return model.eval()


def _routes_experts(model: torch.nn.Module) -> bool:
    """Whether ``model`` has fused mixture-of-experts layers that ``transformers`` dispatches to an
    experts implementation (the dispatching wrapper marks each such module at construction)."""
    return any(hasattr(m, "_is_expert_parallel") for m in model.modules())


def meta_failure(config: Any, exc: BaseException) -> ValueError:
    """The error a user sees when a family's code cannot run on the meta device and no analytic
    description covers it (what it was, and why it failed)."""
    if isinstance(exc, ReplayUnavailable):
        return exc
    model_type = getattr(config, "model_type", None) or type(config).__name__
    tail = ", and no analytic description covers it" if _architecture_or_none(config) is None else ""
    return ValueError(f"model type {model_type}: its code could not run on the meta device "
                      f"({type(exc).__name__}: {exc}){tail}")


def _quiet() -> Any:
    try:
        from perfsdk.models.tiny import quiet_transformers
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return quiet_transformers()


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A weightless copy of a (possibly quantized) ``transformers`` model's architecture."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise TypeError(f"{type(model).__name__} has no transformers config: cannot rebuild it on the meta device")
    import copy

    cfg = copy.deepcopy(cfg)
    for attr in ("quantization_config",):
        if hasattr(cfg, attr):
            try:
                delattr(cfg, attr)
            except AttributeError:
                pass
    impl = getattr(cfg, "_attn_implementation", None) or "auto"
    return meta_model(cfg, attn_implementation=impl if impl in ("eager", "sdpa") else "auto")


def _flat_tensors(obj: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    if hasattr(obj, "to_tuple"):
        obj = obj.to_tuple()
    flat, _ = tree_flatten(obj)
    return [x for x in flat if isinstance(x, torch.Tensor)]


class _Replay:
    """Runs the forwards of ``generate`` on a meta-device model, phase by phase."""

    def __init__(self, model: torch.nn.Module, batch_size: int, input_tokens: int, images: int | None) -> None:
        self.model = model
        self.cfg = getattr(model, "config", None)
        self.arch = _architecture_or_none(self.cfg) if self.cfg is not None else None
        self._encoder_decoder = bool(getattr(self.cfg, "is_encoder_decoder", False))
        self.batch_size = batch_size
        self.dev = torch.device("meta")
        self.shape: GenerateShape | None = None
        self._pixels: torch.Tensor | None = None  # a family the description lacks: its images, by probe
        if self.arch is not None:
            self.shape = generate_shape(self.arch, batch_size, input_tokens, 0, images)
        else:
            self.shape = self._probe_shape(batch_size, input_tokens, images)
        self.prompt = self.shape.prompt_tokens
        self.input_tokens = input_tokens
        self.encoder_out: Any = None

    def _probe_shape(self, batch_size: int, input_tokens: int, images: int | None) -> GenerateShape:
        """What each phase processes, for a family read from its config alone: an encoder-decoder's
        encoder takes the prompt; a vision-language model's image tokens are the rows its own
        image-feature code returns for one blank image of the configured size."""
        if self._encoder_decoder:
            if images:
                raise ReplayUnavailable("images: the model has no vision tower")
            return GenerateShape(batch_size, input_tokens, 0, 0, 0, input_tokens, 1)
        vision = getattr(self.cfg, "vision_config", None)
        features = getattr(self.model, "get_image_features", None)
        if vision is None or not callable(features):
            if images:
                raise ReplayUnavailable("images: the model has no vision tower")
            return GenerateShape(batch_size, input_tokens, 0, 0, 0, 0, input_tokens)
        n = 1 if images is None else images
        if n == 0:
            return GenerateShape(batch_size, input_tokens, 0, 0, 0, 0, input_tokens)
        size = getattr(vision, "image_size", None)
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = int(getattr(vision, "num_channels", 3) or 3)
        if not isinstance(size, int):
            raise ReplayUnavailable(f"images: the vision config of {getattr(self.cfg, 'model_type', '?')} states "
                                    f"no image_size (its vision tower takes images of any size, which a config "
                                    f"alone does not fix); --images 0 counts the text model alone")
        dtype = next(self.model.parameters()).dtype
        px = torch.zeros((1, channels, size, size), device=self.dev, dtype=dtype)
        with torch.inference_mode():
            out = features(pixel_values=px)
        feats = [t for t in _flat_tensors(out) if t.dim() >= 2]
        if not feats:
            raise ReplayUnavailable("images: the model's image features could not be read")
        per_image = int(feats[0].shape[-2]) if feats[0].dim() >= 3 else int(feats[0].shape[0])
        self._pixels = px
        return GenerateShape(batch_size, input_tokens, 0, n, n * per_image, 0, input_tokens + n * per_image)

    def _ids(self, n: int) -> torch.Tensor:
        return torch.zeros((self.batch_size, n), dtype=torch.long, device=self.dev)

    def encode(self, cap: OperationCapture | None) -> None:
        """The encoder (encoder-decoder) or the vision tower and projector (vision-language)."""
        shape = self.shape
        if shape is None or not (self._encoder_decoder or shape.images):
            return
        if cap is not None:
            cap.set_phase("encode", step=0, context_len=shape.encoder_tokens or None)
        if self._encoder_decoder:
            self.encoder_out = self.model.get_encoder()(input_ids=self._ids(self.input_tokens))  # type: ignore[operator]
            return
        n_img = self.batch_size * shape.images
        dtype = next(self.model.parameters()).dtype
        if self.arch is not None and self.arch.encoder is not None:
            vis = self.arch.encoder
            px = torch.zeros((n_img, vis.num_channels, vis.image_size, vis.image_size), device=self.dev, dtype=dtype)
        else:
            assert self._pixels is not None
            px = self._pixels.expand(n_img, *self._pixels.shape[1:])
        self.model.get_image_features(pixel_values=px)  # type: ignore[operator]

    def _hidden_size(self) -> int:
        if self.arch is not None:
            return self.arch.hidden_size
        emb = self.model.get_input_embeddings()  # type: ignore[operator]
        return int(emb.weight.shape[-1])

    def forward(self, cap: OperationCapture | None, new: int, cache: Any, phase: str, step: int, context_len: int,
                logits_to_keep: int = 1) -> None:
        if cap is not None:
            cap.set_phase(phase, step=step, context_len=context_len)  # type: ignore[arg-type]
        own = isinstance(cache, _OwnCache)
        given = cache.value if own else cache
        kw = dict(use_cache=cache is not None, **cache_kwargs(self.model, given))
        if self._encoder_decoder:
            out = self.model(encoder_outputs=self.encoder_out, decoder_input_ids=self._ids(new), **kw)
        elif self.shape is not None and self.shape.images and phase != "decode":
            # the text model's prompt: text and image tokens, entering as embeddings
            embeds = torch.zeros((self.batch_size, new, self._hidden_size()), device=self.dev,
                                 dtype=next(self.model.parameters()).dtype)
            out = self.model(inputs_embeds=embeds, logits_to_keep=logits_to_keep, **kw)
        else:
            out = self.model(input_ids=self._ids(new), logits_to_keep=logits_to_keep, **kw)
        if own:
            cache.value = output_cache(out) or given

    def new_cache(self) -> Any:
        """An empty cache: a dynamic KV cache, or, for a family that builds a cache of its own
        (``generate`` hands it none), a holder of the one its first forward returns."""
        from perfsdk.models.internals import new_cache

        supports = getattr(self.model, "_supports_default_dynamic_cache", None)
        if callable(supports) and not supports():
            return _OwnCache()
        return new_cache(self.cfg, self._encoder_decoder)


class _OwnCache:
    """The cache a family builds itself, as its forward returns it (None before the first)."""

    def __init__(self) -> None:
        self.value: Any = None


def _cache_bytes(cache: Any) -> int | None:
    from perfsdk.models.internals import cache_bytes

    return cache_bytes(cache.value if isinstance(cache, _OwnCache) else cache)


def replay_shape(config: Any, batch_size: int, input_tokens: int, output_tokens: int,
                 images: int | None = None) -> GenerateShape:
    """What each phase of ``generate`` processes for ``config`` (any family ``transformers`` builds)."""
    from dataclasses import replace

    arch = _architecture_or_none(config)
    if arch is not None:
        return generate_shape(arch, batch_size, input_tokens, output_tokens, images)
    rep = _Replay(meta_model(_one_layer(config)), batch_size, input_tokens, images)
    assert rep.shape is not None
    return replace(rep.shape, output_tokens=output_tokens)


def _one_layer(config: Any) -> Any:
    """A one-layer copy of ``config`` when its layers are alike by their settings, else ``config``."""
    attr = _layers_attr(config)
    settings = _per_layer_settings(config, int(getattr(config, attr))) if attr else {}
    if any(len({repr(x) for x in v}) > 1 for v in settings.values()):
        return config
    shallow = _shallow_config(config, 1)
    return shallow if shallow is not None else config


def count_meta_generate(model: torch.nn.Module, batch_size: int, input_tokens: int, output_tokens: int,
                        *, exact: bool = False, images: int | None = None) -> FlopsCount:
    """Count ``generate`` (``output_tokens`` tokens from ``input_tokens``) on a meta-device model.

    ``images``: images per sequence of a vision-language model (default one).
    """
    rep = _Replay(model, batch_size, input_tokens, images)
    p = rep.prompt
    if output_tokens < 1:
        with torch.inference_mode(), OperationCapture(model, phase="forward", context_len=p) as cap:
            rep.encode(cap)
            # a fresh cache: without one, transformers derives positions from the mask by value
            # (impossible on the meta device); logits for every position, as a plain forward
            rep.forward(cap, p, rep.new_cache(), "forward", 0, p, logits_to_keep=0)
        res = count_from_records(cap.records, "torch", "meta-device capture")
        return res
    n_dec = output_tokens - 1
    windows = [w for w in (rep.arch.sliding_windows if rep.arch else _config_windows(rep.cfg)) if w is not None]
    bends = bool(windows) and p + n_dec > min(windows)
    run_all = exact or bends or n_dec <= 3
    counted = n_dec if run_all else 3
    with torch.inference_mode(), OperationCapture(model) as cap:
        rep.encode(cap)
        cache = rep.new_cache()
        rep.forward(cap, p, cache, "prefill", 0, p)
        for k in range(1, counted + 1):
            rep.forward(cap, 1, cache, "decode", k, p + k)
    result = count_from_records(cap.records, "torch", "meta-device capture")
    if run_all:
        return result
    # closed-form sum over decode steps 1..n_dec from steps 1, 2 (checked against step 3)
    per_step: dict[int, dict[str, int]] = {1: {}, 2: {}, 3: {}}
    per_step_macs = {1: 0, 2: 0, 3: 0}
    types_step: dict[int, dict[str, int]] = {1: {}, 2: {}, 3: {}}
    cats_step: dict[int, dict[str, int]] = {1: {}, 2: {}, 3: {}}
    for r in cap.records:
        if r.phase != "decode" or not r.flops:
            continue
        per_step[r.step][r.module_path] = per_step[r.step].get(r.module_path, 0) + r.flops
        types_step[r.step][r.module_type or "?"] = types_step[r.step].get(r.module_type or "?", 0) + r.flops
        cats_step[r.step][r.category] = cats_step[r.step].get(r.category, 0) + r.flops
    for r in cap.records:
        if r.phase == "decode":
            per_step_macs[r.step] += r.macs

    def affine(d: dict[int, dict[str, int]]) -> dict[str, int] | None:
        out: dict[str, int] = {}
        for key in set(d[1]) | set(d[2]) | set(d[3]):
            a, b, c = d[1].get(key, 0), d[2].get(key, 0), d[3].get(key, 0)
            if c - b != b - a:
                return None
            slope = b - a
            out[key] = n_dec * a + slope * n_dec * (n_dec - 1) // 2
        return out

    mods, types, cats = affine(per_step), affine(types_step), affine(cats_step)
    m1, m2, m3 = per_step_macs[1], per_step_macs[2], per_step_macs[3]
    if mods is None or types is None or cats is None or m3 - m2 != m2 - m1:
        log.info("decode FLOPs not affine in the context length; counting every step")
        return count_meta_generate(model, batch_size, input_tokens, output_tokens, exact=True, images=images)
    dec_macs = n_dec * m1 + (m2 - m1) * n_dec * (n_dec - 1) // 2
    pre = [r for r in cap.records if r.phase in ("encode", "prefill")]
    res = count_from_records(pre, "torch", "meta-device capture")
    res.flops_decode = sum(mods.values())
    res.macs_decode = dec_macs
    for src, dst in ((mods, res.modules), (types, res.module_types), (cats, res.categories)):
        for name, v in src.items():
            dst[name] = dst.get(name, 0) + v
    res.decode_forwards = n_dec
    res.forwards = result.forwards  # the steps actually counted
    res.notes.append(f"decode steps 4..{n_dec} summed in closed form: per-module FLOPs are affine in the context "
                     f"length (checked on steps 1-3)")
    return res


def _config_windows(config: Any) -> tuple[int | None, ...]:
    """Attention windows a config states, for a family the description lacks (any field naming one)."""
    out: list[int | None] = []
    for name in ("sliding_window", "attention_window", "window_size", "local_attention"):
        v = getattr(config, name, None)
        if isinstance(v, int) and v > 0:
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, int) and x > 0)
    return tuple(out)


_LAYER_RE = re.compile(r"^(?P<pre>.*?)\.(?P<idx>\d+)(?P<post>\..*)?$")


def _layers_attr(config: Any) -> str | None:
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(getattr(config, attr, None), int):
            return attr
    return None


def _per_layer_settings(config: Any, depth: int) -> dict[str, list[Any]]:
    """The config's settings given layer by layer: ``layer_types`` and every other top-level list
    of ``depth`` entries (which layers skip RoPE, which use experts, …). A list of layer indices
    that names every layer (Llama 4's ``moe_layers`` when every layer has experts) sets nothing
    apart and is left out: read as one value per layer, it would make every layer unlike the next."""
    every = list(range(depth))
    out = {k: v for k, v in config.to_dict().items() if isinstance(v, list) and len(v) == depth and v != every}
    types = getattr(config, "layer_types", None)  # a property in some families, not in to_dict
    if types is not None and len(types) == depth:
        out["layer_types"] = list(types)
    return out


def _shallow_config(config: Any, layers: int) -> Any | None:
    """A copy of ``config`` with its first ``layers`` decoder layers (None if it cannot be made:
    no layer count, or ``layer_types`` the copy cannot be given). Other lists of one entry per
    layer are left whole (layer ``i`` reads entry ``i``): a list that only happens to have as
    many entries as there are layers (Falcon-H1's multipliers) must not be cut."""
    import copy

    attr = _layers_attr(config)
    if attr is None:
        return None
    types = getattr(config, "layer_types", None)
    cfg = copy.deepcopy(config)
    setattr(cfg, attr, layers)
    if types:
        try:
            cfg.layer_types = list(types[:layers])
        except AttributeError:  # a read-only property some families derive from the layer count
            pass
        if list(getattr(cfg, "layer_types", None) or ()) != list(types[:layers]):
            return None
    if hasattr(cfg, "max_window_layers") and isinstance(cfg.max_window_layers, int):
        cfg.max_window_layers = min(cfg.max_window_layers, layers)
    return cfg


def _decoder_layers(model: torch.nn.Module, layers: int) -> tuple[str, torch.nn.ModuleList] | None:
    """The module path and list of ``model``'s ``layers`` decoder layers: of its module lists of
    that length (a family may keep other per-layer lists: rotary embeddings by layer type, …),
    the one holding the most parameters. None when there is none."""
    lists = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len(mod) == layers]
    if not lists:
        return None
    return max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))


def _layer_signatures(layers: torch.nn.ModuleList) -> list[Any]:
    """Per decoder layer (of a model built on the meta device, say), its modules and parameter
    shapes."""
    return [tuple((name, type(m).__name__, tuple(tuple(p.shape) for p in m.parameters(recurse=False)))
                  for name, m in layer.named_modules()) for layer in layers]


def uniform_layers(model: torch.nn.Module, layers: int) -> bool:
    """Whether every decoder layer of ``model`` (built, on the meta device say) has the same
    modules and parameter shapes: a config can make the first ``k`` layers dense and the rest
    mixture-of-experts, or give some layers no MLP, which a shallow copy would not show."""
    found = _decoder_layers(model, layers)
    return found is not None and len(set(_layer_signatures(found[1]))) == 1


def _pattern(keys: list[Any]) -> tuple[int, int, int]:
    """``(lead, period, second)``: after its first ``lead`` entries, ``keys`` repeats with
    ``period`` (``keys[i] == keys[i - period]`` for every ``i >= lead + period``); of all such
    pairs, the one whose second copy (:class:`LayerPlan`) holds the fewest layers."""
    ids = {k: n for n, k in enumerate(dict.fromkeys(keys))}
    seq = [ids[k] for k in keys]
    n, best = len(seq), (0, len(seq), 2 * len(seq))
    for p in range(1, n + 1):
        # the last layer unlike the layer one period before it ends the lead
        last = next((i for i in range(n - 1, p - 1, -1) if seq[i] != seq[i - p]), None)
        lead = 0 if last is None else last - p + 1
        second = lead + 2 * p + (n - lead) % p
        if second < best[2]:
            best = (lead, p, second)
    return best


@dataclass(frozen=True)
class LayerPlan:
    """How a deep model is counted from two shallow copies: after its first ``lead`` layers
    (often none), its layers repeat with ``period`` (1: all alike; 2: sliding and full attention
    alternating; …), and copies of ``first`` and ``first + period`` layers differ by one period,
    which is repeated up to ``full`` layers. ``first`` is the lead, one period and the layers the
    full depth leaves over, so that both copies hold every kind of layer and the full depth is
    ``first`` plus a whole number of periods."""

    full: int
    period: int
    prefix: str | None = None  # the layers' module path ("model.layers"); None: any ``NAME.<i>``
    lead: int = 0  # layers before the pattern starts (dense layers ahead of experts, …)

    def layer_of(self, path: str) -> re.Match[str] | None:
        """``path`` split into the layers' path, a layer index and the rest, when it lies in a
        decoder layer (or is one); None otherwise."""
        m = _LAYER_RE.match(path)
        return m if m is not None and (self.prefix is None or m["pre"] == self.prefix) else None

    @property
    def first(self) -> int:
        return self.lead + self.period + (self.full - self.lead) % self.period

    @property
    def second(self) -> int:
        return self.first + self.period

    @property
    def repeats(self) -> int:
        """Periods the full depth holds beyond the first copy."""
        return (self.full - self.first) // self.period

    def source(self, layer: int) -> int:
        """The layer of the second copy that layer ``layer`` of the full model is alike."""
        return layer if layer < self.second else self.first + (layer - self.first) % self.period

    def describe(self, *, captured: bool = False) -> str:
        """The note a count (or, ``captured``, a capture of operations) made by this plan carries."""
        which = f"decoder layers after the first {self.lead}" if self.lead else "decoder layers"
        kinds = f"{which} are identical" if self.period == 1 else \
            f"{which} repeat every {self.period} layers (their layer types and modules)"
        if captured:
            last = f"layer {self.second - 1}'s" if self.period == 1 else f"the last {self.period} layers'"
            return (f"{kinds}: a {self.second}-layer copy captured on the meta device and {last} operations "
                    f"repeated over all {self.full} layers")
        return (f"{kinds}: {self.first}- and {self.second}-layer copies counted on the meta device and the "
                f"difference replicated over all {self.full} layers (full_depth counts every layer)")


def layer_plan(config: Any, model: torch.nn.Module) -> LayerPlan | None:
    """The plan that counts ``model`` (``config`` built on the meta device) from shallow copies,
    or None when its layers do not repeat within half its depth (then every layer runs).

    A layer's kind is its entry in every per-layer setting of the config and its modules and
    parameter shapes; the period is the shortest after which the kinds repeat."""
    attr = _layers_attr(config)
    full = int(getattr(config, attr)) if attr else 0
    if full <= 2 or getattr(config, "is_encoder_decoder", False) or getattr(config, "vision_config", None) is not None:
        return None
    found = _decoder_layers(model, full)
    if found is None:
        return None
    sigs = _layer_signatures(found[1])
    settings = _per_layer_settings(config, full)
    kinds = [(tuple(repr(v[i]) for v in settings.values()), sigs[i]) for i in range(full)]
    lead, period, second = _pattern(kinds)
    return LayerPlan(full, period, found[0], lead) if second < full else None


def _replicate_layers(one: FlopsCount, two: FlopsCount, plan: LayerPlan) -> FlopsCount | None:
    """Extend the counts of the plan's two shallow copies to its full depth (None if the second
    copy's layers do not repeat with the plan's period, module by module)."""
    by_suffix: dict[tuple[str, str], dict[int, int]] = {}
    rest: dict[str, int] = {}
    for path, v in two.modules.items():
        m = plan.layer_of(path)
        if m is None:
            rest[path] = v
            continue
        by_suffix.setdefault((m["pre"], m["post"] or ""), {})[int(m["idx"])] = v
    modules = dict(rest)
    p, second = plan.period, plan.second
    for (pre, post), per_idx in by_suffix.items():
        if any(i >= second for i in per_idx):
            return None
        if any((i in per_idx) != (i + p in per_idx) or per_idx.get(i) != per_idx.get(i + p)
               for i in range(plan.lead, second - p)):
            return None
        for i in range(plan.full):
            if (src := plan.source(i)) in per_idx:
                modules[f"{pre}.{i}{post}"] = per_idx[src]
    n = plan.repeats

    def ext(a: int, b: int) -> int:
        return a + n * (b - a)

    out = FlopsCount(backend="torch", method="meta-device capture", decode_forwards=two.decode_forwards)
    out.flops_prefill = ext(one.flops_prefill, two.flops_prefill)
    out.flops_decode = ext(one.flops_decode, two.flops_decode)
    out.macs_prefill = ext(one.macs_prefill, two.macs_prefill)
    out.macs_decode = ext(one.macs_decode, two.macs_decode)
    out.flops_forward = ext(one.flops_forward, two.flops_forward)
    out.macs_forward = ext(one.macs_forward, two.macs_forward)
    for dst, a, b in ((out.module_types, one.module_types, two.module_types),
                      (out.categories, one.categories, two.categories)):
        for k in set(a) | set(b):
            dst[k] = ext(a.get(k, 0), b.get(k, 0))
    out.modules = modules
    if sum(modules.values()) != out.flops_total:
        return None
    firsts = {(f["phase"], f["step"]): f for f in one.forwards}
    out.forwards = [dict(f, flops=ext(firsts[fk]["flops"], f["flops"]), macs=ext(firsts[fk]["macs"], f["macs"]))
                    for f in two.forwards if (fk := (f["phase"], f["step"])) in firsts]
    out.notes = list(two.notes) + [plan.describe()]
    return out


def count_config(config: Any, batch_size: int, input_tokens: int, output_tokens: int, *,
                 attn_implementation: str = "auto", exact: bool = False, full_depth: bool = False,
                 images: int | None = None) -> FlopsCount:
    """Count a config on the meta device (falls back to the analytic model, labeled, on failure).

    By default a model whose decoder layers repeat (:func:`layer_plan`: all alike, or kinds in a
    pattern after a lead of other layers) is counted on two shallow copies and the difference,
    one period, replicated (exact, and independent of depth: a 70B model counts as fast as a 1B
    one); ``full_depth=True`` instantiates and runs every layer. Encoder-decoder and
    vision-language models are always counted at full depth.

    Mixture-of-experts routing sends each token to ``top_k`` experts; on the meta device the
    grouped expert GEMM still has the routed shapes (tokens x top_k rows), so the count is exact.
    """
    arch = _architecture_or_none(config)
    if (arch is not None and arch.encoder is not None) or getattr(config, "is_encoder_decoder", False) \
            or getattr(config, "vision_config", None) is not None:
        full_depth = True
    try:
        try:
            return _count_config(config, batch_size, input_tokens, output_tokens, attn_implementation, exact,
                                 full_depth, images)
        except Exception as first:
            if attn_implementation == "eager":
                raise
            # some families' sdpa mask code reads values (impossible on the meta device); the
            # eager path runs the same products, so the count does not change
            log.info("meta-device count failed; retrying with eager attention", error=repr(first))
            c = _count_config(config, batch_size, input_tokens, output_tokens, "eager", exact, full_depth, images)
            c.notes.append("counted with eager attention: the family's default attention code cannot run on the "
                           "meta device (same matrix products)")
            return c
    except Exception as exc:  # an architecture whose forward needs real values
        if arch is None:
            raise meta_failure(config, exc) from exc
        log.warning("meta-device count failed; using the analytic model", error=repr(exc))
        c = count_analytic(arch, batch_size, input_tokens, output_tokens, images=images)
        c.backend = "torch"
        c.method = "analytic (the meta-device forward failed)"
        c.notes.append(f"meta-device forward failed ({type(exc).__name__}: {exc}); counted analytically")
        return c


def _count_config(config: Any, batch_size: int, input_tokens: int, output_tokens: int, attn_implementation: str,
                  exact: bool, full_depth: bool, images: int | None) -> FlopsCount:
    attr = _layers_attr(config)
    full = int(getattr(config, attr)) if attr else 0
    plan = layer_plan(config, meta_model(config, attn_implementation=attn_implementation)) \
        if not full_depth and full > 2 else None
    c1 = _shallow_config(config, plan.first) if plan else None
    c2 = _shallow_config(config, plan.second) if plan else None
    if plan is not None and c1 is not None and c2 is not None:
        try:
            one = count_meta_generate(meta_model(c1, attn_implementation=attn_implementation), batch_size,
                                      input_tokens, output_tokens, exact=exact)
            two = count_meta_generate(meta_model(c2, attn_implementation=attn_implementation), batch_size,
                                      input_tokens, output_tokens, exact=exact)
            rep = _replicate_layers(one, two, plan)
        except Exception as exc:  # a copy the family's code rejects: every layer runs instead
            log.info("shallow copies could not be counted; counting the full-depth model", error=repr(exc))
            rep = None
        if rep is not None:
            return rep
        log.info("layers differ; counting the full-depth model")
    model = meta_model(config, attn_implementation=attn_implementation)
    return count_meta_generate(model, batch_size, input_tokens, output_tokens, exact=exact, images=images)


__all__ = [
    "UnknownModel",
    "bundled_config",
    "bundled_names",
    "count_config",
    "count_meta_generate",
    "meta_copy",
    "meta_model",
    "resolve_config",
]


class CapturedGeneration:
    """The operations of ``generate`` for a config, captured from the model's own code on the
    meta device (what the simulator costs for a family the analytic description lacks)."""

    def __init__(self, ops: list[Any], shape: GenerateShape, kv_cache_bytes: int | None, param_count: int,
                 notes: list[str], element_bytes: int = 4) -> None:
        self.element_bytes = element_bytes  # of the floating-point tensors the capture ran with
        self.ops = ops
        self.shape = shape
        self.kv_cache_bytes = kv_cache_bytes
        self.param_count = param_count
        self.notes = notes


def capture_generation_ops(config: Any, batch_size: int, input_tokens: int, output_tokens: int,
                           decode_steps: list[int], *, images: int | None = None,
                           attn_implementation: str = "auto") -> CapturedGeneration:
    """Capture prefill and the given decode steps of ``generate`` on the meta device.

    Decode step ``k`` attends ``prompt + k`` positions: for each step a cache is brought
    (uncaptured) to ``prompt + k - 1`` positions, by one forward over them into a fresh cache or
    by decode steps from the cache of the step before, whichever the forwards timed so far say is
    cheaper (the cache is the same either way), and one forward of one position is captured.
    A model whose decoder layers repeat (:func:`layer_plan`: all alike, or kinds in a pattern
    after a lead) is captured from the plan's second copy, and each further layer's operations
    are those of the copy's layer it is alike (checked: the copy's layers run the same operations
    on the same shapes as those one period before them); otherwise every layer runs. The KV
    cache size is the bytes of the cache the model built for the last position. A family whose code cannot run
    there raises ``ValueError`` saying so (:func:`meta_failure`).
    """
    try:
        return _capture_generation_ops(config, batch_size, input_tokens, output_tokens, decode_steps, images,
                                       attn_implementation)
    except Exception as exc:
        raise meta_failure(config, exc) from exc


def _capture_generation_ops(config: Any, batch_size: int, input_tokens: int, output_tokens: int,
                            decode_steps: list[int], images: int | None, attn_implementation: str) -> CapturedGeneration:
    notes: list[str] = []
    full_model = meta_model(config, attn_implementation=attn_implementation)
    param_count = sum(int(p.numel()) for p in full_model.parameters())
    element_bytes = next((int(p.element_size()) for p in full_model.parameters() if p.is_floating_point()), 4)
    plan = layer_plan(config, full_model)
    shallow = _shallow_config(config, plan.second) if plan is not None else None

    def run(model: torch.nn.Module) -> tuple[list[Any], Any, GenerateShape]:
        rep = _Replay(model, batch_size, input_tokens, images)
        p = rep.prompt
        t0 = time.perf_counter()
        with torch.inference_mode(), OperationCapture(model) as cap:
            rep.encode(cap)
            cache = rep.new_cache()
            rep.forward(cap, p, cache, "prefill", 0, p)
        # what a refill of n positions and one more decode step cost here, to reach each sampled
        # step's context the cheaper way (the same cache either way): one forward over the
        # context (a transformer's, whatever its length, on the meta device) or the steps from
        # the cache already held (a state-space model's prefill scans position by position)
        fill_s, fill_n, step_s = time.perf_counter() - t0, p, math.inf
        ops = list(cap.records)
        at = p  # positions the held cache holds
        for k in decode_steps:
            target = p + k - 1
            if _refill(target - at, step_s, fill_s * max(1.0, target / fill_n)):
                cache, t0 = rep.new_cache(), time.perf_counter()
                with torch.inference_mode():
                    rep.forward(None, target, cache, "prefill", 0, target)
                fill_s, fill_n, at = time.perf_counter() - t0, target, target
            with torch.inference_mode():
                while at < target:
                    t0 = time.perf_counter()
                    rep.forward(None, 1, cache, "decode", 0, at + 1)
                    step_s, at = min(step_s, time.perf_counter() - t0), at + 1
            t0 = time.perf_counter()
            with torch.inference_mode(), OperationCapture(model) as cap:
                rep.forward(cap, 1, cache, "decode", k, p + k)
            step_s, at = min(step_s, time.perf_counter() - t0), at + 1
            ops.extend(cap.records)
        assert rep.shape is not None
        return ops, cache, rep.shape

    def go(attn: str) -> tuple[list[Any], int | None, GenerateShape, bool]:
        if plan is not None and shallow is not None:
            try:
                ops, cache, shape = run(meta_model(shallow, attn_implementation=attn))
                grown, kv = _repeat_layer_ops(ops, plan), _grown_cache_bytes(cache, plan)
            except Exception as exc:  # a copy the family's code rejects: every layer runs instead
                log.info("the shallow copy could not be captured; capturing every layer", error=repr(exc))
            else:
                if grown is not None and (kv is not None or _cache_bytes(cache) is None):
                    return grown, kv, shape, True
        model = full_model if attn == attn_implementation else meta_model(config, attn_implementation=attn)
        ops, cache, shape = run(model)
        return ops, _cache_bytes(cache), shape, False

    try:
        ops, kv, shape, repeated = go(attn_implementation)
    except Exception:
        if attn_implementation == "eager":
            raise
        ops, kv, shape, repeated = go("eager")
        notes.append("captured with eager attention: the family's default attention code cannot run on the meta "
                     "device (same operations' work)")
    if repeated:
        assert plan is not None
        notes.append(plan.describe(captured=True))
    from dataclasses import replace

    return CapturedGeneration(ops, replace(shape, output_tokens=output_tokens), kv, param_count, notes, element_bytes)


def _refill(gap: int, step_s: float, refill_s: float) -> bool:
    """Whether to fill a fresh cache rather than step the held one ``gap`` positions on (a
    negative gap: it is past the context wanted), at the seconds one step and one refill take."""
    return gap < 0 or (gap > 0 and gap * step_s > refill_s)


def _grown_cache_bytes(cache: Any, plan: LayerPlan) -> int | None:
    """Bytes of the cache of the plan's full depth, from the cache of its second copy: each layer
    holds what the copy's layer it is alike holds (a sliding-window layer its window, a recurrent
    layer its state). When the cache cannot be told apart by layer: the copy's bytes in
    proportion to the depth if all layers are alike, else None."""
    from perfsdk.models.internals import cache_bytes, cache_layer_bytes

    held = cache.value if isinstance(cache, _OwnCache) else cache
    per = cache_layer_bytes(held, plan.second)
    if per is not None:
        return sum(per[plan.source(i)] for i in range(plan.full))
    total = cache_bytes(held)
    return total * plan.full // plan.second if total is not None and plan.period == 1 else None


def _repeat_layer_ops(ops: list[Any], plan: LayerPlan) -> list[Any] | None:
    """Ops of a capture of the plan's second copy extended to its full depth: in each forward,
    after the copy's last layer, the operations of the layer each further layer is alike, renamed
    to it. None when, in some forward, the copy's layers do not run the same operations on the
    same shapes as the layers one period before them."""
    from dataclasses import replace

    def key(r: Any) -> tuple[Any, ...]:
        return (r.op, tuple(map(tuple, r.input_shapes)), r.flops, r.bytes_read, r.bytes_written)

    def layer(r: Any) -> int | None:
        m = plan.layer_of(r.module_path)
        return int(m["idx"]) if m is not None else None

    forwards: list[list[Any]] = []
    for r in ops:
        if forwards and (forwards[-1][0].phase, forwards[-1][0].step) == (r.phase, r.step):
            forwards[-1].append(r)
        else:
            forwards.append([r])
    p, last = plan.period, plan.second - 1
    out: list[Any] = []
    repeated = False  # no forward ran the layers: the capture has nothing to repeat
    for fwd in forwards:
        per_layer: dict[int, list[Any]] = {}
        for r in fwd:
            if (i := layer(r)) is not None:
                per_layer.setdefault(i, []).append(r)
        if not per_layer:
            out.extend(fwd)
            continue
        repeated = True
        keys = {i: [key(r) for r in rs] for i, rs in per_layer.items()}
        if max(keys) != last or any(keys.get(i) != keys.get(i + p) for i in range(plan.lead, plan.second - p)):
            return None
        end = max(j for j, r in enumerate(fwd) if layer(r) == last)
        out.extend(fwd[:end + 1])
        for i in range(plan.second, plan.full):
            for r in per_layer.get(plan.source(i), []):
                m = plan.layer_of(r.module_path)
                assert m is not None
                out.append(replace(r, module_path=f"{m['pre']}.{i}{m['post'] or ''}"))
        out.extend(fwd[end + 1:])
    return out if repeated else None

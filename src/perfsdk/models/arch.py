"""One description of a model's architecture, read once from its ``transformers`` config.

:func:`architecture_from_config` turns a config object or a ``config.json`` dict into an
:class:`Architecture`: the numbers that decide FLOPs, weights and the KV cache. The FLOPs
counter's analytic model, the simulation's operation lists, the memory collector's KV-cache size
and the run's ``model`` section all read this one type, so they cannot drift apart.

What it covers
--------------
- grouped-query and multi-query attention (``num_key_value_heads``, ``multi_query``);
  ``head_dim`` overrides; multi-head latent attention (DeepSeek-V3: low-rank query and
  key/value projections, separate value head width);
- per-layer sliding windows, as ``transformers`` decides them: ``layer_types`` when the config
  has it (families derive it from ``sliding_window_pattern`` or
  ``use_sliding_window`` + ``max_window_layers``), else a ``sliding_window`` on every layer;
- mixture-of-experts: routed experts, experts per token (read, never assumed), shared experts
  (Qwen2-MoE ``shared_expert_intermediate_size`` with its gate, DeepSeek ``n_shared_experts``),
  dense layers among MoE layers (``first_k_dense_replace``, ``mlp_only_layers``,
  ``decoder_sparse_step``);
- gated (SwiGLU/GeGLU) or plain MLPs, activation, biases, RMS or layer norm, tied embeddings,
  by family;
- encoder-decoder models (T5: relative position bias, cross-attention, gated-gelu in v1.1) and
  vision-language models (LLaVA: a CLIP vision tower and a projector in front of a decoder),
  whose encoder is :attr:`Architecture.encoder`.

A field the numbers depend on that a ``config.json`` lacks is an error naming it: nothing is
filled in silently. Where ``transformers`` itself defines a value from other fields (no
``num_key_value_heads`` means one KV head per query head, no ``head_dim`` means
``hidden_size / num_attention_heads``, GPT-2's ``n_inner`` of ``None`` means ``4 * n_embd``),
that definition applies. A family not listed in :data:`SUPPORTED_MODEL_TYPES` is an
:class:`UnsupportedArchitecture` error naming it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

NormKind = Literal["rms", "layer"]
Role = Literal["decoder", "encoder", "vision"]
Position = Literal["rope", "learned", "relative"]


class UnsupportedArchitecture(ValueError):
    """The config names a model family the architecture reader does not describe."""


class MissingConfigField(UnsupportedArchitecture):
    """A field the architecture depends on is absent from the config."""


class InvalidConfig(UnsupportedArchitecture):
    """``transformers`` rejects the config (a value its family does not accept)."""


@dataclass(frozen=True)
class Linear:
    """One weight matrix applied at every position: ``in_features -> out_features``.

    ``name`` is the module path below its block (``self_attn.q_proj``).
    """

    name: str
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def macs(self) -> int:
        """Multiply-adds per position."""
        return self.in_features * self.out_features

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class Architecture:
    """A transformer stack and what feeds it.

    The top-level object is the stack that produces the output tokens (a decoder); an
    encoder-decoder model's encoder, or a vision-language model's vision tower, is
    :attr:`encoder`. ``layer_windows`` holds one entry per layer (``None``: full attention).
    """

    model_type: str
    role: Role
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    intermediate_size: int
    vocab_size: int
    hidden_act: str
    gated_mlp: bool
    norm: NormKind
    position: Position
    causal: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    layer_windows: tuple[int | None, ...] = ()
    norms_per_layer: int = 2
    norm_weights: bool = True
    qk_norm: Literal["none", "head", "full"] = "none"
    norm_unit_offset: bool = False  # RMSNorm scales by (1 + weight) and casts back (Gemma)
    attn_logit_softcapping: float | None = None  # tanh cap on attention scores (Gemma 2): eager attention
    final_logit_softcapping: float | None = None  # tanh cap on the logits (Gemma 2 and 3)
    # one matrix product computes several projections (the cost is the same, the call count not)
    fused_qkv: bool = False  # query, key and value in one call (GPT-2's c_attn, Phi-3's qkv_proj)
    fused_gate_up: bool = False  # gate and up projections of the dense MLP in one call (Phi-3)
    fused_expert_gate_up: bool = False  # experts stored as 3-D tensors, gate and up in one call
    # the layer weights are stored [in, out] and applied as x @ W (transformers' Conv1D, GPT-2):
    # a matrix-vector product then runs over rows of out-features length
    weights_in_out: bool = False
    # mixture of experts
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    # multi-head latent attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    # relative position bias (T5)
    relative_attention_num_buckets: int = 0
    # encoder-decoder / vision-language
    cross_attention: bool = False
    encoder: Architecture | None = None
    projector: tuple[Linear, ...] = ()
    projector_act: str | None = None
    image_tokens_per_image: int = 0
    # vision tower
    image_size: int = 0
    patch_size: int = 0
    num_channels: int = 0
    class_token: bool = False
    # naming
    architecture: str | None = None
    layers_path: str = "model.layers"
    embed_path: str = "model.embed_tokens"
    final_norm_path: str = "model.norm"

    # -- what kind of model -----------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_encoder_decoder(self) -> bool:
        """An encoder over the input tokens and a decoder that cross-attends its output (T5)."""
        return self.encoder is not None and self.encoder.role == "encoder"

    @property
    def is_multimodal(self) -> bool:
        """A vision tower (and projector) in front of the decoder (LLaVA)."""
        return self.encoder is not None and self.encoder.role == "vision"

    @property
    def kind(self) -> str:
        """``decoder``, ``encoder-decoder`` or ``vision-language``."""
        return "encoder-decoder" if self.is_encoder_decoder else "vision-language" if self.is_multimodal else "decoder"

    # -- per layer --------------------------------------------------------------------------

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (``None``: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Per-layer windows, or ``()`` when every layer attends fully."""
        return self.layer_windows if any(w is not None for w in self.layer_windows) else ()

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer not in self.dense_layers

    def keys_attended(self, layer: int, past: int, new: int) -> int:
        """Keys the attention kernel of ``layer`` gets for ``new`` positions after ``past`` cached ones.

        A sliding-window cache keeps ``window - 1`` past positions (``transformers``'
        ``DynamicSlidingWindowLayer``); the first forward gets every key, masked.
        """
        w = self.window(layer)
        if w is None or past == 0:
            return past + new
        return min(past, w - 1) + new

    def attention_linears(self) -> tuple[Linear, ...]:
        """The projections of one self-attention block applied to the new positions.

        Key and value projections are sized by the KV heads (GQA, MQA). For latent attention
        see also :meth:`key_linears`.
        """
        h, hd, vd = self.hidden_size, self.head_dim, self.v_head_dim
        if self.kv_lora_rank is not None:
            q: tuple[Linear, ...]
            if self.q_lora_rank:
                q = (Linear("self_attn.q_a_proj", h, self.q_lora_rank, self.qkv_bias),
                     Linear("self_attn.q_b_proj", self.q_lora_rank, self.num_heads * hd))
            else:
                q = (Linear("self_attn.q_proj", h, self.num_heads * hd),)
            return (*q,
                    Linear("self_attn.kv_a_proj_with_mqa", h, self.kv_lora_rank + self.qk_rope_head_dim, self.qkv_bias),
                    Linear("self_attn.o_proj", self.num_heads * vd, h, self.o_bias))
        p = "layer.0.SelfAttention." if self.model_type == "t5" else "self_attn."
        n = ("q", "k", "v", "o") if self.model_type == "t5" else ("q_proj", "k_proj", "v_proj", "o_proj")
        return (Linear(p + n[0], h, self.num_heads * hd, self.qkv_bias),
                Linear(p + n[1], h, self.num_kv_heads * hd, self.qkv_bias),
                Linear(p + n[2], h, self.num_kv_heads * vd, self.qkv_bias),
                Linear(p + n[3], self.num_heads * vd, h, self.o_bias))

    def key_linears(self) -> tuple[Linear, ...]:
        """Projections applied to every attended key position at every forward.

        Latent attention (DeepSeek-V3) caches the compressed latent and ``transformers``
        expands it to per-head keys and values (``kv_b_proj``) over the whole cached sequence
        on each forward.
        """
        if self.kv_lora_rank is None:
            return ()
        nope = self.head_dim - self.qk_rope_head_dim
        return (Linear("self_attn.kv_b_proj", self.kv_lora_rank, self.num_heads * (nope + self.v_head_dim)),)

    def cache_width(self) -> int:
        """Elements one position adds to one layer's KV cache."""
        if self.kv_lora_rank is not None:
            return self.kv_lora_rank + self.qk_rope_head_dim  # the compressed latent and the shared rotary key
        return self.num_kv_heads * (self.head_dim + self.v_head_dim)

    def cross_attention_linears(self) -> tuple[tuple[Linear, ...], tuple[Linear, ...]]:
        """Cross-attention projections: (applied to decoder positions, applied to encoder positions).

        The key and value projections of the encoder's output run once, in the first decoder
        forward, and are cached.
        """
        if not self.cross_attention:
            return (), ()
        h, hd = self.hidden_size, self.head_dim
        p = "layer.1.EncDecAttention."
        return ((Linear(p + "q", h, self.num_heads * hd, self.qkv_bias),
                 Linear(p + "o", self.num_heads * self.v_head_dim, h, self.o_bias)),
                (Linear(p + "k", h, self.num_kv_heads * hd, self.qkv_bias),
                 Linear(p + "v", h, self.num_kv_heads * self.v_head_dim, self.qkv_bias)))

    def mlp_linears(self, intermediate: int | None = None, prefix: str | None = None) -> tuple[Linear, ...]:
        """A dense MLP of width ``intermediate`` (the model's by default)."""
        h, i, b = self.hidden_size, intermediate or self.intermediate_size, self.mlp_bias
        if self.model_type == "t5":
            p = prefix if prefix is not None else f"layer.{2 if self.cross_attention else 1}.DenseReluDense."
            if self.gated_mlp:
                return (Linear(p + "wi_0", h, i), Linear(p + "wi_1", h, i), Linear(p + "wo", i, h))
            return (Linear(p + "wi", h, i), Linear(p + "wo", i, h))
        p = "mlp." if prefix is None else prefix
        if self.gated_mlp:
            return (Linear(p + "gate_proj", h, i, b), Linear(p + "up_proj", h, i, b), Linear(p + "down_proj", i, h, b))
        return (Linear(p + "fc1", h, i, b), Linear(p + "fc2", i, h, b))

    def router(self) -> Linear:
        return Linear("mlp.gate", self.hidden_size, self.num_experts)

    def shared_expert_linears(self) -> tuple[Linear, ...]:
        """The always-active shared expert MLP and, for Qwen2-MoE, its sigmoid gate."""
        if not self.shared_expert_intermediate_size:
            return ()
        mlp = self.mlp_linears(self.shared_expert_intermediate_size, prefix="mlp.shared_expert.")
        gate = (Linear("mlp.shared_expert_gate", self.hidden_size, 1),) if self.shared_expert_gate else ()
        return mlp + gate

    def layer_linear_macs(self, layer: int) -> int:
        """Multiply-adds per position of ``layer``'s weight matrices (active experts only).

        Cross-attention key/value projections, which run over the encoder's positions, and
        :meth:`key_linears`, which run over the attended keys, are not included.
        """
        macs = sum(l.macs for l in self.attention_linears())
        macs += sum(l.macs for l in self.cross_attention_linears()[0])
        if self.is_moe_layer(layer):
            expert = sum(l.macs for l in self.mlp_linears(self.expert_intermediate_size))
            macs += self.experts_per_token * expert + self.router().macs
            macs += sum(l.macs for l in self.shared_expert_linears())
        else:
            macs += sum(l.macs for l in self.mlp_linears())
        return macs

    def linear_macs_per_token(self) -> int:
        """All layers' weight matrices per position (no embedding, no ``lm_head``)."""
        return sum(self.layer_linear_macs(i) for i in range(self.num_layers))

    def lm_head_macs_per_token(self) -> int:
        return self.hidden_size * self.vocab_size if self.role == "decoder" else 0

    # -- vision tower -----------------------------------------------------------------------

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0

    @property
    def tokens_per_image(self) -> int:
        """Positions the vision tower processes per image (patches, plus the class token)."""
        return self.patches_per_image + (1 if self.class_token else 0)

    def patch_embedding_macs(self) -> int:
        """The patch convolution per image: every patch times ``channels * patch^2 * hidden``."""
        return self.patches_per_image * self.num_channels * self.patch_size ** 2 * self.hidden_size

    # -- sizes ------------------------------------------------------------------------------

    def kv_cache_bytes(self, batch_size: int, context_len: int, dtype_bytes: float,
                       encoder_tokens: int = 0) -> int:
        """Bytes of the KV cache after ``context_len`` positions of ``batch_size`` sequences.

        Keys and values of every layer over the positions it keeps (a sliding-window layer
        keeps ``window - 1`` past positions; the cache after a forward holds at most
        ``window`` of them), plus, for an encoder-decoder, the cross-attention keys and values
        of ``encoder_tokens`` encoder positions.
        """
        per_pos = self.cache_width()
        total = 0
        for layer in range(self.num_layers):
            w = self.window(layer)
            kept = context_len if w is None else min(context_len, w)
            total += kept * per_pos
            if self.cross_attention:
                total += encoder_tokens * self.num_kv_heads * (self.head_dim + self.v_head_dim)
        return int(total * batch_size * dtype_bytes)

    def layer_matrices(self, layer: int) -> list[tuple[Linear, int]]:
        """Every weight matrix of decoder layer ``layer`` with how many copies it has (every
        expert of a mixture-of-experts layer, not only those one token reaches)."""
        q, kv = self.cross_attention_linears()
        out = [(lin, 1) for lin in self.attention_linears() + self.key_linears() + q + kv]
        if self.is_moe_layer(layer):
            out += [(lin, self.num_experts) for lin in self.mlp_linears(self.expert_intermediate_size)]
            out += [(self.router(), 1)] + [(lin, 1) for lin in self.shared_expert_linears()]
        else:
            out += [(lin, 1) for lin in self.mlp_linears()]
        return out

    def param_count(self) -> int:
        """Parameters: embeddings, every expert, biases, norms, ``lm_head`` counted once when tied."""
        h = self.hidden_size
        norm = h * (2 if self.norm == "layer" else 1) if self.norm_weights else 0
        n = 0
        for layer in range(self.num_layers):
            n += sum(lin.params * k for lin, k in self.layer_matrices(layer))
            n += (self.norms_per_layer + (1 if self.cross_attention else 0)) * norm
            if self.qk_norm == "head":
                n += 2 * self.head_dim
            elif self.qk_norm == "full":
                n += (self.num_heads + self.num_kv_heads) * self.head_dim
            if self.kv_lora_rank is not None:
                n += self.kv_lora_rank + (self.q_lora_rank or 0)
        n += norm  # final norm
        if self.relative_attention_num_buckets:
            n += self.relative_attention_num_buckets * self.num_heads
        if self.role == "vision":
            n += self.num_channels * self.patch_size ** 2 * h + (h if self.class_token else 0)
            n += self.tokens_per_image * h + norm  # position embeddings, pre-norm
            return n
        if self.position == "learned" and self.max_position_embeddings:
            n += self.max_position_embeddings * h
        embed_shared = self.encoder is not None and self.encoder.role == "encoder"
        n += self.vocab_size * h
        if self.role == "decoder" and not self.tie_word_embeddings:
            n += self.vocab_size * h
        if self.lm_head_bias:
            n += self.vocab_size
        if self.encoder is not None:
            enc = self.encoder.param_count()
            if embed_shared:
                enc -= self.encoder.vocab_size * self.encoder.hidden_size
            n += enc + sum(l.params for l in self.projector)
        return n

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- reading configs ----------------------------------------------------------------------------

_LLAMA_LIKE = {"llama", "mistral", "ministral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma",
               "gemma2", "gemma3_text", "olmo", "olmo2", "granite", "smollm3", "deepseek_v3"}
_PLAIN_MLP = {"gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "phi"}
#: Decoder families whose config the reader understands (plus ``t5`` and ``llava``).
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_LLAMA_LIKE | _PLAIN_MLP | {"t5", "llava"}))
_VISION_TYPES = {"clip_vision_model"}

_HIDDEN = ("hidden_size", "n_embd", "d_model")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
# Fields a config.json must state, per family; a tuple lists accepted spellings of one field.
_REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "gpt2": (_HIDDEN, _LAYERS, _HEADS, ("vocab_size",)),
    "gpt_bigcode": (_HIDDEN, _LAYERS, _HEADS, ("vocab_size",)),
    "t5": (("d_model",), ("d_kv",), ("num_heads",), ("d_ff",), ("num_layers",), ("vocab_size",)),
    "clip_vision_model": (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",),
                          ("intermediate_size",), ("image_size",), ("patch_size",)),
    "mixtral": (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("intermediate_size",),
                ("vocab_size",), ("num_local_experts",), ("num_experts_per_tok",)),
    "qwen2_moe": (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("intermediate_size",),
                  ("vocab_size",), ("num_experts",), ("num_experts_per_tok",), ("moe_intermediate_size",),
                  ("shared_expert_intermediate_size",)),
    "qwen3_moe": (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("intermediate_size",),
                  ("vocab_size",), ("num_experts", "num_local_experts"), ("num_experts_per_tok",),
                  ("moe_intermediate_size",)),
    "deepseek_v3": (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("intermediate_size",),
                    ("vocab_size",), ("n_routed_experts",), ("num_experts_per_tok",), ("moe_intermediate_size",),
                    ("kv_lora_rank",), ("qk_nope_head_dim",), ("qk_rope_head_dim",), ("v_head_dim",)),
}
_DEFAULT_REQUIRED = (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("intermediate_size",),
                     ("vocab_size",))


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = cfg.get(n) if isinstance(cfg, dict) else getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def _unsupported(model_type: str, where: str = "") -> UnsupportedArchitecture:
    at = f"{where}: " if where else ""
    return UnsupportedArchitecture(
        f"{at}architecture {model_type!r} is not supported (supported model types: {', '.join(SUPPORTED_MODEL_TYPES)})")


def check_required_fields(data: dict[str, Any], where: str = "") -> None:
    """Raise :class:`MissingConfigField` naming the first field ``data`` (a ``config.json``) lacks.

    Nested configs (``text_config``, ``vision_config``) are checked too.
    """
    at = f"{where}." if where else ""
    model_type = data.get("model_type")
    if not model_type:
        raise MissingConfigField(f"config field {at}model_type is missing: it names the architecture")
    model_type = str(model_type)
    if model_type == "llava":
        for key in ("text_config", "vision_config"):
            sub = data.get(key)
            if not isinstance(sub, dict):
                raise MissingConfigField(f"config field {at}{key} is missing (a LLaVA config needs both "
                                         f"text_config and vision_config)")
            check_required_fields(sub, f"{at}{key}")
        return
    if model_type not in _LLAMA_LIKE | _PLAIN_MLP | {"t5"} | _VISION_TYPES:
        return  # a family the description lacks: transformers checks its config, capture counts it
    for names in _REQUIRED.get(model_type, _DEFAULT_REQUIRED):
        if all(data.get(n) is None for n in names):
            alt = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
            raise MissingConfigField(f"config field {at}{names[0]}{alt} is missing: the {model_type} architecture "
                                     f"depends on it")


def config_from_dict(data: dict[str, Any]) -> Any:
    """The ``transformers`` config of a ``config.json`` dict, after checking its required fields.

    ``transformers`` fills the fields the dict leaves out with its family defaults; the check
    first makes sure none of those is a dimension the numbers depend on.
    """
    from transformers import AutoConfig

    check_required_fields(data)
    data = dict(data)
    model_type = data.pop("model_type")
    architectures = data.pop("architectures", None)
    stated_dtype = data.get("dtype") or data.get("torch_dtype")
    for k in ("_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        data.pop(k, None)
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        from perfsdk.models.internals import transformers_version

        raise InvalidConfig(f"model_type {model_type!r} is not a family that transformers "
                            f"{transformers_version() or ''} builds (a newer release may; see perfsdk doctor)")
    try:
        cfg = AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # transformers validates values per family (strict dataclasses)
        raise InvalidConfig(f"config of model_type {model_type!r} rejected by transformers: {exc}") from None
    if architectures:
        cfg.architectures = list(architectures)
    if isinstance(stated_dtype, str):  # the weights' dtype the file states (as a name, no conversion)
        cfg.dtype = stated_dtype.removeprefix("torch.")
    return cfg


def architecture_from_config(config: Any) -> Architecture:
    """Read an :class:`Architecture` from a ``transformers`` config object or a ``config.json`` dict.

    Raises :class:`UnsupportedArchitecture` (a ``ValueError``) for a family it does not
    describe, and :class:`MissingConfigField` when a dict lacks a field the numbers depend on.
    """
    if isinstance(config, Architecture):
        return config
    if isinstance(config, dict):
        config = config_from_dict(config)
    model_type = str(_get(config, "model_type", default="") or "")
    arch_name = (_get(config, "architectures", default=None) or [None])[0]
    if model_type == "llava":
        return _llava(config, arch_name)
    if model_type == "t5":
        return _t5(config, arch_name)
    if model_type in _LLAMA_LIKE | _PLAIN_MLP:
        return _decoder(config, model_type, arch_name)
    if not model_type:
        raise UnsupportedArchitecture(f"config of {type(config).__name__} has no model_type")
    raise _unsupported(model_type)


def _softcap(cfg: Any, name: str) -> float | None:
    v = _get(cfg, name)
    return float(v) if v else None


def _need(cfg: Any, model_type: str, *names: str) -> int:
    v = _get(cfg, *names)
    if v is None:
        raise MissingConfigField(f"config field {names[0]} is missing: the {model_type} architecture depends on it")
    return int(v)


def _windows(cfg: Any, layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding windows, following ``transformers``' cache: ``layer_types`` first."""
    sw = _get(cfg, "sliding_window")
    types = _get(cfg, "layer_types")
    if types:
        if len(types) != layers:
            raise UnsupportedArchitecture(f"config field layer_types has {len(types)} entries for {layers} layers")
        return tuple(int(sw) if t == "sliding_attention" and sw else None for t in types)
    pattern = _get(cfg, "sliding_window_pattern", "_sliding_window_pattern")
    if sw and pattern:
        return tuple(int(sw) if (i + 1) % int(pattern) else None for i in range(layers))
    if _get(cfg, "use_sliding_window") is False:
        return (None,) * layers
    if sw and _get(cfg, "use_sliding_window") and _get(cfg, "max_window_layers") is not None:
        first = int(_get(cfg, "max_window_layers"))
        return tuple(int(sw) if i >= first else None for i in range(layers))
    return tuple(int(sw) if sw else None for _ in range(layers))


def _decoder(cfg: Any, model_type: str, arch_name: str | None, layers_path: str = "model.layers",
             embed_path: str = "model.embed_tokens", final_norm_path: str = "model.norm") -> Architecture:
    mt = model_type
    hidden = _need(cfg, mt, *_HIDDEN)
    layers = _need(cfg, mt, *_LAYERS)
    heads = _need(cfg, mt, *_HEADS)
    vocab = _need(cfg, mt, "vocab_size")
    kv = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    if _get(cfg, "multi_query", default=False):
        kv = 1
    head_dim = int(_get(cfg, "head_dim", default=0) or hidden // heads)
    v_head_dim = head_dim
    act = str(_get(cfg, "hidden_activation", "hidden_act", "activation_function", default=""))
    if mt in ("gpt2", "gpt_bigcode"):
        inter = int(_get(cfg, "n_inner", default=0) or 4 * hidden)
    else:
        inter = _need(cfg, mt, "intermediate_size")
    gated = mt in _LLAMA_LIKE
    norm: NormKind = "layer" if mt in _PLAIN_MLP or mt == "olmo" else "rms"
    position: Position = "learned" if mt in ("gpt2", "gpt_bigcode") else "rope"
    ab = bool(_get(cfg, "attention_bias", default=False))
    qkv_bias, o_bias, mlp_bias = ab, ab, bool(_get(cfg, "mlp_bias", default=False))
    lm_head_bias = False
    if mt in ("gpt2", "gpt_bigcode", "phi"):
        qkv_bias = o_bias = mlp_bias = True
        lm_head_bias = mt == "phi"
    elif mt == "qwen2":
        qkv_bias, o_bias = True, False
    elif mt == "qwen2_moe":
        qkv_bias, o_bias = bool(_get(cfg, "qkv_bias", default=True)), False
    elif mt == "starcoder2":
        qkv_bias = o_bias = mlp_bias = bool(_get(cfg, "use_bias", default=True))
    elif mt == "gpt_neox":
        mlp_bias = True
    norms = 4 if mt in ("gemma2", "gemma3_text") else 1 if mt == "phi" else 2
    qk_norm: Literal["none", "head", "full"] = "none"
    if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
        qk_norm = "head"
    elif mt == "olmo2":
        qk_norm, norms = "full", 2
    # mixture of experts
    experts = topk = expert_inter = shared_inter = 0
    shared_gate = False
    dense: tuple[int, ...] = ()
    q_lora: int | None = None
    kv_lora: int | None = None
    rope_dim = 0
    if mt == "mixtral":
        experts = _need(cfg, mt, "num_local_experts")
        topk = _need(cfg, mt, "num_experts_per_tok")
        expert_inter = inter
    elif mt in ("qwen2_moe", "qwen3_moe"):
        experts = _need(cfg, mt, "num_experts", "num_local_experts")
        topk = _need(cfg, mt, "num_experts_per_tok")
        expert_inter = _need(cfg, mt, "moe_intermediate_size")
        step = int(_get(cfg, "decoder_sparse_step", default=1) or 1)
        only = set(_get(cfg, "mlp_only_layers", default=()) or ())
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step != 0)
        if mt == "qwen2_moe":
            shared_inter = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
            shared_gate = bool(shared_inter)
    elif mt == "deepseek_v3":
        experts = _need(cfg, mt, "n_routed_experts")
        topk = _need(cfg, mt, "num_experts_per_tok")
        expert_inter = _need(cfg, mt, "moe_intermediate_size")
        shared_inter = expert_inter * int(_get(cfg, "n_shared_experts", default=0) or 0)
        dense = tuple(range(min(layers, int(_get(cfg, "first_k_dense_replace", default=0) or 0))))
        q_lora = _get(cfg, "q_lora_rank")
        q_lora = int(q_lora) if q_lora else None
        kv_lora = _need(cfg, mt, "kv_lora_rank")
        rope_dim = _need(cfg, mt, "qk_rope_head_dim")
        head_dim = _need(cfg, mt, "qk_nope_head_dim") + rope_dim
        v_head_dim = _need(cfg, mt, "v_head_dim")
        kv = heads
    if experts and topk < 1:
        raise MissingConfigField(f"config field num_experts_per_tok is {topk}: the {mt} architecture routes each "
                                 f"token to at least one expert")
    tie = bool(_get(cfg, "tie_word_embeddings", default=False))
    max_pos = _get(cfg, "max_position_embeddings", "n_positions")
    return Architecture(
        model_type=mt, role="decoder", hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        head_dim=head_dim, v_head_dim=v_head_dim, intermediate_size=inter, vocab_size=vocab, hidden_act=act,
        gated_mlp=gated, norm=norm, position=position, qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
        lm_head_bias=lm_head_bias, tie_word_embeddings=tie,
        max_position_embeddings=int(max_pos) if max_pos is not None else None,
        fused_qkv=mt in ("gpt2", "gpt_bigcode", "phi3"), fused_gate_up=mt == "phi3",
        fused_expert_gate_up=mt in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"), weights_in_out=mt == "gpt2",
        layer_windows=_windows(cfg, layers), norms_per_layer=norms, norm_weights=mt != "olmo", qk_norm=qk_norm,
        norm_unit_offset=mt.startswith("gemma"), attn_logit_softcapping=_softcap(cfg, "attn_logit_softcapping"),
        final_logit_softcapping=_softcap(cfg, "final_logit_softcapping"),
        num_experts=experts, experts_per_token=topk, expert_intermediate_size=expert_inter,
        shared_expert_intermediate_size=shared_inter, shared_expert_gate=shared_gate, dense_layers=dense,
        q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_rope_head_dim=rope_dim, architecture=arch_name,
        layers_path=layers_path, embed_path=embed_path, final_norm_path=final_norm_path,
    )


def _t5(cfg: Any, arch_name: str | None) -> Architecture:
    mt = "t5"
    d_model = _need(cfg, mt, "d_model")
    d_kv = _need(cfg, mt, "d_kv")
    heads = _need(cfg, mt, "num_heads")
    d_ff = _need(cfg, mt, "d_ff")
    enc_layers = _need(cfg, mt, "num_layers")
    dec_layers = int(_get(cfg, "num_decoder_layers", default=enc_layers))
    vocab = _need(cfg, mt, "vocab_size")
    proj = str(_get(cfg, "feed_forward_proj", default="relu"))
    gated = proj.startswith("gated-")
    act = str(_get(cfg, "dense_act_fn", default=proj.split("-")[-1]))
    buckets = int(_get(cfg, "relative_attention_num_buckets", default=32))
    common: dict[str, Any] = dict(
        model_type=mt, hidden_size=d_model, num_heads=heads, num_kv_heads=heads, head_dim=d_kv, v_head_dim=d_kv,
        intermediate_size=d_ff, vocab_size=vocab, hidden_act=act, gated_mlp=gated, norm="rms", position="relative",
        relative_attention_num_buckets=buckets, architecture=arch_name, embed_path="shared")
    encoder = Architecture(role="encoder", num_layers=enc_layers, causal=False, layer_windows=(None,) * enc_layers,
                           layers_path="encoder.block", final_norm_path="encoder.final_layer_norm", **common)
    return Architecture(role="decoder", num_layers=dec_layers, cross_attention=True, encoder=encoder,
                        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=True)),
                        layer_windows=(None,) * dec_layers, layers_path="decoder.block",
                        final_norm_path="decoder.final_layer_norm", **common)


def _clip_vision(cfg: Any, where: str) -> Architecture:
    mt = str(_get(cfg, "model_type", default=""))
    if mt not in _VISION_TYPES:
        raise _unsupported(mt or type(cfg).__name__, where)
    hidden = _need(cfg, mt, "hidden_size")
    heads = _need(cfg, mt, "num_attention_heads")
    layers = _need(cfg, mt, "num_hidden_layers")
    hd = hidden // heads
    return Architecture(
        model_type=mt, role="vision", hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads,
        head_dim=hd, v_head_dim=hd, intermediate_size=_need(cfg, mt, "intermediate_size"), vocab_size=0,
        hidden_act=str(_get(cfg, "hidden_act", default="quick_gelu")), gated_mlp=False, norm="layer",
        position="learned", causal=False, qkv_bias=True, o_bias=True, mlp_bias=True,
        layer_windows=(None,) * layers, image_size=_need(cfg, mt, "image_size"),
        patch_size=_need(cfg, mt, "patch_size"), num_channels=int(_get(cfg, "num_channels", default=3)),
        class_token=True, layers_path="model.vision_tower.encoder.layers",
        embed_path="model.vision_tower.embeddings", final_norm_path="model.vision_tower.post_layernorm",
    )


def _llava(cfg: Any, arch_name: str | None) -> Architecture:
    text_cfg = _get(cfg, "text_config")
    vision_cfg = _get(cfg, "vision_config")
    if text_cfg is None or vision_cfg is None:
        raise MissingConfigField("config field text_config or vision_config is missing: a LLaVA model has both")
    text_type = str(_get(text_cfg, "model_type", default=""))
    if text_type not in _LLAMA_LIKE | _PLAIN_MLP:
        raise _unsupported(text_type, "text_config")
    vision = _clip_vision(vision_cfg, "vision_config")
    text = _decoder(text_cfg, text_type, None, layers_path="model.language_model.layers",
                    embed_path="model.language_model.embed_tokens", final_norm_path="model.language_model.norm")
    feature_layer = _get(cfg, "vision_feature_layer", default=-2)
    n_features = len(feature_layer) if isinstance(feature_layer, (list, tuple)) else 1
    strategy = str(_get(cfg, "vision_feature_select_strategy", default="default"))
    if strategy not in ("default", "full"):
        raise UnsupportedArchitecture(f"config field vision_feature_select_strategy {strategy!r} is not supported "
                                      f"(default or full)")
    bias = bool(_get(cfg, "multimodal_projector_bias", default=True))
    projector = (Linear("model.multi_modal_projector.linear_1", vision.hidden_size * n_features, text.hidden_size, bias),
                 Linear("model.multi_modal_projector.linear_2", text.hidden_size, text.hidden_size, bias))
    return replace(text, model_type="llava", architecture=arch_name, encoder=vision, projector=projector,
                   projector_act=str(_get(cfg, "projector_hidden_act", default="gelu")),
                   tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=text.tie_word_embeddings)),
                   image_tokens_per_image=vision.patches_per_image + (1 if strategy == "full" else 0))


# -- what each phase processes -----------------------------------------------------------------


@dataclass(frozen=True)
class GenerateShape:
    """What each phase processes for ``generate`` (or a forward) of a model.

    ``prompt_tokens``: the decoder's positions in its first forward (text plus image tokens for a
    vision-language model, the single start token for an encoder-decoder).
    """

    batch_size: int
    input_tokens: int
    output_tokens: int
    images: int
    image_tokens: int
    encoder_tokens: int
    prompt_tokens: int


def generate_shape(arch: Architecture, batch_size: int, input_tokens: int, output_tokens: int,
                   images: int | None = None, decoder_tokens: int = 1) -> GenerateShape:
    """Resolve what each phase processes; ``images`` defaults to one per sequence for a VLM.

    ``input_tokens`` are the text tokens of the prompt (without image tokens); for an
    encoder-decoder they are the encoder's input, and the decoder starts from
    ``decoder_tokens`` positions.
    """
    if images is None:
        images = 1 if arch.is_multimodal else 0
    if images < 0:
        raise ValueError(f"images must be >= 0, got {images}")
    if images and not arch.is_multimodal:
        raise ValueError(f"images: the {arch.model_type} architecture has no vision tower")
    image_tokens = images * arch.image_tokens_per_image
    if arch.is_encoder_decoder:
        return GenerateShape(batch_size, input_tokens, output_tokens, 0, 0, input_tokens, decoder_tokens)
    return GenerateShape(batch_size, input_tokens, output_tokens, images, image_tokens, 0, input_tokens + image_tokens)


__all__ = [
    "Architecture",
    "GenerateShape",
    "InvalidConfig",
    "Linear",
    "MissingConfigField",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedArchitecture",
    "architecture_from_config",
    "check_required_fields",
    "config_from_dict",
    "generate_shape",
]

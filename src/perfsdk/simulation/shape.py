"""The architecture numbers the simulation needs, read from a ``transformers`` config.

:class:`ModelShape` is a small, explicit summary (hidden size, layers, heads, KV heads, MLP
width, vocabulary, sliding window, MoE experts) built from any decoder config object or dict.
:func:`resolve_model_shape` turns what a user types after ``--model`` into one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Layer-norm (not RMSNorm) and non-gated MLP families.
_LAYERNORM_TYPES = {"gpt2", "gpt_neox", "opt", "bert", "falcon", "phi", "gptj", "bloom", "gpt_bigcode"}



@dataclass(frozen=True)
class ModelShape:
    """Decoder-only transformer dimensions. ``num_experts == 0`` means a dense MLP."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    sliding_window: int | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    gated_mlp: bool = True
    norm: str = "rms"
    tie_word_embeddings: bool = False
    name: str = "model"
    kv_concat: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def param_count(self) -> int:
        """Parameters (weights only, norms included), tied embeddings counted once."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.num_heads * self.head_dim * 2 + h * self.num_kv_heads * self.head_dim * 2
        mlp_one = (3 if self.gated_mlp else 2) * h * i
        mlp = mlp_one * self.num_experts + h * self.num_experts if self.num_experts else mlp_one
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = cfg.get(n) if isinstance(cfg, dict) else getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def shape_from_config(cfg: Any, name: str | None = None) -> ModelShape:
    """A :class:`ModelShape` from a ``transformers`` config object or a plain dict."""
    if hasattr(cfg, "get_text_config") and not isinstance(cfg, dict):
        cfg = cfg.get_text_config()
    hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    if _get(cfg, "multi_query", default=False):
        kv = 1
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    model_type = str(_get(cfg, "model_type", default="llama"))
    inter = int(_get(cfg, "moe_intermediate_size", "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden))
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    topk = int(_get(cfg, "num_experts_per_tok", "moe_top_k", default=2 if experts else 0) or 0)
    window = _get(cfg, "sliding_window", default=None)
    if _get(cfg, "use_sliding_window", default=True) is False:
        window = None
    layernorm = model_type in _LAYERNORM_TYPES
    return ModelShape(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=int(_get(cfg, "vocab_size", default=32000)),
        sliding_window=int(window) if window else None,
        num_experts=experts,
        experts_per_token=topk,
        gated_mlp=not layernorm,
        norm="layer" if layernorm else "rms",
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
        name=name or str(_get(cfg, "_name_or_path", "name_or_path", default="") or model_type),
    )


def _flops_configs_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "flops" / "configs"


def resolve_model_shape(spec: str) -> ModelShape:
    """What ``--model`` accepts, tried in order:

    a ``config.json`` path or a folder holding one; a bundled config of well-known public
    checkpoints (``perfsdk/flops/configs/<name>.json``, shared with the FLOPs counter); ``builtin:`` models
    (the embedded tiny Llama and its size variants); a Hugging Face id already in the local cache (no network).
    """
    p = Path(spec)
    if p.is_dir() and (p / "config.json").is_file():
        p = p / "config.json"
    if p.is_file():
        return shape_from_config(json.loads(p.read_text(encoding="utf-8")), name=spec)
    key = spec.lower()
    bundled = _flops_configs_dir() / f"{key}.json"
    if bundled.is_file():
        return shape_from_config(json.loads(bundled.read_text(encoding="utf-8")), name=key)
    if spec.startswith("builtin:"):
        try:
            from perfsdk.models.tiny import tiny_llama_config

            cfg = tiny_llama_config(spec.removeprefix("builtin:"))
        except Exception as exc:
            raise ValueError(f"--model {spec}: unknown embedded model: {exc}") from None
        return shape_from_config(cfg, name=spec)
    try:
        from transformers import AutoConfig

        return shape_from_config(AutoConfig.from_pretrained(spec, local_files_only=True), name=spec)
    except Exception:
        known = ", ".join(sorted(p.stem for p in _flops_configs_dir().glob("*.json")))
        raise ValueError(
            f"--model {spec}: not a config.json path, a known name ({known}) or a cached Hugging Face id"
        ) from None

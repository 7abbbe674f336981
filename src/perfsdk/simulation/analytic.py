"""Analytic operation lists: the ops a transformer executes, without running it.

The fast path of ``perfsdk simulate``: from an :class:`~perfsdk.models.arch.Architecture`, a
batch size and token counts it emits one :class:`~perfsdk.capture.ops.OpRecord` per operation of the
encode phase (the encoder of an encoder-decoder, or the vision tower and projector of a
vision-language model; step 0), of the prefill (step 0) and of every decode step (steps 1..G-1,
each generating one token per sequence), with the same conventions as operation capture:
``flops`` = 2 per multiply-add, ``bytes_read`` includes weights and KV cache, ``kv_bytes`` is the
KV-cache part. The weight matrices are the architecture's own lists
(:meth:`~perfsdk.models.arch.Architecture.attention_linears`, ``mlp_linears`` …), the very ones
the FLOPs counter's analytic model sums, so both give the same FLOPs. Module paths follow the
``transformers`` layout of a Llama (``model.layers.N.self_attn.q_proj`` …) for decoder-only
families, and the model's own layout for LLaVA (``model.vision_tower.encoder.layers.N``,
``model.multi_modal_projector``, ``model.language_model.layers.N``) and T5
(``encoder.block.N.layer.0.SelfAttention.q`` …).

Conventions follow :mod:`perfsdk.capture`: attention counts the full QK^T and PV products over
every (query, key) pair handed to the kernel (no causal halving; GQA counted with the query
heads), and normalization, activation, softmax and other elementwise ops carry no FLOPs, only
``elements`` (output elements) and bytes.

Modelled: GQA and MQA (KV heads), per-layer sliding windows (the cache keeps ``window - 1`` past
positions, so the keys read are capped once a cache exists; the first forward gets every key,
masked), latent attention (the compressed cache expanded by ``kv_b_proj`` over every key),
MoE (router, then only the experts the batch's tokens reach, ``E * (1 - (1 - k/E)^tokens)`` of them
in expectation, the routed rows split among them; shared experts over every token), T5's
cross-attention (keys and values of the encoder output projected once, in the first decoder
forward) and relative position bias, and the language model head on the last position only (as
``generate`` does). The KV cache grows by concatenation, as ``transformers``' ``DynamicCache``
does (each decode step reads and rewrites the cache).
"""

from __future__ import annotations

import math

from perfsdk.hardware.profile import DTYPE_BYTES, DTYPE_KEYS
from perfsdk.models.arch import Architecture, Linear, generate_shape
from perfsdk.capture.ops import OpRecord, Phase


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a torch dtype name (``bfloat16`` -> 2)."""
    key = DTYPE_KEYS.get(dtype.removeprefix("torch.").lower())
    if key is None:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[key]


def expected_active_experts(num_experts: int, top_k: int, tokens: int) -> int:
    """Distinct experts reached when ``tokens`` tokens each pick ``top_k`` of ``num_experts``."""
    if num_experts <= 0 or tokens <= 0:
        return 0
    p_untouched = (1.0 - top_k / num_experts) ** tokens
    return max(min(top_k, num_experts), min(num_experts, math.ceil(num_experts * (1.0 - p_untouched) - 1e-9)))


class _Emitter:
    def __init__(self, dtype: str, phase: Phase, step: int, context_len: int, weights_in_out: bool = False) -> None:
        self.dtype = dtype
        self.weights_in_out = weights_in_out  # the model's layer weights are stored [in, out] (Conv1D)
        self.s = dtype_bytes(dtype)
        self.phase = phase
        self.step = step
        self.context_len = context_len
        self.ops: list[OpRecord] = []

    def _add(self, **kw: object) -> None:
        self.ops.append(OpRecord(phase=self.phase, step=self.step, dtype=self.dtype,
                                 context_len=self.context_len, **kw))  # type: ignore[arg-type]

    def linear(self, path: str, batch: int, tokens: int, k: int, n: int, rows: int | None = None,
               bias: bool = False, launches: int = 1, in_out: bool = False) -> None:
        """``[rows, k] @ [k, n]``; ``rows`` defaults to batch * tokens (an MoE expert gets its share).
        ``in_out``: the weight is stored [k, n] (Conv1D), so its rows are the k input features,
        shared by the parts of a fused call (counted on the part that makes the call)."""
        m = batch * tokens if rows is None else rows
        s = self.s
        w = int((k * n + (n if bias else 0)) * s)
        self._add(module_path=path, op="linear", category="matmul", module_type="Linear",
                  input_shapes=[(batch, tokens, k)], output_shape=(batch, tokens, n),
                  flops=2 * m * k * n, macs=m * k * n, weight_bytes=w,
                  bytes_read=w + int(m * k * s), bytes_written=int(m * n * s), elements=m * n, launches=launches,
                  weight_rows=(k if launches else 0) if in_out else n, weight_in_out=in_out)

    def apply(self, prefix: str, lin: Linear, batch: int, tokens: int, rows: int | None = None,
              launches: int = 1) -> None:
        """The layer weight ``lin`` on the new positions, stored as the model stores its layer
        weights; ``launches=0`` for a projection fused into the previous call."""
        self.linear(f"{prefix}.{lin.name}", batch, tokens, lin.in_features, lin.out_features, rows, lin.bias,
                    launches, self.weights_in_out)

    def norm(self, path: str, batch: int, tokens: int, h: int, kind: str, offset: bool = False,
             groups: int = 1) -> None:
        """A normalization over ``h`` features of ``batch x tokens x groups`` rows (``groups``:
        heads of a per-head query/key norm); ``offset``: an RMSNorm scaling by (1 + weight)."""
        e = batch * tokens * h * groups
        s = self.s
        w = int(h * s * (2 if kind == "layer" else 1))
        reads, writes = NORM_TRAFFIC.get(kind, (1.0, 1.0))
        launches = NORM_LAUNCHES.get(kind, 1) + (NORM_OFFSET_LAUNCHES if offset and kind == "rms" else 0)
        self._add(module_path=path, op="rms_norm" if kind == "rms" else "layer_norm", category="norm",
                  module_type="RMSNorm" if kind == "rms" else "LayerNorm",
                  input_shapes=[(batch, tokens, h * groups)], output_shape=(batch, tokens, h * groups),
                  weight_bytes=w, bytes_read=int(reads * e * s) + w, bytes_written=int(writes * e * s), elements=e,
                  launches=launches)

    def pointwise(self, path: str, op: str, category: str, shape: tuple[int, ...], inputs: int,
                  elements: int | None = None, launches: int | None = None,
                  traffic: tuple[float, float] | None = None) -> None:
        """An elementwise op over ``shape``; ``traffic``: (reads, writes) of full tensors when
        it runs as several kernels (default: ``inputs`` reads and one write, or the
        activation's own, :func:`activation_traffic`)."""
        e = elements if elements is not None else math.prod(shape)
        s = self.s
        n = launches if launches is not None else (activation_launches(op) if category == "activation" else 1)
        if traffic is None:
            traffic = activation_traffic(op) if category == "activation" else None
        reads, writes = traffic if traffic is not None else (float(inputs), 1.0)
        self._add(module_path=path, op=op, category=category, input_shapes=[shape] * inputs, output_shape=shape,
                  bytes_read=int(reads * e * s), bytes_written=int(writes * e * s), elements=e, launches=n)

    def attention(self, path: str, batch: int, tokens: int, keys: int, m: Architecture, *,
                  kv_heads: int | None = None, cached: bool = True, launches: int = 1) -> None:
        """Scaled-dot-product attention of ``tokens`` queries over ``keys`` keys.

        ``kv_heads``: heads of the keys and values handed to the kernel (latent attention
        expands them to every query head); ``cached``: whether they are read from the KV cache.
        """
        s = self.s
        hd, vd, nh = m.head_dim, m.v_head_dim, m.num_heads
        nkv = m.num_kv_heads if kv_heads is None else kv_heads
        score_elems = batch * nh * tokens * keys
        kv = int(batch * nkv * keys * (hd + vd) * s)
        q_bytes = int(batch * nh * tokens * hd * s)
        self._add(module_path=path, op="scaled_dot_product_attention", category="attention",
                  module_type="Attention",
                  input_shapes=[(batch, nh, tokens, hd), (batch, nkv, keys, hd), (batch, nkv, keys, vd)],
                  output_shape=(batch, nh, tokens, vd),
                  flops=2 * score_elems * (hd + vd), macs=score_elems * (hd + vd),
                  bytes_read=q_bytes + kv, kv_bytes=kv if cached else 0,
                  bytes_written=int(batch * nh * tokens * vd * s) + int(batch * nkv * tokens * (hd + vd) * s),
                  elements=score_elems, launches=launches)


# Kernel calls one analytic op stands for in eager PyTorch / transformers (what a per-call
# overhead multiplies; see ``launch_overhead_s`` in the cost model).
NORM_LAUNCHES = {"rms": 6, "layer": 1}  # RMSNorm: pow, mean, add, rsqrt, mul, mul; LayerNorm: one kernel
NORM_OFFSET_LAUNCHES = 2  # Gemma's RMSNorm: 1 + weight, and the cast back (type_as)
# Gemma 2's capped attention runs eagerly: QK^T, / cap, tanh, * cap, + mask, softmax, dropout, PV
SOFTCAP_ATTENTION_LAUNCHES = 8
SOFTCAP_SCORE_TRAFFIC = (6.0, 5.0)  # the score tensor read and written by the elementwise steps
SOFTCAP_LOGIT_LAUNCHES = 3  # / cap, tanh, * cap
# calls to dropout (a no-op in eval mode, still a dispatched call) per layer, per family
DROPOUT_CALLS = {"gpt2": 2, "gpt_bigcode": 2, "gpt_neox": 2, "starcoder2": 2, "phi": 2, "phi3": 2}
ROTARY_LAUNCHES = 10  # per query and key: x * cos, rotate_half (neg, cat), * sin, add
KV_CACHE_LAUNCHES = 2  # one concatenation for the keys, one for the values
# activations written as several elementwise kernels (tanh approximations of GELU, x * sigmoid(a x))
_ACTIVATION_LAUNCHES = {"gelu_new": 8, "gelu_accurate": 9, "gelu_python_tanh": 8, "quick_gelu": 3}
# mixture of experts: the router's softmax, top-k and renormalisation
MOE_ROUTER_LAUNCHES = 4
# Kernel calls that sort, count, scan or scatter (sort, histc, cumsum, top-k, arange, index_put_,
# a gather into a new tensor) allocate their outputs and run a kernel of their own: each costs
# what an operation costs (``op_overhead_s``), not the cheaper further call of an elementwise
# chain (``launch_overhead_s``), so the routing of a mixture of experts emits them as ops of
# their own. The router: softmax, sum and division chained, top-k an op of its own.
MOE_ROUTER_INDEX_CALLS = ("topk",)
# DeepSeek-V3's group-limited routing: sigmoid, bias, per-group top-2 sums, group top-k, group
# mask (zeros, scatter, expand, not, fill), top-k, gather of the weights, renormalise, scale
MOE_ROUTER_LAUNCHES_BY_TYPE = {"deepseek_v3": 16}
# every supported MoE family stores its experts as 3-D tensors, which go through transformers'
# experts interface, grouped by default:
# the routed rows sorted by expert (sort, index of the token, gather of the rows and of their
# weights, histc, cumsum), one grouped product for every expert's gate/up and one for the downs,
# then the weights applied, the order restored (empty_like, arange, index_put_, gather) and the
# top-k outputs of each token summed
MOE_GROUPED_DISPATCH_LAUNCHES = 7
MOE_GROUPED_COMBINE_LAUNCHES = 6
# of which ops of their own (the rest, chained on the gather of the rows and on the final
# gather: the token index perm // top_k and the cast for histc; the weighting, empty_like and
# the sum over the top-k)
MOE_GROUPED_DISPATCH_INDEX_CALLS = ("sort", "index_weights", "histc", "cumsum")
MOE_GROUPED_COMBINE_INDEX_CALLS = ("arange", "index_put_")


# Memory traffic of the ops written as several kernels, in full tensors (reads, writes): every
# kernel of the chain reads and writes a whole intermediate, so it moves several times the bytes
# of one fused pass. RMSNorm: pow (1 read, 1 write), mean (1, ~0), x * rsqrt (1, 1), weight * x
# (1, 1); rotary, per query/key tensor of e elements: x * cos (1, 1), rotate_half's neg of one
# half and cat (1, 1), * sin (1, 1), the sum (2, 1); the tanh GELU: x^3, * c, + x, * sqrt(2/pi),
# tanh, + 1, * 0.5 x (about 10 reads, 8 writes); quick GELU: * 1.702, sigmoid, * x (4, 3).
NORM_TRAFFIC = {"rms": (4.0, 3.0), "layer": (1.0, 1.0)}
ROTARY_TRAFFIC = (5.0, 4.0)  # per element of the query + key tensors
_ACTIVATION_TRAFFIC = {"gelu_new": (10.0, 8.0), "gelu_accurate": (11.0, 9.0), "gelu_python_tanh": (10.0, 8.0),
                       "quick_gelu": (4.0, 3.0)}


def activation_launches(act: str) -> int:
    """Kernel calls of the activation ``act`` (a transformers ``hidden_act`` name)."""
    return _ACTIVATION_LAUNCHES.get(act, 1)


def activation_traffic(act: str) -> tuple[float, float] | None:
    """(reads, writes) in full tensors of the activation ``act`` when it runs as several kernels."""
    return _ACTIVATION_TRAFFIC.get(act)


def _names(m: Architecture) -> dict[str, str]:
    """Module names inside one block (T5 names its sub-layers by position)."""
    if m.model_type == "t5":
        mlp_norm = f"layer.{2 if m.cross_attention else 1}.layer_norm"
        return {"attn_norm": "layer.0.layer_norm", "attn": "layer.0.SelfAttention", "cross_norm": "layer.1.layer_norm",
                "cross": "layer.1.EncDecAttention", "mlp_norm": mlp_norm, "mlp": mlp_norm.replace("layer_norm", "DenseReluDense")}
    if m.norms_per_layer == 4:  # Gemma 2 and 3: each block's output normalized too
        return {"attn_norm": "input_layernorm", "attn": "self_attn", "attn_out_norm": "post_attention_layernorm",
                "mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm", "mlp": "mlp"}
    return {"attn_norm": "layer_norm1" if m.role == "vision" else "input_layernorm", "attn": "self_attn",
            "mlp_norm": "layer_norm2" if m.role == "vision" else "post_attention_layernorm", "mlp": "mlp"}


def _layer(e: _Emitter, m: Architecture, li: int, batch: int, tokens: int, past: int, encoder_tokens: int) -> None:
    h = m.hidden_size
    p = f"{m.layers_path}.{li}"
    n = _names(m)
    attn = f"{p}.{n['attn']}"
    off = m.norm_unit_offset
    dropouts = DROPOUT_CALLS.get(m.model_type, 0) // 2
    e.norm(f"{p}.{n['attn_norm']}", batch, tokens, h, m.norm, off)
    *proj, out = m.attention_linears()
    for j, lin in enumerate(proj):
        e.apply(p, lin, batch, tokens, launches=0 if m.fused_qkv and j else 1)
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    if m.kv_lora_rank is not None:  # latent attention normalizes its compressed query and key-value
        if m.q_lora_rank:
            e.norm(f"{attn}.q_a_layernorm", batch, tokens, m.q_lora_rank, "rms", off)
        e.norm(f"{attn}.kv_a_layernorm", batch, tokens, m.kv_lora_rank, "rms", off)
    if m.qk_norm == "head":  # per head, over the head size (Qwen3, Gemma 3)
        e.norm(f"{attn}.q_norm", batch, tokens, m.head_dim, "rms", off, groups=m.num_heads)
        e.norm(f"{attn}.k_norm", batch, tokens, m.head_dim, "rms", off, groups=m.num_kv_heads)
    elif m.qk_norm == "full":  # over every query and key feature (OLMo 2)
        e.norm(f"{attn}.q_norm", batch, tokens, q_out, "rms", off)
        e.norm(f"{attn}.k_norm", batch, tokens, kv_out, "rms", off)
    if m.position == "rope":
        e.pointwise(f"{attn}.rotary", "rotary_embedding", "elementwise", (batch, tokens, q_out + kv_out), inputs=2,
                    launches=ROTARY_LAUNCHES, traffic=ROTARY_TRAFFIC)
    keys = m.keys_attended(li, past, tokens)
    if past and m.causal:
        # transformers' DynamicCache appends by concatenation: the cached entries are read and
        # rewritten with the new ones on every step (a sliding layer keeps window - 1 of them)
        w = m.window(li)
        old = min(past, w - 1) if w is not None else past
        width = m.cache_width()
        kv_old = int(batch * old * width * e.s)
        kv_in = int(batch * tokens * width * e.s)
        heads, per_head = (1, width) if m.kv_lora_rank is not None else (m.num_kv_heads, m.head_dim)
        e._add(module_path=f"{attn}.kv_cache", op="cat", category="other",
               input_shapes=[(batch, heads, old, per_head)], output_shape=(batch, heads, old + tokens, per_head),
               bytes_read=kv_old + kv_in, bytes_written=kv_old + kv_in, kv_bytes=kv_old,
               elements=batch * (old + tokens) * width, launches=KV_CACHE_LAUNCHES)
    expand = m.key_linears()
    for lin in expand:  # latent attention: the cached latent expanded to keys and values
        e.apply(p, lin, batch, keys, rows=batch * keys)
    if m.relative_attention_num_buckets:
        e.pointwise(f"{attn}.relative_attention_bias", "add", "elementwise", (batch, m.num_heads, tokens, keys), inputs=2)
    e.attention(f"{attn}.attn", batch, tokens, keys, m, kv_heads=m.num_heads if expand else None,
                cached=m.causal and not expand, launches=2 if m.attn_logit_softcapping else 1)
    if m.attn_logit_softcapping:  # the eager path's elementwise steps over the scores
        e.pointwise(f"{attn}.softcap", "softcap_softmax", "elementwise", (batch, m.num_heads, tokens, keys),
                    inputs=1, launches=SOFTCAP_ATTENTION_LAUNCHES - 2, traffic=SOFTCAP_SCORE_TRAFFIC)
    e.apply(p, out, batch, tokens)
    if "attn_out_norm" in n:
        e.norm(f"{p}.{n['attn_out_norm']}", batch, tokens, h, m.norm, off)
    e.pointwise(f"{p}.residual_attn", "add", "elementwise", (batch, tokens, h), inputs=2, launches=1 + dropouts)
    if m.cross_attention:
        cross = f"{p}.{n['cross']}"
        (q, o), kv = m.cross_attention_linears()
        e.norm(f"{p}.{n['cross_norm']}", batch, tokens, h, m.norm)
        e.apply(p, q, batch, tokens)
        if past == 0:  # keys and values of the encoder output, projected once and cached
            for lin in kv:
                e.apply(p, lin, batch, encoder_tokens)
        e.attention(f"{cross}.attn", batch, tokens, encoder_tokens, m)
        e.apply(p, o, batch, tokens)
        e.pointwise(f"{p}.residual_cross", "add", "elementwise", (batch, tokens, h), inputs=2)
    if m.norms_per_layer > 1 or m.model_type == "t5":  # one shared norm: attention and MLP in parallel (Phi)
        e.norm(f"{p}.{n['mlp_norm']}", batch, tokens, h, m.norm, off)
    if m.is_moe_layer(li):
        _moe(e, m, p, batch, tokens)
    else:
        _mlp(e, m, p, m.mlp_linears(prefix=f"{n['mlp']}."), batch, tokens, None, fused=m.fused_gate_up)
    if "mlp_out_norm" in n:
        e.norm(f"{p}.{n['mlp_out_norm']}", batch, tokens, h, m.norm, off)
    e.pointwise(f"{p}.residual_mlp", "add", "elementwise", (batch, tokens, h), inputs=2, launches=1 + dropouts)


def _mlp(e: _Emitter, m: Architecture, p: str, lins: tuple[Linear, ...], batch: int, tokens: int,
         rows: int | None, fused: bool = False) -> None:
    n = batch * tokens if rows is None else rows
    inter = lins[0].out_features
    act_shape = (batch, tokens, inter)
    act_path = f"{p}.{lins[0].name.rsplit('.', 1)[0]}.act_fn" if "." in lins[0].name else f"{p}.act_fn"
    act = m.hidden_act or "act"
    if m.gated_mlp:
        gate, up, down = lins
        e.apply(p, gate, batch, tokens, rows)
        e.apply(p, up, batch, tokens, rows, launches=0 if fused else 1)
        e.pointwise(act_path, act, "activation", act_shape, inputs=1, elements=n * inter)
        e.pointwise(act_path.replace("act_fn", "gate_mul"), "mul", "elementwise", act_shape, inputs=2,
                    elements=n * inter)
        e.apply(p, down, batch, tokens, rows)
    else:
        up, down = lins
        e.apply(p, up, batch, tokens, rows)
        e.pointwise(act_path, act, "activation", act_shape, inputs=1, elements=n * inter)
        e.apply(p, down, batch, tokens, rows)


def _moe(e: _Emitter, m: Architecture, p: str, batch: int, tokens: int) -> None:
    n_tok = batch * tokens
    e.apply(p, m.router(), batch, tokens)
    launches = MOE_ROUTER_LAUNCHES_BY_TYPE.get(m.model_type, MOE_ROUTER_LAUNCHES)
    calls = MOE_ROUTER_INDEX_CALLS if m.model_type not in MOE_ROUTER_LAUNCHES_BY_TYPE else ()
    e.pointwise(f"{p}.mlp.router_softmax", "softmax", "softmax", (batch, tokens, m.num_experts), inputs=1,
                launches=launches - len(calls))
    _index_calls(e, f"{p}.mlp.router", calls, (n_tok * m.experts_per_token,))
    active = expected_active_experts(m.num_experts, m.experts_per_token, n_tok)
    routed = n_tok * m.experts_per_token
    _grouped_experts(e, m, p, batch, tokens, active, routed)
    shared = m.shared_expert_linears()
    if shared:
        mlp = shared[:3] if m.gated_mlp else shared[:2]
        _mlp(e, m, p, mlp, batch, tokens, None)
        for lin in shared[len(mlp):]:  # the shared expert's gate
            e.apply(p, lin, batch, tokens)


def _expert_rows(routed: int, active: int) -> list[int]:
    """The routed rows (tokens x top_k) split as evenly as whole rows allow among the experts reached."""
    base, extra = divmod(routed, active)
    return [base + (1 if j < extra else 0) for j in range(active)]


def _grouped_experts(e: _Emitter, m: Architecture, p: str, batch: int, tokens: int, active: int, routed: int) -> None:
    """Experts stored as 3-D tensors, run grouped: the routed rows sorted by expert and gathered,
    one grouped product over every expert reached for gate/up and one for down (each expert's
    share of it an op of its own, the call counted once), the outputs weighted, put back in
    order and summed over each token's top-k."""
    h = m.hidden_size
    e.pointwise(f"{p}.mlp.dispatch", "index", "other", (routed, h), inputs=1,
                launches=MOE_GROUPED_DISPATCH_LAUNCHES - len(MOE_GROUPED_DISPATCH_INDEX_CALLS))
    _index_calls(e, f"{p}.mlp.dispatch", MOE_GROUPED_DISPATCH_INDEX_CALLS, (routed,))
    inter = m.expert_intermediate_size
    for j, rows in enumerate(_expert_rows(routed, active)):
        first = 1 if j == 0 else 0
        gate, up, down = m.mlp_linears(inter, prefix=f"mlp.experts.{j}.")
        act_path = f"{p}.mlp.experts.{j}.act_fn"
        e.apply(p, gate, batch, tokens, rows, launches=first)
        e.apply(p, up, batch, tokens, rows, launches=0)
        e.pointwise(act_path, m.hidden_act or "act", "activation", (batch, tokens, inter), inputs=1,
                    elements=rows * inter, launches=first * activation_launches(m.hidden_act or "act"))
        e.pointwise(act_path.replace("act_fn", "gate_mul"), "mul", "elementwise", (batch, tokens, inter), inputs=2,
                    elements=rows * inter, launches=first)
        e.apply(p, down, batch, tokens, rows, launches=first)
    # weighting, reordering (a gather) and the sum over each token's top-k: three passes over the rows
    e.pointwise(f"{p}.mlp.combine", "index", "other", (routed, h), inputs=1,
                launches=MOE_GROUPED_COMBINE_LAUNCHES - len(MOE_GROUPED_COMBINE_INDEX_CALLS), traffic=(3.0, 3.0))
    _index_calls(e, f"{p}.mlp.combine", MOE_GROUPED_COMBINE_INDEX_CALLS, (routed,))


def _index_calls(e: _Emitter, path: str, names: tuple[str, ...], shape: tuple[int, ...]) -> None:
    """Sorting, counting, scanning and scattering kernels over a small index tensor, one op each
    (see :data:`MOE_ROUTER_INDEX_CALLS`)."""
    for name in names:
        e.pointwise(f"{path}.{name}", name, "other", shape, inputs=1, launches=1)


def _embedding(e: _Emitter, path: str, batch: int, tokens: int, vocab: int, h: int) -> None:
    s = e.s
    e._add(module_path=path, op="embedding", category="embedding", module_type="Embedding",
           input_shapes=[(batch, tokens)], output_shape=(batch, tokens, h), weight_bytes=int(vocab * h * s),
           bytes_read=int(batch * tokens * (h * s + 8)), bytes_written=int(batch * tokens * h * s),
           elements=batch * tokens * h)


def forward_ops(m: Architecture, batch: int, tokens: int, past: int, dtype: str, phase: Phase, step: int,
                logits_tokens: int = 1, encoder_tokens: int = 0) -> list[OpRecord]:
    """The ops of one decoder forward: ``tokens`` new positions per sequence after ``past`` cached ones.

    ``encoder_tokens``: encoder positions an encoder-decoder's cross-attention attends.
    """
    e = _Emitter(dtype, phase, step, past + tokens, m.weights_in_out)
    h = m.hidden_size
    _embedding(e, m.embed_path, batch, tokens, m.vocab_size, h)
    for li in range(m.num_layers):
        _layer(e, m, li, batch, tokens, past, encoder_tokens)
    e.norm(m.final_norm_path, batch, logits_tokens, h, m.norm, m.norm_unit_offset)
    e.linear("lm_head", batch, logits_tokens, h, m.vocab_size, bias=m.lm_head_bias)
    if m.final_logit_softcapping:
        e.pointwise("lm_head.softcap", "softcap", "elementwise", (batch, logits_tokens, m.vocab_size), inputs=1,
                    launches=SOFTCAP_LOGIT_LAUNCHES, traffic=(3.0, 3.0))
    return e.ops


def encode_ops(m: Architecture, batch: int, encoder_tokens: int, images: int, dtype: str) -> list[OpRecord]:
    """The ops of the encode phase (step 0): the encoder over ``encoder_tokens`` positions, or the
    vision tower and projector over ``images`` images per sequence. Empty for a decoder-only model."""
    enc = m.encoder
    if enc is None:
        return []
    if enc.role == "encoder":
        e = _Emitter(dtype, "encode", 0, encoder_tokens, enc.weights_in_out)
        _embedding(e, enc.embed_path, batch, encoder_tokens, enc.vocab_size, enc.hidden_size)
        for li in range(enc.num_layers):
            _layer(e, enc, li, batch, encoder_tokens, 0, 0)
        e.norm(enc.final_norm_path, batch, encoder_tokens, enc.hidden_size, enc.norm)
        return e.ops
    n_img = batch * images
    if not n_img:
        return []
    t, h, s = enc.tokens_per_image, enc.hidden_size, dtype_bytes(dtype)
    e = _Emitter(dtype, "encode", 0, t)
    macs = n_img * enc.patch_embedding_macs()
    w = int(enc.num_channels * enc.patch_size ** 2 * h * s)
    pixels = n_img * enc.num_channels * enc.image_size ** 2
    e._add(module_path=f"{enc.embed_path}.patch_embedding", op="conv2d", category="matmul", module_type="Conv2d",
           input_shapes=[(n_img, enc.num_channels, enc.image_size, enc.image_size)],
           output_shape=(n_img, h, enc.image_size // enc.patch_size, enc.image_size // enc.patch_size),
           flops=2 * macs, macs=macs, weight_bytes=w, bytes_read=w + int(pixels * s),
           bytes_written=int(n_img * enc.patches_per_image * h * s), elements=n_img * enc.patches_per_image * h)
    e.pointwise(f"{enc.embed_path}.position_embedding", "add", "elementwise", (n_img, t, h), inputs=2)
    e.norm(enc.final_norm_path.replace("post_layernorm", "pre_layrnorm"), n_img, t, h, enc.norm)
    for li in range(enc.num_layers):
        _layer(e, enc, li, n_img, t, 0, 0)
    e.norm(enc.final_norm_path, n_img, 1, h, enc.norm)  # the pooled class token
    per_image = m.image_tokens_per_image
    first, *rest = m.projector
    prefix = first.name.rsplit(".", 1)[0]
    e.linear(first.name, n_img, per_image, first.in_features, first.out_features, bias=first.bias)
    e.pointwise(f"{prefix}.act", m.projector_act or "gelu", "activation", (n_img, per_image, first.out_features),
                inputs=1)
    for lin in rest:
        e.linear(lin.name, n_img, per_image, lin.in_features, lin.out_features, bias=lin.bias)
    return e.ops


def generation_ops(m: Architecture, batch_size: int, input_tokens: int, output_tokens: int, dtype: str = "bfloat16",
                   decode_steps: list[int] | None = None, images: int | None = None) -> list[OpRecord]:
    """Ops of ``generate``: encode (step 0, when the model has an encoder or a vision tower),
    prefill (step 0) and decode steps 1..output_tokens-1.

    ``input_tokens`` are the prompt's text tokens (an encoder-decoder's encoder input); a
    vision-language model's prompt also holds ``images`` (default 1) times its image tokens.
    ``decode_steps`` limits the decode steps emitted (the predictor weights a sample of steps to
    stand for all of them on long generations).
    """
    if batch_size < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("batch size, input tokens and output tokens must be at least 1")
    shape = generate_shape(m, batch_size, input_tokens, output_tokens, images)
    p, enc = shape.prompt_tokens, shape.encoder_tokens
    ops = encode_ops(m, batch_size, enc, shape.images, dtype)
    ops.extend(forward_ops(m, batch_size, p, 0, dtype, "prefill", 0, encoder_tokens=enc))
    steps = range(1, output_tokens) if decode_steps is None else decode_steps
    for k in steps:
        ops.extend(forward_ops(m, batch_size, 1, p + k - 1, dtype, "decode", k, encoder_tokens=enc))
    return ops


def sampled_decode_steps(output_tokens: int, max_steps: int = 64) -> tuple[list[int], dict[int, float]]:
    """Evenly spaced decode steps and the weight each carries so that they sum to all steps."""
    n = output_tokens - 1
    if n <= max_steps:
        steps = list(range(1, output_tokens))
        return steps, {k: 1.0 for k in steps}
    # midpoints of equal strata, so the linear growth of KV traffic averages out exactly
    width = n / max_steps
    steps = sorted({1 + int(width * (j + 0.5)) for j in range(max_steps)})
    w = n / len(steps)
    return steps, {k: w for k in steps}

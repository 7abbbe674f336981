"""The operation record: one captured tensor operation of a real or meta-device run.

Operation capture (``perfsdk.capture``) produces these; the FLOPs collector sums them, the
hardware simulation costs them, the layer collectors attribute them to modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

OpCategory = Literal[
    "matmul", "attention", "norm", "activation", "softmax", "embedding", "elementwise", "other"
]
Phase = Literal["encode", "prefill", "decode", "forward"]


@dataclass
class OpRecord:
    """One operation with its cost drivers.

    ``flops`` counts multiply and add separately (2 per multiply-add); ``macs`` is the
    multiply-add count. Bytes are what the operation must read/write at minimum: weights,
    activations and KV cache (``kv_bytes`` is the KV-cache part of ``bytes_read``).
    """

    module_path: str
    op: str
    category: OpCategory
    phase: Phase
    step: int = 0
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)
    output_shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    flops: int = 0
    macs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    weight_bytes: int = 0
    kv_bytes: int = 0
    # output elements of an elementwise, norm, activation or softmax op; for a fused attention
    # kernel, its score elements (batch x heads x queries x keys), as the analytic generator's
    elements: int = 0
    context_len: int | None = None
    module_type: str | None = None
    time_s: float | None = None  # measured duration, when the capture was asked to time operations
    # kernel calls the operation stands for: 1 for a captured ATen op (an attention call that runs
    # PyTorch's unfused path, one per kernel of it); an analytic op may stand for
    # several (an RMSNorm is pow, mean, add, rsqrt, mul, mul in eager PyTorch) or for none (the key
    # and value parts of a fused QKV projection ride on the query's call)
    launches: int = 1
    # rows of a matrix product's weight as stored (a linear layer's output features; the input
    # features of a weight stored [in, out], transformers' Conv1D); None: the output features
    weight_rows: int | None = None
    # a matrix product whose weight is stored [in, out] (transformers' Conv1D), read along its
    # output features, rather than [out, in] as a linear layer stores it: a CPU kernel runs products
    # of few rows at another speed on each layout (see perfsdk.simulation.costmodel.half_rows)
    weight_in_out: bool = False
    # a grouped matrix product (mixture-of-experts experts stored as one [E, ...] weight): the
    # groups E of its weight, and the rows each group received when a real run's offsets said so
    # (None on the meta device, where the routing has no values). A CPU grouped product runs one
    # product per group that has rows: see perfsdk.simulation.costmodel.product_rows
    groups: int | None = None
    group_rows: list[int] | None = None
    # groups each token's rows go to, all different (a mixture-of-experts router's top-k): on the
    # meta device a group then receives each token's rows with probability picks / groups, at
    # most one row a token. None: each row picks a group on its own
    group_picks: int | None = None
    # the dtype a conversion (aten._to_copy) reads; None for other ops. A conversion between two
    # floating-point dtypes that a run in another dtype would not make (the casts of a bfloat16
    # capture predicted in float32) is left out there: see perfsdk.simulation.predictor.rescale_ops
    input_dtype: str | None = None

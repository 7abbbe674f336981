"""The per-operation cost model.

For one operation on one device (profile ``P``)::

    compute_s  = flops / (P.peak[dtype] * P.compute_efficiency)
                 (softmax / activation / norm ops: elements * ns_per_element, when P gives it;
                  attention adds score elements * softmax ns_per_element; a matrix product with
                  R output rows is slowed by (R + P.matmul_half_rows) / R, small-M inefficiency
                  (from 4 * P.matmul_pack_rows rows when that is set: small_m_applies; a weight
                  stored [in, out] takes P.matmul_half_rows_in_out where that is set; with
                  P.matmul_small_m_gaps, h less the gap of the weight's layout and the product's
                  inner size: half_rows))
    memory_s   = (bytes_read + bytes_written) / (P.memory_bandwidth * P.memory_efficiency)
                 (with P.cache_mb: a forward pass touching R bytes of weights + KV cache has
                  min(1, cache / R) of its bytes, or P.cache_shares at R where measured, served
                  at P.cache_bandwidth instead: cached_share; an
                  embedding lookup touches the rows it gathers, not its table: resident_bytes)
                 (a grouped product, mixture-of-experts on a CPU, runs one product per group it
                  reaches, each with its own rows: product_rows)
    pack_s     = weight_bytes / P.matmul_pack_gbs  for a matrix product with >= P.matmul_pack_rows rows
                 (x P.matmul_pack_fast_share for a weight of at most P.matmul_pack_fast_mb, which the
                  first pass left in the cores' own caches: fast_pack_share)
                 + stored weight rows * P.matmul_ns_per_weight_row (each row of a matrix product's
                   weight as stored, weight_rows; P.matmul_weight_row_costs at the row's length in
                   bytes instead where set: weight_row_ns; with P.matmul_pack_rows set, only on products of
                   fewer than 4 * P rows, which run without the blocked kernel: weight_row_share;
                   with P.cache_mb, on the share of the weight streamed from memory only)
    alloc_s    = fresh_bytes / P.fresh_write_gbs  (fresh_bytes: what a decode step writes into an
                 output that outgrows every buffer freed before it, the KV cache concatenated one
                 position longer each step: fresh_bytes)
    serial_s   = what a grouped product's products, run one after another, each bound by its own
                 compute or memory, take beyond max(compute_s, memory_s) of their totals
                 (serial_products; 0 for every other op)
    time_s     = max(compute_s, memory_s) + serial_s + pack_s + alloc_s + overhead_s
                 (with P.matmul_few_rows, a matrix product of 2 rows up to its last count (16 as
                  calibrated, at 4P's ratio past 4P rows) takes compute_s, memory_s and pack_s of the
                  same product at one row
                  (a grouped product: of each expert's product it runs at one row), each times the
                  staircase's ratio at its rows and weight size, averaged over its products:
                  few_row_op)
    overhead_s = P.op_overhead_s + (launches - 1) * P.launch_overhead_s
                 (launches: kernel calls the op stands for; no overhead for views and for the parts
                  of a fused call, launches = 0)
               = launches * P.call_overhead_s on a profile that sets it (a calibrated host: every
                 ATen call of the model's code that runs a kernel costs the same; views are free;
                 a call of a pass over a whole input, the prefill, an encoder's or a single forward,
                 P.prefill_call_overhead_s where that is set)
    energy_j   = flops * P.compute_pj_per_flop + 8 * bytes * P.memory_pj_per_bit   (dynamic)
                 + P.static_power_w * time_s                                          (static)

Transfers through the host (mapping transfer points) add
``h2d_bytes / P.host_to_device + d2h_bytes / P.device_to_host`` seconds and
``8 * bytes * pJ/bit`` of each direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perfsdk.hardware.profile import FewRowRatios, HardwareProfile, HardwareProfileError
from perfsdk.capture.ops import OpRecord

PJ = 1e-12
#: the phases that pass over a whole input (a prompt, an encoder's input, one forward): on a
#: calibrated host their ATen calls cost ``prefill_call_overhead_s``, a decode step's ``call_overhead_s``
WHOLE_INPUT_PHASES = ("prefill", "encode", "forward")


@dataclass
class OpCost:
    """Cost of one op on one device. ``dynamic_energy_j`` excludes static power."""

    compute_s: float
    memory_s: float
    overhead_s: float
    transfer_s: float = 0.0
    pack_s: float = 0.0
    alloc_s: float = 0.0
    serial_s: float = 0.0
    compute_energy_j: float = 0.0
    memory_energy_j: float = 0.0
    transfer_energy_j: float = 0.0
    static_power_w: float = 0.0

    @property
    def time_s(self) -> float:
        return (max(self.compute_s, self.memory_s) + self.serial_s + self.pack_s + self.alloc_s + self.overhead_s
                + self.transfer_s)

    @property
    def dynamic_energy_j(self) -> float:
        return self.compute_energy_j + self.memory_energy_j + self.transfer_energy_j

    @property
    def energy_j(self) -> float:
        """Dynamic energy plus the device's static power over the op's time."""
        return self.dynamic_energy_j + self.static_power_w * self.time_s

    @property
    def bound(self) -> str:
        """``transfer`` if moving data through the host takes longest, else compute or memory."""
        if self.transfer_s > max(self.compute_s, self.memory_s):
            return "transfer"
        return "compute" if self.compute_s >= self.memory_s else "memory"


_NS_FIELD = {"softmax": "softmax_ns_per_element", "activation": "activation_ns_per_element",
             "norm": "norm_ns_per_element"}


def op_bytes(op: OpRecord) -> int:
    """Bytes the op moves through device memory (read + written)."""
    return op.bytes_read + op.bytes_written


_PRECISION_ORDER = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4")


def matmul_rows(op: OpRecord) -> float:
    """Rows of a matrix product's output (batch x tokens for a linear layer), at least 1."""
    if op.output_shape and len(op.output_shape) >= 2 and op.output_shape[-1]:
        return max(1.0, op.elements / op.output_shape[-1] if op.elements else
                   float(_prod(op.output_shape[:-1])))
    return 1.0


def pack_passes(rows: Any, pack_rows: float) -> Any:
    """Extra passes over a matrix product's weights with ``rows`` output rows (a number or a
    numpy array), on top of the one pass its bytes count, for a profile with
    ``matmul_pack_rows`` = ``pack_rows`` = P (0: none).

    Below P rows a matrix-vector kernel streams the weights once. From P rows the weights are
    repacked (one pass) and a small-M kernel streams them once per block of P rows, ``ceil(R / P)``
    passes in all beyond the first, up to ``4 P`` rows; from there the blocked kernel keeps them
    in cache and only the repacking pass remains. (On a 2-core x86 host with PyTorch's CPU BLAS a
    [1408, 512] fp32 product takes 88 µs at 1–3 rows, 166 at 4, 249 at 7, 339 at 12, 419 at 15 and
    304 at 16: P = 4.) With P = 1 a product of 2 or 3 rows streams its weights once per row
    and one of 4 rows or more repacks them once: one-row products never repack.
    """
    if not pack_rows:
        return np.zeros_like(rows, dtype=float) if isinstance(rows, np.ndarray) else 0.0
    r = np.asarray(rows, dtype=float)
    # a one-row product is a matrix-vector product: it never repacks, whatever P
    out = np.where(r < max(pack_rows, 2.0), 0.0, np.where(r < 4 * pack_rows, np.ceil(r / pack_rows), 1.0))
    return out if isinstance(rows, np.ndarray) else float(out)


def product_rows(op: OpRecord) -> tuple[list[float], list[float]]:
    """The matrix products a matrix-product op runs: their row counts and how many of each.

    A plain product is one product of :func:`matmul_rows` rows. A grouped product (mixture-of-
    experts weights stored as one ``[E, ...]`` tensor, ``op.groups``) runs, on a CPU, one product
    per group that has rows: the rows of each, where a real run's offsets said
    (``op.group_rows``); on the meta device, where the routing has no values, a router sends each
    of the ``M / K`` tokens to ``K`` different groups (``op.group_picks``, its top-k), so ``E *
    Binomial(k; M / K, K / E)`` groups are expected to have k rows (without ``group_picks`` each row
    picks one of the E groups on its own: ``E * Binomial(k; M, 1/E)``). (One thread, a 2-core x86
    host: a batch-4 decode step of a 4-expert top-2 model priced as one product of all eight routed
    rows came out 9-17 % under the measured TPOT; the experts' products of one to three rows each
    stream their weights once more per row.)"""
    rows = matmul_rows(op)
    if not op.groups or op.groups <= 1:
        return [rows], [1.0]
    if op.group_rows is not None:
        sizes = [float(r) for r in op.group_rows if r > 0]
        return (sizes, [1.0] * len(sizes)) if sizes else ([rows], [1.0])
    e = op.groups
    picks = op.group_picks if op.group_picks and op.group_picks <= e else 1
    m = max(1, int(round(rows / picks)))
    p = picks / e
    if p >= 1.0:  # every group receives every token's row
        return [float(m)], [float(e)]
    ks, ws = [], []
    pk = (1.0 - p) ** m  # Binomial(0; m, p), then the recurrence P(k) = P(k-1) (m-k+1)/k p/(1-p)
    for k in range(1, m + 1):
        pk *= (m - k + 1) / k * p / (1.0 - p) if p < 1.0 else 0.0
        if pk * e < 1e-9 and k > m * p:
            break
        ks.append(float(k))
        ws.append(e * pk)
    return (ks, ws) if ks else ([rows], [1.0])


def serial_products(products: tuple[list[float], list[float]], pack_rows: float | None, half: float,
                    compute_s: float, memory_s: float) -> tuple[float, float, float]:
    """The time of the ``products`` an op runs (:func:`product_rows`) one after another, each bound
    by its own compute or memory, given the op's totals ``compute_s`` and ``memory_s``; and the
    shares of those totals that the compute-bound products' compute and the memory-bound
    products' bytes make up.

    Each product's compute is its rows' share of ``compute_s``, ``R + half`` rows where the small-M
    slowdown applies (:func:`small_m_applies`), ``R`` elsewhere; each reads an equal share of
    ``memory_s`` (one group's weights; the rows' activations are small beside them). A plain
    product is one product: ``max(compute_s, memory_s)``. A grouped product's products of one to
    three rows stream their weights while those of four or more compute, so its time exceeds the
    larger of its totals. (Two threads on a 2-core x86 host, a batch-8 decode step of a 4-expert
    top-2 model inside ``generate``: the experts took 733-790 µs a layer in three runs, priced at
    539 µs with the larger of the totals, 660 µs product by product.)"""
    ks, ws = products
    n = sum(ws)
    if len(ks) < 2 or n <= 0:
        compute_bound = float(compute_s >= memory_s)
        return max(compute_s, memory_s), compute_bound, 1.0 - compute_bound
    slow = [half if small_m_applies(k, pack_rows) else 0.0 for k in ks]
    denom = sum(w * (k + h) for k, w, h in zip(ks, ws, slow))
    t = c_share = m_share = 0.0
    for k, w, h in zip(ks, ws, slow):
        c = compute_s * (k + h) / denom if denom > 0 else 0.0
        m = memory_s / n
        if c >= m:
            t += w * c
            c_share += w * c / compute_s if compute_s > 0 else 0.0
        else:
            t += w * m
            m_share += w / n
    return t, c_share, m_share


def products_pack_passes(products: tuple[list[float], list[float]], pack_rows: float) -> float:
    """Extra passes over the weights (:func:`pack_passes`) of the ``products`` an op runs
    (:func:`product_rows`), averaged over them: a grouped product's weight bytes are those of
    the groups it reaches."""
    ks, ws = products
    return sum(w * float(pack_passes(k, pack_rows)) for k, w in zip(ks, ws)) / sum(ws)


def product_weight_bytes(weight_bytes: float, products: tuple[list[float], list[float]]) -> float:
    """Bytes of the weight of each of the ``products`` an op runs (:func:`product_rows`): its
    ``weight_bytes`` over the products (a grouped product's weight bytes are those of the groups it
    reaches, one product each; a plain product runs one)."""
    return float(weight_bytes) / max(sum(products[1]), 1.0)


def fast_pack_share(weight_bytes: Any, fast_bytes: float | None, share: float | None) -> Any:
    """What a further pass over a product's weight of ``weight_bytes`` (a number or a numpy array)
    costs, as a share of a pass at the repacking rate: ``share`` where the weight fits the cores'
    own caches (at most ``fast_bytes``: the first pass left it there), else 1. (One thread on a
    2-core x86 host with 2 MiB of level-2 cache a core, fp32 weights cycled over 24 MB: a product of
    4 rows took 9.6 and 15.8 µs more than one of 1 row over [768, 256] and [1024, 256], one pass at
    82 and 66 GB/s, and 280 µs more over [4096, 512], one pass at 30 GB/s.)"""
    if not fast_bytes or not share:
        return np.ones_like(weight_bytes, dtype=float) if isinstance(weight_bytes, np.ndarray) else 1.0
    out = np.where(np.asarray(weight_bytes, dtype=float) <= fast_bytes, share, 1.0)
    return out if isinstance(weight_bytes, np.ndarray) else float(out)


def products_small_m(products: tuple[list[float], list[float]], pack_rows: float | None) -> float:
    """How many of the ``products`` an op runs (:func:`product_rows`) the small-M slowdown
    applies to (:func:`small_m_applies`): the slowdown ``(R + h) / R`` of a product of R rows
    adds h rows' FLOPs, ``h * flops / matmul_rows(op)`` for each."""
    ks, ws = products
    return sum(w for k, w in zip(ks, ws) if small_m_applies(k, pack_rows))


def resident_bytes(op: OpRecord) -> int:
    """Bytes of weights and KV cache the op touches, what its forward pass keeps resident (the
    cache model): its weights as far as it reads them (an embedding lookup reads the rows it
    gathers, not its whole table) plus its KV cache. The same for a captured op, which states
    only the gathered rows as its weights, and for one the analytic generator writes, which states
    the whole table."""
    return min(op.weight_bytes, op.bytes_read) + op.kv_bytes


def small_m_applies(rows: Any, pack_rows: float | None) -> Any:
    """Whether the small-M slowdown ``(R + matmul_half_rows) / R`` applies to a matrix product
    with ``rows`` output rows (a number or a numpy array): for every size when the profile has
    no ``matmul_pack_rows`` = P, else from 4P rows, where the blocked kernel runs. Below, the
    matrix-vector kernel and the small-M staircase (:func:`pack_passes`) are the whole story: at
    1–3 rows a product's time is that of streaming its weights, whatever the rows."""
    return True if not pack_rows else rows >= 4 * pack_rows


def weight_row_applies(rows: Any, pack_rows: float | None) -> Any:
    """Whether the fixed cost per stored weight row (``matmul_ns_per_weight_row``) applies to a
    matrix product with ``rows`` output rows (a number or a numpy array): for every size when the
    profile has no ``matmul_pack_rows`` = P, else below 4P rows. Below 4P the kernel walks the
    weight as it is stored (a matrix-vector kernel, or the small-M staircase) and pays per stored
    row; from 4P the blocked kernel runs on the repacked weights and the stored layout no longer
    shows. (One thread on a 2-core x86 host, P = 1, weights streamed from memory: a [4096, 512]
    fp32 weight as a linear layer stores it against the same weight stored [512, 4096], as a
    Conv1D does, differed by 46, 65 and 65 ns per stored row at 1, 2 and 3 rows, by 8-11 ns at
    4-8 rows; [1024, 256] against [256, 1024]: 34-43 ns at 1-3 rows, -3 to -2 ns at 4-16.)"""
    if not pack_rows:
        return np.ones_like(rows, dtype=bool) if isinstance(rows, np.ndarray) else True
    return rows < 4 * pack_rows


def weight_row_share(products: tuple[list[float], list[float]], pack_rows: float | None) -> float:
    """Share of the ``products`` an op runs (:func:`product_rows`) that pay the cost per stored
    weight row (:func:`weight_row_applies`): a grouped product's stored rows are those of the
    groups it reaches, so each group's product counts for its share of them."""
    ks, ws = products
    return sum(w for k, w in zip(ks, ws) if weight_row_applies(k, pack_rows)) / sum(ws)


def weight_rows(op: OpRecord) -> int:
    """Rows of a matrix product's weight as stored (0 for other ops): ``op.weight_rows`` where
    the op states it, else its output features (a linear layer's weight is [out, in])."""
    if op.category != "matmul" or not op.weight_bytes:
        return 0
    if op.weight_rows is not None:
        return op.weight_rows
    return int(op.output_shape[-1]) if op.output_shape else 0


def _prod(xs: tuple[int, ...]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def effective_flops(profile: HardwareProfile, dtype: str) -> float:
    """Achievable FLOP/s for ``dtype``, lenient: a dtype the profile cannot place (``int64``, or
    ``float32`` on a bf16-only device) uses the profile's most precise type instead. Check
    ``profile.dtype_key(dtype)`` first where a user chose the dtype and deserves an error."""
    try:
        return profile.effective_flops(dtype)
    except HardwareProfileError:
        avail = profile.peak_tflops.available()
        key = next(k for k in _PRECISION_ORDER if k in avail)
        return avail[key] * 1e12 * profile.compute_efficiency


def compute_time_s(op: OpRecord, profile: HardwareProfile, dtype: str | None = None) -> float:
    """The compute term of an op (FLOP-based, or per-element where the profile gives a rate)."""
    field = _NS_FIELD.get(op.category)
    if field is not None:
        ns = getattr(profile, field)
        if ns is not None and op.elements:
            return op.elements * ns * 1e-9
    t = op.flops / effective_flops(profile, dtype or op.dtype) if op.flops else 0.0
    h = half_rows(op, profile) if op.category == "matmul" else 0.0
    if h and t:
        # (R + h) / R on each product of R rows the slowdown applies to
        slowed = products_small_m(product_rows(op), profile.matmul_pack_rows)
        t *= 1.0 + h * slowed / matmul_rows(op)
    if op.category == "attention" and profile.softmax_ns_per_element is not None and op.elements:
        t += op.elements * profile.softmax_ns_per_element * 1e-9
    return t


def inner_size(op: OpRecord) -> float:
    """The inner size K of a matrix product (the input features it sums over): its FLOPs over
    twice its output elements (``elements``, else its output shape's; 0 when unknown)."""
    out = op.elements or (_prod(op.output_shape) if op.output_shape else 0)
    return op.flops / (2.0 * out) if op.category == "matmul" and op.flops and out else 0.0


def half_rows(op: OpRecord, profile: HardwareProfile) -> float:
    """The small-M slowdown's h for a matrix product, ``(R + h) / R`` on R rows: with the
    profile's ``matmul_small_m_gaps``, its ``matmul_half_rows`` as the product's weight layout
    (``op.weight_in_out``) and inner size (:func:`inner_size`) take it
    (:meth:`~perfsdk.hardware.profile.SmallMGaps.half_rows`); without,
    ``matmul_half_rows_in_out`` for a weight stored [in, out] where the profile sets it, else
    ``matmul_half_rows`` (0: none)."""
    h = profile.matmul_half_rows or 0.0
    gaps = profile.matmul_small_m_gaps
    if gaps is not None:
        return gaps.half_rows(h, inner_size(op), op.weight_in_out) if h else 0.0
    if op.weight_in_out and profile.matmul_half_rows_in_out is not None:
        return profile.matmul_half_rows_in_out
    return h


def warmup_factor(warmup_steps: float, steps: float) -> float:
    """What a decode of ``steps`` steps takes over as many steady steps when its first steps take
    ``warmup_steps`` steady steps more (the profile's ``decode_warmup_steps``): ``1 + k / steps``."""
    return 1.0 + warmup_steps / steps if warmup_steps and steps > 0 else 1.0


def cached_share(profile: HardwareProfile, resident_bytes: float | None) -> float:
    """Share of an op's bytes served from the profile's cache when its forward pass touches
    ``resident_bytes`` of weights and KV cache: the measured ``cache_shares`` at that size where
    set, else 1 while they fit and cache / resident beyond."""
    if not profile.cache_mb or not profile.cache_bandwidth_gbs or resident_bytes is None:
        return 0.0
    if profile.cache_shares is not None:
        return float(profile.cache_shares.at(resident_bytes))
    cache = profile.cache_mb * 1e6
    return 1.0 if resident_bytes <= cache else cache / resident_bytes


def memory_time_s(op: OpRecord, profile: HardwareProfile, resident_bytes: float | None = None) -> float:
    """The memory term of an op: its bytes at the memory bandwidth, or partly at the cache's."""
    nbytes = op_bytes(op)
    if not nbytes:
        return 0.0
    t = nbytes / profile.effective_bandwidth_bytes_per_s
    f = cached_share(profile, resident_bytes)
    if f:
        assert profile.cache_bandwidth_gbs is not None
        t = (1.0 - f) * t + f * nbytes / (profile.cache_bandwidth_gbs * 1e9)
    return t


def pack_time_s(op: OpRecord, profile: HardwareProfile, resident_bytes: float | None = None) -> float:
    """What a matrix product's weight layout costs on top of max(compute, memory): repacking and
    small-M streaming (see ``matmul_pack_rows`` and :func:`pack_passes`; over a weight that stays in
    the cores' own caches, :func:`fast_pack_share` of it), and the fixed cost of
    each row of its weight as stored (``matmul_ns_per_weight_row``: a CPU matrix-vector kernel
    streaming its weight from memory pays it per stored row on top of the bytes, so a [1024, 512]
    weight costs more than a [256, 2048] one of the same size; only on the products that walk the
    weight as stored, :func:`weight_row_applies`, and only on the share of the weight that comes
    from memory, not from the cache, when its forward pass touches ``resident_bytes``:
    :func:`cached_share`. One thread on a 2-core x86 host with an 80 MB cache: one-row products
    over fp32 weights of [8192, 256], [2048, 1024] and [256, 8192] streamed 8 MB and 32 MB working
    sets at 28.2-28.7 GB/s, whatever the rows; a 384 MB one at 13.3, 15.4 and 15.9 GB/s)."""
    if op.category != "matmul" or not op.weight_bytes:
        return 0.0
    t = 0.0
    if profile.matmul_pack_rows and profile.matmul_pack_gbs:
        fast = (profile.matmul_pack_fast_mb or 0.0) * 1e6
        t += (products_pack_passes(product_rows(op), profile.matmul_pack_rows) * op.weight_bytes
              * fast_pack_share(product_weight_bytes(op.weight_bytes, product_rows(op)), fast,
                                profile.matmul_pack_fast_share)
              / (profile.matmul_pack_gbs * 1e9))
    per_row = weight_row_ns(op, profile)
    if per_row and op.flops:
        share = weight_row_share(product_rows(op), profile.matmul_pack_rows)
        streamed = 1.0 - cached_share(profile, resident_bytes)
        t += weight_rows(op) * share * streamed * per_row * 1e-9
    return t


def weight_row_ns(op: OpRecord, profile: HardwareProfile) -> float:
    """The profile's cost in ns of one stored row of a matrix product's weight: at the row's length
    in bytes (:func:`weight_row_bytes`) from ``matmul_weight_row_costs`` where set, else
    ``matmul_ns_per_weight_row`` (0: none)."""
    if profile.matmul_weight_row_costs is not None:
        length = weight_row_bytes(op)
        return float(profile.matmul_weight_row_costs.at(length)) if length else 0.0
    return profile.matmul_ns_per_weight_row or 0.0


def weight_row_bytes(op: OpRecord) -> float:
    """Bytes of one row of a matrix product's weight as stored: its weight's bytes over its stored
    rows (:func:`weight_rows`; 0 for other ops)."""
    rows = weight_rows(op)
    return op.weight_bytes / rows if rows else 0.0


#: Outputs smaller than this come from memory the allocator already holds: the C library's
#: allocator (glibc's malloc) serves blocks below 128 KiB from its heap and maps larger ones afresh
FRESH_MIN_BYTES = 128 * 1024


def fresh_bytes(op: OpRecord) -> int:
    """Bytes a decode step writes into memory the process has not touched before: the output of
    an op that grows with the context (its shape holds the context length, ``op.context_len``),
    as the KV cache does when it is concatenated one position longer each step, or a copy of it
    (keys and values repeated for grouped-query attention), each tensor of at least
    :data:`FRESH_MIN_BYTES` (``bytes_written`` over the op's ``launches``). Every such output is
    larger than any buffer freed before it, so the allocator maps new pages and the kernel faults
    each one in on its first write. With two threads on a 2-core x86 host, concatenating a
    [8, 8, 128..192, 64] fp32 cache one position longer wrote 4.2 GB/s into fresh memory with
    329k page faults, 24 GB/s into the same size again. 0 for other ops, in the prefill, and for a
    sliding-window cache that stays one size."""
    if op.phase != "decode" or not op.context_len or not op.output_shape or op.context_len not in op.output_shape:
        return 0
    return op.bytes_written if op.bytes_written >= FRESH_MIN_BYTES * max(1, op.launches) else 0


def alloc_time_s(op: OpRecord, profile: HardwareProfile) -> float:
    """What writing into fresh memory costs on top of the op's bytes (:func:`fresh_bytes` at the
    profile's ``fresh_write_gbs``; 0 without it)."""
    if not profile.fresh_write_gbs:
        return 0.0
    n = fresh_bytes(op)
    return n / (profile.fresh_write_gbs * 1e9) if n else 0.0


def overhead_time_s(op: OpRecord, profile: HardwareProfile) -> float:
    """Fixed cost of the op: the profile's per-op overhead plus its per-call overhead for each
    further kernel call the op stands for. Views and other metadata-only ops launch no kernel,
    nor do the parts of a fused call (``launches`` 0).

    A profile with ``call_overhead_s`` (a calibrated host) charges that for every ATen call the op
    stands for instead: on a host the fixed cost is the Python and dispatcher time around each
    call that runs a kernel. A view's own share is small enough to leave out (fitted beside the
    kernel calls over the decode steps of thirteen families: 0.3 µs a view, 4.5 µs a kernel call)."""
    if not (op_bytes(op) or op.flops) or op.launches <= 0:
        return 0.0
    if profile.call_overhead_s is not None:
        each = profile.call_overhead_s
        if op.phase in WHOLE_INPUT_PHASES and profile.prefill_call_overhead_s is not None:
            each = profile.prefill_call_overhead_s
        return op.launches * each
    return profile.op_overhead_s + (op.launches - 1) * profile.launch_overhead_s


def few_row_scale(products: tuple[list[float], list[float]], weight_bytes: float,
                  few: FewRowRatios | None) -> float | None:
    """The factor on the one-row time of the ``products`` a matrix product runs
    (:func:`product_rows`: one, or one per expert it reaches) over ``weight_bytes`` of weights in
    all, by the staircase ``few`` (:meth:`~perfsdk.hardware.profile.FewRowRatios.ratio` at each
    product's rows and weight, averaged over the products; a one-row product's is 1). None where
    ``few`` is unset, the product has no weight, a product's rows lie past the staircase, or every
    product has one row (nothing to scale)."""
    ks, ws = products
    n = sum(ws)
    if few is None or not weight_bytes or n <= 0 or not all(np.isfinite(k) for k in ks):
        return None
    each = float(weight_bytes) / n
    total = 0.0
    for k, w in zip(ks, ws):
        if k > few.rows[-1]:
            return None
        total += w * (few.ratio(float(k), each) or 1.0)  # a one-row product: None, 1
    return total / n if any(k >= 1.5 for k in ks) else None


def one_row_terms(flops: float, nbytes: float, weight_bytes: float, rows: float, ratio: float,
                  products: float = 1.0) -> tuple[float, float]:
    """(FLOPs, bytes) of a matrix product of ``rows`` rows priced as its one-row products (one,
    or one per expert a grouped product reaches: ``products``) times ``ratio``: one row's FLOPs
    each, and the whole weight with one row's activations each, all times it."""
    return flops / rows * products * ratio, (weight_bytes + products * (nbytes - weight_bytes) / rows) * ratio


def few_row_op(op: OpRecord, profile: HardwareProfile) -> OpRecord:
    """``op`` as the cost model prices it: a matrix product of a few rows on a profile with
    ``matmul_few_rows`` and ``matmul_pack_rows`` becomes its one-row product (a grouped product:
    one per expert it reaches, no longer grouped) with FLOPs, bytes and stored weight rows times
    the staircase's ratio at its rows and weight size (:func:`few_row_scale`; one row runs without
    the small-M slowdown and without repacking, and pays the cost per stored row); any other op is
    returned as it is. Its energy, calls and overhead stay the op's own."""
    from dataclasses import replace

    if op.category != "matmul" or not profile.matmul_pack_rows:
        return op
    products = product_rows(op)
    ratio = few_row_scale(products, op.weight_bytes, profile.matmul_few_rows)
    if ratio is None:
        return op
    rows, n = matmul_rows(op), sum(products[1])
    flops, nbytes = one_row_terms(op.flops, op_bytes(op), op.weight_bytes, rows, ratio, n)
    written = op.bytes_written / rows * n * ratio
    out = op.output_shape[-1] if op.output_shape else 0
    # not rounded: the fit prices the same product with the same (fractional) figures
    scaled: dict[str, Any] = {"flops": flops, "macs": flops / 2, "bytes_read": nbytes - written,
                              "bytes_written": written, "weight_rows": weight_rows(op) * ratio, "elements": out,
                              "groups": None, "group_rows": None, "group_picks": None}
    return replace(op, **scaled)


def cost_op(op: OpRecord, profile: HardwareProfile, dtype: str | None = None,
            resident_bytes: float | None = None) -> OpCost:
    """Cost of ``op`` on ``profile`` (no transfers). ``dtype`` overrides ``op.dtype`` for peaks;
    ``resident_bytes``: weights + KV cache its forward pass touches on this device (cache model)."""
    nbytes = op_bytes(op)
    priced = few_row_op(op, profile)
    compute_s = compute_time_s(priced, profile, dtype)
    memory_s = memory_time_s(priced, profile, resident_bytes)
    serial_s = 0.0
    if priced.category == "matmul" and priced.groups and priced.groups > 1:
        t = serial_products(product_rows(priced), profile.matmul_pack_rows, half_rows(priced, profile), compute_s,
                            memory_s)[0]
        serial_s = max(0.0, t - max(compute_s, memory_s))
    return OpCost(
        compute_s=compute_s,
        memory_s=memory_s,
        serial_s=serial_s,
        pack_s=pack_time_s(priced, profile, resident_bytes),
        alloc_s=alloc_time_s(op, profile),
        overhead_s=overhead_time_s(op, profile),
        compute_energy_j=op.flops * profile.compute_pj_per_flop * PJ,
        memory_energy_j=nbytes * 8 * profile.memory_pj_per_bit * PJ,
        static_power_w=profile.static_power_w,
    )


def transfer_cost(profile: HardwareProfile, h2d_bytes: float, d2h_bytes: float) -> tuple[float, float]:
    """(seconds, joules) to send ``h2d_bytes`` to the device and ``d2h_bytes`` back to the host.

    A profile without a host link (the host CPU itself) transfers for free.
    """
    if not profile.has_host_link:
        return 0.0, 0.0
    assert profile.host_to_device_gbs is not None and profile.device_to_host_gbs is not None
    t = h2d_bytes / (profile.host_to_device_gbs * 1e9) + d2h_bytes / (profile.device_to_host_gbs * 1e9)
    e = (h2d_bytes * 8 * (profile.host_to_device_pj_per_bit or 0.0)
         + d2h_bytes * 8 * (profile.device_to_host_pj_per_bit or 0.0)) * PJ
    return t, e


def activation_in_bytes(op: OpRecord) -> int:
    """Bytes of the op's input activations: what a transfer point sends to the device.

    Everything read except weights and KV cache, which live on the device.
    """
    return max(0, op.bytes_read - op.weight_bytes - op.kv_bytes)


def activation_out_bytes(op: OpRecord) -> int:
    """Bytes of the op's output: what a transfer point sends back to the host.

    For attention, the KV entries it appends stay on the device and are not returned.
    """
    if op.category == "attention":
        # the output has the size of the query block (what was read besides the KV cache)
        return max(0, min(op.bytes_written, op.bytes_read - op.kv_bytes))
    return op.bytes_written

"""Calibration: fit a host profile (effective FLOP/s, bandwidth, per-op overhead) to measurements.

Each observation is one phase of one measured ``generate`` call: the operations it executed
(from capture or the analytic generator) and the measured time (TTFT for the prefill, the
decode time for the decode steps). The model being fitted is the simulation's own::

    time = sum_i [max(flops_i * x_f + row_i * x_h + scores_i * x_sm,
                      bytes_i * ((1 - f_i) * x_b + f_i * x_c)) + pack_i * x_k + wrows_i * x_r
                  + fresh_i * x_w]
           + ops * x_o + calls * x_l + forward_passes * x_s + [prefill] * x_p

or, when the ops are captured from the model's own code (every ATen call), with
``kernel_calls * x_a`` in place of ``ops * x_o + calls * x_l`` (:func:`per_call_fit`): the
fixed cost of a host is the Python and dispatcher time around each call that runs a kernel,
which follows the calls a family's code makes, not the module-level operations
(``call_overhead_s``). Views and other calls that move no bytes are not counted: over thirteen
families at width 16 per head (a 2-core x86 host, one thread), a view added 0.3 µs to a decode
step against 4.5 µs per kernel call, fitted together.

with ``row_i = flops_i / rows_i`` for a matrix product with ``rows_i`` output rows (0 for other
ops): ``x_h = h * x_f`` is the small-M slowdown ``(rows + h) / rows`` of the cost model written
as a linear term, so ``h`` is fitted like the rates, not picked on a grid (with a repacking
size ``P``, only on products of at least ``4P`` rows: below, the staircase ``pack_i`` describes
them, and a term on their FLOPs would trade itself against it and against the memory rate); ``scores_i`` the
softmax elements of attention (``x_sm`` per element); ``wrows_i`` the rows of a matrix
product's weight as stored (:func:`~perfsdk.simulation.costmodel.weight_rows`), ``x_r`` each (a
CPU matrix-vector kernel pays a fixed cost per stored row on top of streaming its bytes from
memory, ``wrows_i`` is taken on the ``1 - f_i`` of them that do; with a table of that cost by
the row's length, :attr:`Observation.row_costs`, each row weighed by its length's cost; with a
repacking size ``P``, only products of fewer than ``4P`` rows: the blocked kernel does not); ``f_i = min(1, C / resident_i)`` the share
of the op's bytes served from a cache of ``C`` bytes when its forward pass touches
``resident_i`` bytes of weights and KV cache; ``pack_i`` the weight bytes of a matrix product
with at least ``P`` rows (the blocked BLAS path repacks its weights); ``x_f = 1 / FLOP/s``,
``x_b`` and ``x_c`` seconds per byte from memory and from cache, ``x_k`` per repacked byte, ``x_o`` the per-op overhead, ``x_l``
the overhead of each further kernel call an op stands for (``calls``: ``launches - 1`` summed
over the ops; an eager RMSNorm is six calls), ``x_s`` the per-forward-pass overhead and ``x_p``
the once-per-``generate`` set-up cost (prefill only); ``fresh_i`` the bytes a decode step writes
into fresh memory (:func:`~perfsdk.simulation.costmodel.fresh_bytes`: the KV cache concatenated
one position longer), ``x_w`` each. ``C`` and ``P`` are chosen on small grids.
With a few-row staircase (:attr:`Observation.few_rows`), a product of a few rows enters as its
one-row product with every term times the staircase's ratio at its rows (FLOPs, bytes and stored
weight rows scaled, one row), as the cost model prices it.

The ``max`` makes it piecewise linear, so the fit alternates: label every op compute- or
memory-bound with the current estimate, solve the linear least-squares problem (numpy, rows
weighted by 1/measured so that the *relative* error is minimised, negative coefficients dropped
and refitted), and repeat until the labels stop changing. The fit is robust (Huber weights on
the relative error, ``fit(robust=...)``): a configuration the model misses by far, because it
was measured at a bad moment or does something the model does not describe, is down-weighted
instead of pulling every coefficient, which is what keeps two calibrations of one machine close.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np
import structlog

from perfsdk.hardware.profile import (
    MEMORY_COEFFICIENTS,
    CacheShares,
    FewRowRatios,
    HardwareProfile,
    SmallMGaps,
    WeightRowCosts,
)
from perfsdk.capture.ops import OpRecord
from perfsdk.simulation.costmodel import (WHOLE_INPUT_PHASES, few_row_scale, fresh_bytes, inner_size, matmul_rows,
                                          one_row_terms, op_bytes, pack_passes, product_rows,
                                          fast_pack_share, product_weight_bytes, products_pack_passes,
                                          products_small_m, resident_bytes, serial_products, small_m_applies,
                                          weight_row_applies, weight_row_bytes, weight_row_share, weight_rows)

log = structlog.get_logger("perfsdk.simulation.calibration")

PARAMS = ("s_per_flop", "s_per_byte", "op_overhead_s", "step_overhead_s", "prefill_overhead_s", "s_per_cached_byte",
          "s_per_packed_byte", "launch_overhead_s", "s_per_row_flop", "s_per_score", "s_per_weight_row",
          "call_overhead_s", "s_per_fresh_byte", "prefill_call_overhead_s")
#: coefficients of the fixed costs per operation: per module-level op and further launch (ops
#: from the analytic generator); ops captured from the model's own code take a cost per ATen
#: call instead, a decode step's (11) and a pass over a whole prompt's (13)
_OP_TERMS = [2, 7]
#: a coefficient a calibration recorded before another existed takes that one's value
COEFFICIENT_FALLBACK = {"prefill_call_overhead_s": "call_overhead_s"}
#: coefficients of the bytes streamed from memory (the memory-bound bytes and the weights
#: repacked): the profile's ``memory_bandwidth_gbs`` and ``matmul_pack_gbs``, which a re-timing
#: scales by the memory's own exponent (:attr:`FitResult.memory_tracking`)
MEMORY_TERMS = [PARAMS.index(p) for p in MEMORY_COEFFICIENTS]


@dataclass
class Observation:
    """One measured phase: its ops (with step weights) and the measured seconds."""

    label: str
    phase: str
    measured_s: float
    flops: np.ndarray
    bytes_: np.ndarray
    weights: np.ndarray
    forward_passes: float
    rows: np.ndarray | None = None  # output rows of matrix products (inf for other ops)
    resident: np.ndarray | None = None  # bytes of weights + KV cache the op's forward pass touches
    weight_bytes: np.ndarray | None = None  # weights of each op
    ops: float | None = None  # (weighted) ops that make a kernel call; None: every op counts
    extra_launches: float = 0.0  # (weighted) kernel calls beyond each op's first
    scores: np.ndarray | None = None  # softmax elements: attention scores, softmax outputs (0 for other ops)
    weight_rows: np.ndarray | None = None  # rows of each matrix product's weight as stored (0 for other ops)
    row_bytes: np.ndarray | None = None  # bytes of one such row (0 for other ops)
    calls: float = 0.0  # (weighted) kernel calls the ops stand for (the launches of the ops that move bytes)
    fresh: float = 0.0  # (weighted) bytes written into fresh memory (:func:`~perfsdk.simulation.costmodel.fresh_bytes`)
    captured: bool = False  # the ops are every ATen call of the model's own code (captured)
    in_out: np.ndarray | None = None  # matrix products whose weight is stored [in, out] (a Conv1D)
    inner: np.ndarray | None = None  # inner size K of each matrix product (0 for other ops)
    #: a micro-kernel read against another one (the label of that one): repeated timings of the two
    #: are merged by their ratio within each timing (:func:`~perfsdk.simulation.calibration.measure.median_micro`)
    unit: str | None = None
    #: rows of the small-M slowdown each product runs without, by its weight's layout and inner
    #: size (the calibration's layout ladder: ``matmul_small_m_gaps``); None: every product alike
    small_m_gaps: SmallMGaps | None = None
    #: (bytes, share): the further passes over a product's weight of at most these bytes take this
    #: share of a pass at the repacking rate (the profile's ``matmul_pack_fast_mb`` and
    #: ``matmul_pack_fast_share``); None: every weight alike
    pack_fast: tuple[float, float] | None = None
    #: the few-row staircase (the profile's ``matmul_few_rows``): setting it prices each product of
    #: 2 rows up to the staircase's last count (a grouped one: whose experts' products have at most
    #: that many rows each) as its one-row product times the staircase's ratio (FLOPs, bytes and
    #: stored weight rows scaled, one row: :func:`~perfsdk.simulation.costmodel.few_row_op`); None:
    #: every product at its own rows. Only with a repacking size (the fit's ``pack_rows``)
    few_rows: FewRowRatios | None = None
    #: grouped products (mixture-of-experts), by op index: the row counts of the products each
    #: runs and how many of each (:func:`~perfsdk.simulation.costmodel.product_rows`)
    grouped: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)
    #: (table, ns): the cost per stored row by the row's length (the profile's
    #: ``matmul_weight_row_costs``) and the cost per row the fit's ``x_r`` stands for; each
    #: product's stored rows then count table-at-its-row-length / ns times (:meth:`stored_rows`).
    #: None: every row alike
    row_costs: tuple[WeightRowCosts, float] | None = None
    #: the share served from the cache by the bytes a pass touches (the profile's
    #: ``cache_shares``), in place of min(1, cache / bytes) wherever a cache size is set; None:
    #: that ratio
    cache_shares: CacheShares | None = None
    #: what :meth:`features` needs that does not depend on the coefficients, by cache and
    #: repacking size (a fit evaluates the features of every observation many times); emptied
    #: when a field other than the measured time is set
    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.few_rows is not None:
            self._price_few_rows(self.few_rows)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in ("measured_s", "_memo") and "_memo" in self.__dict__:
            self._memo.clear()
        if name == "few_rows" and "few_rows" in self.__dict__:
            self._price_few_rows(value)
        object.__setattr__(self, name, value)

    def _price_few_rows(self, few: FewRowRatios | None) -> None:
        """Rewrite the products' FLOPs, bytes, rows and stored weight rows for the staircase ``few``
        (:attr:`few_rows`; a grouped product so priced is grouped no more), from the arrays as first
        built (kept aside the first time)."""
        if self.rows is None or self.weight_bytes is None:
            return
        raw = self.__dict__.setdefault("_as_built", {})
        if not raw:
            raw.update(flops=self.flops, bytes_=self.bytes_, rows=self.rows, weight_rows=self.weight_rows,
                       grouped=self.grouped)
        flops, nbytes, rows = raw["flops"].copy(), raw["bytes_"].copy(), raw["rows"].copy()
        wrows = None if raw["weight_rows"] is None else raw["weight_rows"].copy()
        grouped = dict(raw["grouped"])
        if few is not None:
            for i, r in enumerate(raw["rows"]):
                if not np.isfinite(r):
                    continue
                products = grouped.get(i, ([float(r)], [1.0]))
                ratio = few_row_scale(products, self.weight_bytes[i], few)
                if ratio is None:
                    continue
                flops[i], nbytes[i] = one_row_terms(flops[i], nbytes[i], self.weight_bytes[i], r, ratio,
                                                    sum(products[1]))
                rows[i] = 1.0
                grouped.pop(i, None)
                if wrows is not None:
                    wrows[i] *= ratio
        for name, value in (("flops", flops), ("bytes_", nbytes), ("rows", rows), ("weight_rows", wrows),
                            ("grouped", grouped)):
            object.__setattr__(self, name, value)

    @classmethod
    def from_ops(cls, label: str, phase: str, measured_s: float, ops: list[OpRecord],
                 step_weights: dict[int, float] | None = None, *, captured: bool = False) -> Observation:
        """``captured``: ``ops`` are every ATen call the model's code made (a capture), so the fit
        prices the fixed cost per kernel call (``call_overhead_s``; views and other calls that
        move no bytes are free)."""
        w = np.array([(step_weights or {}).get(o.step, 1.0) for o in ops], dtype=float)
        steps: dict[int, float] = {}
        resident: dict[int, float] = {}
        calls = extra = fresh = 0.0
        for o in ops:
            sw = (step_weights or {}).get(o.step, 1.0)
            steps[o.step] = sw
            resident[o.step] = resident.get(o.step, 0.0) + resident_bytes(o)
            fresh += sw * fresh_bytes(o)
            if o.launches > 0 and (o.flops or op_bytes(o)):
                calls += sw
                extra += sw * (o.launches - 1)
        return cls(label=label, phase=phase, measured_s=measured_s,
                   flops=np.array([o.flops for o in ops], dtype=float),
                   bytes_=np.array([op_bytes(o) for o in ops], dtype=float),
                   weights=w, forward_passes=float(sum(steps.values())),
                   rows=np.array([matmul_rows(o) if o.category == "matmul" else np.inf for o in ops]),
                   resident=np.array([resident[o.step] for o in ops], dtype=float),
                   weight_bytes=np.array([o.weight_bytes for o in ops], dtype=float), ops=calls,
                   extra_launches=extra,
                   scores=np.array([o.elements if o.category in ("attention", "softmax") else 0 for o in ops],
                                   dtype=float),
                   weight_rows=np.array([weight_rows(o) if o.flops else 0 for o in ops], dtype=float),
                   row_bytes=np.array([weight_row_bytes(o) if o.flops else 0 for o in ops], dtype=float),
                   calls=calls + extra, captured=captured, fresh=fresh,
                   in_out=np.array([o.category == "matmul" and o.weight_in_out for o in ops], dtype=bool),
                   inner=np.array([inner_size(o) for o in ops], dtype=float),
                   grouped={i: product_rows(o) for i, o in enumerate(ops)
                            if o.category == "matmul" and o.groups and o.groups > 1})

    def cached_fraction(self, cache_bytes: float) -> np.ndarray:
        """Share of each op's bytes served from a cache of ``cache_bytes`` (see :func:`cached_fraction`;
        by :attr:`cache_shares` where set)."""
        res = self.resident if self.resident is not None else self.bytes_
        return cached_fraction(res, cache_bytes, self.cache_shares)

    def row_flops(self, pack_rows: float = 0.0) -> np.ndarray:
        """FLOPs of one output row of each matrix product (``flops / rows``; 0 for other ops, and
        for products the small-M term leaves alone at ``pack_rows``: :func:`small_m_applies`)."""
        if self.rows is None:
            return np.zeros_like(self.flops)
        mm = np.isfinite(self.rows)
        rows = np.where(mm, self.rows, 1.0)
        out = np.where(mm & small_m_applies(rows, pack_rows), self.flops / rows, 0.0)
        for i, products in self.grouped.items():  # one product per group reached
            out[i] = self.flops[i] / rows[i] * products_small_m(products, pack_rows)
        return out

    def features(self, x_f: float, x_b: float, half_rows: float = 0.0, cache_bytes: float = 0.0,
                 x_c: float = 0.0, pack_rows: float = 0.0, x_h: float = 0.0, x_s: float = 0.0,
                 x_r: float = 0.0) -> np.ndarray:
        """The linear features of :data:`PARAMS` at this estimate: [compute-bound FLOPs,
        memory-bound bytes from memory, op count, forward passes, prefill, memory-bound bytes
        from cache, weight bytes repacked, further kernel calls, compute-bound FLOPs per output
        row, compute-bound softmax elements, compute-bound weight rows, a decode step's kernel
        calls, bytes written into fresh memory, the kernel calls of a pass over a whole input].

        The small-M slowdown of a matrix product, ``(rows + h) / rows`` on its FLOPs, is
        ``flops * x_f + (flops / rows) * x_h`` with ``x_h = h * x_f``: linear in a coefficient of
        its own, fitted like the others. A fixed ``half_rows`` instead scales the FLOPs of the
        first column. With ``small_m_gaps``, each product's ``h`` follows its weight's layout
        (``in_out``) and inner size: scaled by its share (with an anchor: its rows per FLOP
        scaled, linear as before), or less its gap (the gap's rows off the first column: linear),
        none where the gap reaches the current ``h``. The bytes of a forward pass whose
        weights + KV cache fit ``cache_bytes`` are split between the cache and memory rates
        (:func:`cached_fraction`). Matrix products with at least
        ``pack_rows`` rows repack their weights (a pass over them on top of max(compute,
        memory)). Attention also computes a softmax over its score elements (``x_s`` seconds
        each, the profile's ``softmax_ns_per_element``), and a matrix product with weights
        ``x_r`` per stored weight row on top of that (the profile's ``matmul_ns_per_weight_row``),
        and the bytes written into fresh memory ``x_w`` each (the profile's ``fresh_write_gbs``).
        """
        memo = self._memo
        rows_key = ("rows", pack_rows, cache_bytes)
        if rows_key not in memo:
            memo[rows_key] = (self.row_flops(pack_rows), float(self.weights @ self.packed_bytes(pack_rows)),
                              self.stored_rows(pack_rows, cache_bytes))
        per_row, packed, weight_rows_sum = memo[rows_key]
        if ("fixed", 0.0) not in memo:
            memo[("fixed", 0.0)] = self.scores if self.scores is not None else np.zeros_like(self.flops)
        scores = memo[("fixed", 0.0)]
        flops = self.flops
        gaps = self.gap_rows()
        h_now = half_rows or (x_h / x_f if x_f > 0 else 0.0)
        scales = self.gap_scales()
        if scales is not None:
            # a product's (R + h * scale) / R: its rows per FLOP scaled, linear in x_h as it is
            per_row = per_row * scales
        elif gaps is not None and h_now > 0:
            # a product's (R + h - gap) / R, linear in x_f and x_h: its gap's rows come off the
            # FLOPs column; one whose gap reaches the current h runs without a slowdown
            slowed = gaps < h_now
            flops = flops - np.where(slowed, per_row * gaps, 0.0)
            per_row = np.where(slowed, per_row, 0.0)
        if half_rows:
            flops = flops + per_row * half_rows
        if cache_bytes:
            key = ("cache", cache_bytes)
            if key not in memo:
                memo[key] = self.cached_fraction(cache_bytes)
            f = memo[key]
            mem_rate = x_b * (1.0 - f) + x_c * f
        else:
            f = None
            mem_rate = x_b
        compute_s = flops * x_f + per_row * x_h + scores * x_s
        memory_s = self.bytes_ * mem_rate
        compute_share = (compute_s >= memory_s).astype(float)
        memory_share = 1.0 - compute_share
        for i, products in self.grouped.items():
            # one product per group reached, each bound by its own compute or memory
            _, compute_share[i], memory_share[i] = serial_products(
                products, pack_rows, h_now, float(compute_s[i]), float(memory_s[i]))
        wc = self.weights * compute_share
        mem = self.weights * memory_share * self.bytes_
        from_memory = float(mem @ (1.0 - f)) if f is not None else float(mem.sum())
        return np.array([
            float(wc @ flops),
            from_memory,
            self.op_count,
            self.forward_passes,
            1.0 if self.phase == "prefill" else 0.0,
            float(mem @ f) if f is not None else 0.0,
            packed,
            self.extra_launches,
            float(wc @ per_row),
            float(wc @ scores),
            weight_rows_sum,
            0.0 if self.whole_input else self.calls,
            self.fresh,
            self.calls if self.whole_input else 0.0,
        ])

    @property
    def whole_input(self) -> bool:
        """Whether the observation is of a pass over a whole input (:data:`WHOLE_INPUT_PHASES`),
        whose kernel calls take ``prefill_call_overhead_s``."""
        return self.phase in WHOLE_INPUT_PHASES

    def gap_rows(self) -> np.ndarray | None:
        """Each op's gap from ``small_m_gaps`` (0 for ops other than matrix products; None
        without gaps)."""
        if self.small_m_gaps is None or self.rows is None:
            return None
        key = ("gaps", 0.0)
        if key not in self._memo:
            inner = self.inner if self.inner is not None else np.zeros_like(self.flops)
            in_out = self.in_out if self.in_out is not None else np.zeros(len(self.flops), dtype=bool)
            self._memo[key] = np.array([self.small_m_gaps.gap(float(k), bool(io)) if np.isfinite(r) else 0.0
                                        for k, io, r in zip(inner, in_out, self.rows)])
        gaps: np.ndarray = self._memo[key]
        return gaps

    def gap_scales(self) -> np.ndarray | None:
        """Each op's share of the fitted ``h`` where ``small_m_gaps`` has an anchor (1 for ops other
        than matrix products; None otherwise)."""
        if self.small_m_gaps is None or self.small_m_gaps.anchor is None or self.rows is None:
            return None
        key = ("scales", 0.0)
        if key not in self._memo:
            gaps = self.gap_rows()
            assert gaps is not None
            self._memo[key] = self.small_m_gaps.shares(gaps)
        scales: np.ndarray = self._memo[key]
        return scales

    @property
    def op_count(self) -> float:
        """(Weighted) ops that make a kernel call."""
        return float(np.sum(self.weights)) if self.ops is None else self.ops

    def stored_rows(self, pack_rows: float = 0.0, cache_bytes: float = 0.0) -> float:
        """(Weighted) stored weight rows of the matrix products that pay the cost per stored row
        at ``pack_rows`` (:func:`~perfsdk.simulation.costmodel.weight_row_applies`: all of them
        without a repacking size, else those of fewer than ``4 * pack_rows`` rows), each on the
        share of its weight streamed from memory past a cache of ``cache_bytes``
        (:meth:`cached_fraction`; a weight served from the cache pays no cost per row), each row
        weighed by its length's cost with :attr:`row_costs`."""
        if self.weight_rows is None:
            return 0.0
        rows = self.rows if self.rows is not None else np.ones_like(self.weight_rows)
        share = np.where(weight_row_applies(np.where(np.isfinite(rows), rows, 0.0), pack_rows), 1.0, 0.0)
        for i, products in self.grouped.items():  # one product per group reached
            share[i] = weight_row_share(products, pack_rows)
        if cache_bytes:
            share = share * (1.0 - self.cached_fraction(cache_bytes))
        if self.row_costs is not None and self.row_bytes is not None and self.row_costs[1] > 0:
            table, unit_ns = self.row_costs
            share = share * np.where(self.row_bytes > 0, table.at(self.row_bytes), 0.0) / unit_ns
        return float(self.weights @ (self.weight_rows * share))

    def packed_bytes(self, pack_rows: float) -> np.ndarray:
        """Weight bytes each matrix product streams beyond its one pass, at ``pack_rows``
        (:func:`~perfsdk.simulation.costmodel.pack_passes`; 0: none), those over a weight that
        stays in the cores' own caches counted at their share of a pass (``pack_fast``:
        :func:`~perfsdk.simulation.costmodel.fast_pack_share`)."""
        if not pack_rows or self.rows is None or self.weight_bytes is None:
            return np.zeros_like(self.bytes_)
        rows = np.where(np.isfinite(self.rows), self.rows, 0.0)
        passes = pack_passes(rows, pack_rows)
        each = self.weight_bytes.astype(float)
        for i, products in self.grouped.items():  # one product per group reached
            passes[i] = products_pack_passes(products, pack_rows)
            each[i] = product_weight_bytes(self.weight_bytes[i], products)
        if self.pack_fast is not None:
            passes = passes * fast_pack_share(each, *self.pack_fast)
        return passes * self.weight_bytes

    def predict(self, x: np.ndarray, half_rows: float = 0.0, cache_bytes: float = 0.0,
                pack_rows: float = 0.0) -> float:
        x = np.concatenate([np.asarray(x, dtype=float), np.zeros(max(0, len(PARAMS) - len(x)))])
        return float(self.features(x[0], x[1], half_rows, cache_bytes, x[5], pack_rows, x[8], x[9], x[10]) @ x)


@dataclass
class FitResult:
    """Fitted coefficients and the in-sample relative errors."""

    coefficients: dict[str, float]
    errors_pct: dict[str, float]
    iterations: int
    observations: int
    fixed: list[str] = field(default_factory=list)
    matmul_half_rows: float = 0.0
    cache_bytes: float = 0.0
    pack_rows: float = 0.0
    #: the fixed cost was fitted per ATen call (``call_overhead_s``: :func:`per_call_fit`)
    per_call: bool = False
    #: the cache's rate is the memory's: fitted on its own it came out no faster than memory, or
    #: free (:func:`_fit_cache_at`); the cache size still divides each weight's bytes and rows
    #: between the cache and memory
    cache_rate_tied: bool = False
    #: coefficients measured directly (by micro-kernels) and held in the fit, by name
    held: dict[str, float] = field(default_factory=dict)
    #: how far this machine's speed moved between the calibration's passes, in percent
    #: (:func:`~perfsdk.simulation.calibration.measure.pass_drift_pct`); None when not measured
    drift_pct: float | None = None
    #: the same after each configuration's times are divided by the adjacent reference's
    normalised_drift_pct: float | None = None
    #: round-robin passes run (more than asked when the first did not settle); None when not measured here
    passes: int | None = None
    #: torch threads and clock of a calibration measured here (what re-timing the reference repeats)
    threads: int | None = None
    clock: Literal["wall", "cpu"] | None = None
    #: rows of the small-M slowdown each product runs without, by its weight's layout and inner
    #: size (measured by the micro-kernels' layout ladder; None: not measured, every product alike)
    small_m_gaps: SmallMGaps | None = None
    #: (bytes, share) of the further passes over a weight that stays in the cores' own caches
    #: (:attr:`Observation.pack_fast`; measured by the micro-kernels; None: not measured)
    pack_fast: tuple[float, float] | None = None
    #: the few-row staircase the measured products of a few rows were priced with
    #: (:attr:`Observation.few_rows`; measured by the micro-kernels; None: not measured)
    few_rows: FewRowRatios | None = None
    #: the cost per stored row by the row's length the measured products were priced with
    #: (:attr:`Observation.row_costs`; measured by the micro-kernels; None: not measured)
    weight_row_costs: WeightRowCosts | None = None
    #: the share served from the cache by the bytes a pass touches that the measured phases were
    #: priced with (:attr:`Observation.cache_shares`; measured by the working sets; None: not measured)
    cache_shares: CacheShares | None = None
    #: bootstrap refits' coefficients (PARAMS order), held-out errors ([prefill, decode]) and the
    #: reference workload's times relative to their median: see
    #: :class:`~perfsdk.hardware.profile.CalibrationRecord`
    replicates: list[list[float]] = field(default_factory=list)
    held_out: list[list[float]] = field(default_factory=list)
    #: for each ``held_out`` entry, whether its fit left out the configuration's whole family (a
    #: family other than the calibration's main one), and the families (model types) measured:
    #: see :func:`held_out_predictions`
    held_out_whole_family: list[bool] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    levels: list[float] = field(default_factory=list)
    #: one run's scatter on the raw clock (:func:`~perfsdk.simulation.calibration.measure.run_scatter`)
    run_scatter: list[float] = field(default_factory=list)
    reference: str | None = None
    reference_s: float | None = None
    #: the exponent the configurations' times follow the reference's with
    #: (:func:`~perfsdk.simulation.calibration.measure.reference_tracking`)
    reference_tracking: float | None = None
    #: the exponents the work other than memory traffic and the memory traffic follow the
    #: reference with, apart (:func:`~perfsdk.simulation.calibration.measure.term_tracking`);
    #: None when they could not be told apart
    rest_tracking: float | None = None
    memory_tracking: float | None = None
    #: what telling them apart found (:func:`~perfsdk.simulation.calibration.measure.term_fit`)
    tracking_note: str | None = None
    #: the memory reference timed beside the reference workload, and its median time, s
    #: (:data:`~perfsdk.simulation.calibration.measure.MEMORY_REFERENCE_LABEL`)
    memory_reference: str | None = None
    memory_reference_s: float | None = None
    #: the compute reference likewise (:data:`~perfsdk.simulation.calibration.measure.COMPUTE_REFERENCE_LABEL`)
    compute_reference: str | None = None
    compute_reference_s: float | None = None
    #: how many steady decode steps the first decode steps take beyond their count (the
    #: profile's ``decode_warmup_steps``; the decode times fitted are brought to the steady step)
    decode_warmup_steps: float = 0.0
    #: what the check of a fitted cache against the left-out models found (:func:`keep_cache`)
    cache_note: str | None = None
    #: how the repacking size was chosen from the micro-kernels' staircase
    #: (:func:`~perfsdk.simulation.calibration.measure.repacking_choice`)
    pack_note: str | None = None
    #: the machine the measurements come from, when it is not this one (stored runs):
    #: :class:`~perfsdk.simulation.calibration.from_store.MeasuredMachine`
    machine: Any = None

    def memory_share(self, ob: Observation) -> float:
        """The share of ``ob``'s predicted time that its bytes streamed from memory take
        (:data:`MEMORY_TERMS`: the memory-bound bytes and the weights repacked), at these
        coefficients; 0 for a phase predicted at no time."""
        x = np.array([self.coefficients[p] for p in PARAMS])
        f = ob.features(x[0], x[1], 0.0, self.cache_bytes, x[5], self.pack_rows, x[8], x[9], x[10]) * x
        total = float(f.sum())
        return float(f[MEMORY_TERMS].sum() / total) if total > 0 else 0.0

    @property
    def flops_per_s(self) -> float | None:
        x = self.coefficients["s_per_flop"]
        return 1.0 / x if x > 0 else None

    @property
    def bytes_per_s(self) -> float | None:
        x = self.coefficients["s_per_byte"]
        return 1.0 / x if x > 0 else None


def _nnls(a: np.ndarray, b: np.ndarray, free: list[int]) -> np.ndarray:
    """Least squares with the coefficients kept >= 0 by dropping negative ones and refitting."""
    x = np.zeros(a.shape[1])
    # a coefficient whose feature is zero in every observation is not identified: it stays 0
    # (least squares would give it any value, and the column scaling a huge one)
    active = [j for j in free if np.any(a[:, j] != 0)]
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if np.all(sol >= 0):
            x[active] = sol
            break
        active = [j for j, v in zip(active, sol) if v > 0] if np.any(sol > 0) else []
    return x


#: Fixed small-M values to try instead of fitting ``h`` (``fit(half_rows=...)``); by default
#: ``h`` is a fitted coefficient, not a grid choice.
HALF_ROWS_GRID = (0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
CACHE_GRID = (0.0, 4e6, 8e6, 16e6, 32e6, 64e6, 128e6)
#: A cache size (two more parameters: the size and its rate) is kept only when it lowers the
#: fit's loss by at least this share against the best fit without one. In five calibrations of
#: a 2-core x86 host the best cache (16 MB) lowered the loss by 0.5-17 %, predicted the unseen
#: families no better (median |error| 4.0-5.8 % with or without) and the Llama sizes worse
#: (worst 20-29 % against 19-23 %), and moved the predictions of one calibration against
#: another by up to 13.8 %, against 7.1 % without: a grid point that wins by a few percent
#: of loss is noise, and two calibrations land on different ones.
CACHE_MIN_GAIN = 0.2
PACK_ROWS_GRID = (0.0, 1.0, 2.0, 3.0, 4.0, 8.0)


def cached_fraction(resident: np.ndarray, cache_bytes: float, shares: CacheShares | None = None) -> np.ndarray:
    """Share of the bytes served from cache when a forward pass touches ``resident`` bytes of
    weights and KV cache: all of them while they fit ``cache_bytes``, else ``cache_bytes / resident``;
    with ``shares`` (measured), their share at ``resident`` instead."""
    if not cache_bytes:
        return np.zeros_like(resident, dtype=float)
    if shares is not None:
        return np.asarray(shares.at(np.asarray(resident, dtype=float)), dtype=float)
    return np.where(resident <= cache_bytes, 1.0, cache_bytes / np.maximum(resident, 1.0))


def per_call_fit(observations: list[Observation]) -> bool:
    """Whether the fixed cost is fitted per ATen call (``call_overhead_s``): every observation of
    a model run has its ops captured from the model's own code. Otherwise (ops from the analytic
    generator, which writes module-level operations and their kernel calls, no views) per
    operation and further launch (``op_overhead_s``, ``launch_overhead_s``)."""
    runs = [o for o in observations if o.phase != "micro"]
    return bool(runs) and all(o.captured for o in runs)


def fit(observations: list[Observation], *, fit_step_overhead: bool = True, max_iter: int = 30,
        half_rows: tuple[float, ...] | None = None,
        cache_bytes: tuple[float, ...] | None = CACHE_GRID,
        pack_rows: tuple[float, ...] | None = PACK_ROWS_GRID, robust: float | None = 0.1,
        weight_row_term: bool = True, held: dict[str, float] | None = None) -> FitResult:
    """Fit the coefficients to ``observations`` (see the module docstring).

    ``half_rows``: ``None`` (default) fits the small-M slowdown ``h`` as a linear coefficient
    (continuous, so two calibrations cannot land on different grid points); a tuple of fixed
    values tries each instead (``(0.0,)``: no small-M term). ``cache_bytes``: candidate cache
    sizes (0: one memory rate for all bytes); ``pack_rows``: candidate sizes from which matrix
    products repack their weights. The combination with the least relative squared error is kept,
    except that a cache must lower it by :data:`CACHE_MIN_GAIN` against the best fit without one.
    ``weight_row_term``: also fit a fixed cost per stored weight row (``matmul_ns_per_weight_row``),
    on top of max(compute, memory). On by default: streamed from memory (a cycle over 96 MB of
    copies, one thread), a one-row product with a [1024, 512] fp32 weight took 225 µs and one
    with [256, 2048], the same 2.1 MB, 150 µs; [8192, 256] took 1120 µs and [4096, 512] 863 µs.
    A single matrix timed over and over stays in cache and hides the difference.
    ``held``: coefficients (by :data:`PARAMS` name) measured otherwise and kept at their value,
    not fitted (:func:`~perfsdk.simulation.calibration.measure.fit_with_micro` measures
    ``s_per_weight_row`` with a pair of matrix-vector products: fitted alongside the per-pass
    and per-call costs, it trades itself against them from one calibration to the next).
    """
    if len(observations) < 3:
        raise ValueError(f"need at least 3 observations to calibrate, got {len(observations)}")
    # the best fit with each cache size (0: none)
    by_cache: dict[float, tuple[float, FitResult]] = {}
    for c in sorted(set(cache_bytes or (0.0,))):
        for pr in pack_rows or (0.0,):
            for h in half_rows if half_rows is not None else (None,):
                res = _fit_cache_at(observations, h, c, pr, fit_step_overhead=fit_step_overhead,
                                    max_iter=max_iter, robust=robust, weight_row_term=weight_row_term, held=held)
                if c and not _is_cache(res):
                    # no memory rate even with the cache's tied to it: the c = 0 fit covers that case
                    continue
                sse = _loss(np.array(list(res.errors_pct.values())) / 100.0, robust)
                if c not in by_cache or sse < by_cache[c][0] - 1e-12:
                    by_cache[c] = (sse, res)
    if not by_cache:  # only cache sizes offered, none a cache: the fit without one
        return fit(observations, fit_step_overhead=fit_step_overhead, max_iter=max_iter, half_rows=half_rows,
                   cache_bytes=(0.0,), pack_rows=pack_rows, robust=robust, weight_row_term=weight_row_term,
                   held=held)
    best_sse, best = min(by_cache.values(), key=lambda t: t[0])
    if 0.0 in by_cache and best.cache_bytes and best_sse > (1.0 - CACHE_MIN_GAIN) * by_cache[0.0][0]:
        best_sse, best = by_cache[0.0]
    return best


def _tied(a: np.ndarray) -> np.ndarray:
    """Feature rows with the cached bytes (column 5) counted at the memory's rate (column 1)."""
    a = a.copy()
    a[:, 1] += a[:, 5]
    a[:, 5] = 0.0
    return a


def _loss(rel_errors: np.ndarray, robust: float | None) -> float:
    """Squared relative errors, or with ``robust`` the Huber loss (quadratic up to ``robust``,
    linear beyond) that the robust fit minimises."""
    r = np.abs(rel_errors)
    if not robust:
        return float(np.sum(r * r))
    return float(np.sum(np.where(r <= robust, r * r, 2 * robust * r - robust * robust)))


#: Small-M values the fit of ``h`` also starts from (besides the additive start): the fit
#: alternates between labelling ops compute- or memory-bound and solving, and a small-M term
#: large enough to make batched matrix products compute-bound is a different fixed point from
#: none. Started only from ``h`` = 0, five calibrations of one 2-core host ended at h = 0 or 3
#: in two of them, with a loss 22-28 % above that of the fit at h = 16, and predicted
#: the unseen families 17 % apart.
HALF_ROWS_STARTS = (4.0, 16.0, 64.0)


def _fit_cache_at(observations: list[Observation], h: float | None, c: float = 0.0, pr: float = 0.0,
                  **kw: Any) -> FitResult:
    """:func:`_fit_at`, with the cache's rate tied to the memory's where, fitted on its own, it
    came out no faster than memory or free (``cache_rate_tied``).

    A cache whose rate the models leave between those bounds still sets which bytes and stored
    rows stream from memory; dropping it instead (the fit without a cache) charged every weight's
    rows from memory and moved the unseen families' batch-1 predictions 6-8 % between two
    calibrations of one machine, one of which fitted the cache at 25.5 GB/s against 24.5 GB/s
    from memory and the other no faster."""
    res = _fit_at(observations, h, c, pr, **kw)
    if c and not _is_cache(res):
        res = _fit_at(observations, h, c, pr, tie_cache=True, **kw)
    return res


def _is_cache(res: FitResult) -> bool:
    """Whether ``res`` prices its cached bytes above nothing and no slower than memory."""
    k = res.coefficients
    return 0 < k["s_per_cached_byte"] <= k["s_per_byte"]


def _fit_at(observations: list[Observation], h: float | None, c: float = 0.0, pr: float = 0.0, *,
            fit_step_overhead: bool, max_iter: int, robust: float | None = None,
            weight_row_term: bool = True, held: dict[str, float] | None = None,
            tie_cache: bool = False) -> FitResult:
    """Fit the linear coefficients at cache size ``c`` and repacking size ``pr``; the small-M
    parameter is fitted (``h`` None) or fixed at ``h``; ``held`` coefficients keep their value.

    A fitted ``h`` is started from the additive model and from the fit at each of
    :data:`HALF_ROWS_STARTS`; the result with the least loss is kept."""
    kw: dict[str, Any] = dict(fit_step_overhead=fit_step_overhead, max_iter=max_iter, robust=robust,
                              weight_row_term=weight_row_term, held=held, tie_cache=tie_cache)
    best = _fit_once(observations, h, c, pr, **kw)
    if h is not None:
        return best
    best_loss = _loss(np.array(list(best.errors_pct.values())) / 100.0, robust)
    for h0 in HALF_ROWS_STARTS:
        seed = _fit_once(observations, h0, c, pr, **kw)
        x0 = np.array([seed.coefficients[p] for p in PARAMS])
        x0[8] = h0 * x0[0]
        res = _fit_once(observations, None, c, pr, start=x0, **kw)
        loss = _loss(np.array(list(res.errors_pct.values())) / 100.0, robust)
        if loss < best_loss - 1e-12:
            best, best_loss = res, loss
    return best


def _fit_once(observations: list[Observation], h: float | None, c: float = 0.0, pr: float = 0.0, *,
              fit_step_overhead: bool, max_iter: int, robust: float | None = None,
              weight_row_term: bool = True, held: dict[str, float] | None = None,
              start: np.ndarray | None = None, tie_cache: bool = False) -> FitResult:
    """One alternating fit (see :func:`_fit_at`), from the additive model or from ``start``
    (coefficients in :data:`PARAMS` order); ``tie_cache``: the cached bytes at the memory's rate
    (their column merged into the memory's)."""
    if len(observations) < 3:
        raise ValueError(f"need at least 3 observations to calibrate, got {len(observations)}")
    free = [0, 1, 3, 4, 9] if fit_step_overhead else [0, 1, 4, 9]
    per_call = per_call_fit(observations)
    # the calls of a pass over a whole input and a decode step's each have their own cost where
    # both are observed; where one kind is missing it takes the other's
    whole = per_call and any(o.whole_input and o.calls for o in observations)
    steps = per_call and any(not o.whole_input and o.calls for o in observations)
    if per_call:
        free += [11] if steps or not whole else []
        free += [13] if whole else []
    else:
        free += _OP_TERMS
    if weight_row_term:
        free.append(10)
    if any(o.fresh for o in observations):
        free.append(12)
    tie = bool(c) and tie_cache
    if c and not tie:
        free.append(5)
    if pr:
        free.append(6)
    if h is None:
        free.append(8)
    held = dict(held or {})
    held_at = {PARAMS.index(k): v for k, v in held.items()}
    free = [j for j in free if j not in held_at]
    hv = np.zeros(len(PARAMS))
    for j, v in held_at.items():
        hv[j] = v
    hf = h or 0.0
    # start from an additive model: every op both compute- and memory-costed
    a0 = np.array([[np.sum(o.weights * (o.flops + hf * o.row_flops(pr))),
                    np.sum(o.weights * o.bytes_ * (1 - o.cached_fraction(c))),
                    o.op_count, o.forward_passes, 1.0 if o.phase == "prefill" else 0.0,
                    np.sum(o.weights * o.bytes_ * o.cached_fraction(c)), np.sum(o.weights * o.packed_bytes(pr)),
                    o.extra_launches, np.sum(o.weights * o.row_flops(pr)) if h is None else 0.0,
                    np.sum(o.weights * (o.scores if o.scores is not None else 0.0)),
                    o.stored_rows(pr, c), 0.0 if o.whole_input else o.calls, o.fresh,
                    o.calls if o.whole_input else 0.0]
                   for o in observations])
    if tie:
        a0 = _tied(a0)
    # an observation none of whose features is fitted here (a chain of kernel calls under the
    # per-call fixed cost) says nothing about the coefficients: left out
    keep = np.any(a0[:, free] != 0, axis=1)
    if not np.all(keep):
        observations = [o for o, k in zip(observations, keep) if k]
        a0 = a0[keep]
    b = np.array([o.measured_s for o in observations])
    scale = 1.0 / b
    col = np.maximum(np.abs(a0).max(axis=0), 1e-30)  # column scaling for conditioning
    # the held coefficients' share of each time is known: the free ones fit the rest
    if start is not None:
        x = np.asarray(start, dtype=float).copy()
        x[list(held_at)] = hv[list(held_at)]
    else:
        x = _nnls(a0 * scale[:, None] / col, (b - a0 @ hv) * scale, free) / col + hv
    if tie:
        x[5] = x[1]
    labels: list[Any] = []
    it = 0
    w = np.ones_like(b)
    for it in range(1, max_iter + 1):
        xf = x[0] if x[0] > 0 else 1e-18
        xb = x[1] if x[1] > 0 else 1e-18
        a = np.array([o.features(xf, xb, hf, c, x[5], pr, x[8], x[9], x[10]) for o in observations])
        if tie:
            a = _tied(a)
        new_labels = [tuple(row[:2].tolist()) for row in a]
        col = np.maximum(np.abs(a).max(axis=0), 1e-30)
        x = _nnls(a * (scale * w)[:, None] / col, (b - a @ hv) * scale * w, free) / col + hv
        if tie:
            x[5] = x[1]
        new_w = w
        if robust:
            # Huber weights on the relative error: an observation the model misses by more than
            # ``robust`` counts in proportion to 1/|error|, so one noisy or unmodelled
            # configuration cannot pull every coefficient towards itself
            r = np.abs(a @ x - b) / b
            new_w = np.minimum(1.0, robust / np.maximum(r, 1e-12))
        if new_labels == labels and np.allclose(new_w, w, rtol=1e-3, atol=1e-4):
            break
        labels, w = new_labels, new_w
    if per_call and not whole:
        x[13] = x[11]
    elif whole and not steps:
        x[11] = x[13]
    errors = {o.label: 100.0 * (o.predict(x, hf, c, pr) - o.measured_s) / o.measured_s for o in observations}
    if h is None:
        h_fit = float(x[8] / x[0]) if x[0] > 0 else 0.0
    else:
        h_fit = hf
    return FitResult(coefficients=dict(zip(PARAMS, (float(v) for v in x))), errors_pct=errors, iterations=it,
                     observations=len(observations),
                     fixed=([] if fit_step_overhead else ["step_overhead_s"])
                     + ([] if weight_row_term else ["s_per_weight_row"]),
                     matmul_half_rows=h_fit, cache_bytes=c, pack_rows=pr, per_call=per_call,
                     held=held, cache_rate_tied=tie)


def this_host() -> str:
    """The name a calibration on this machine records as its host (the CPU model)."""
    from perfsdk.env import cpu_model

    return cpu_model() or platform.machine() or "unknown"


def profile_from_fit(result: FitResult, *, name: str = "host-calibrated", base: HardwareProfile | None = None,
                     note: str = "") -> HardwareProfile:
    """A profile carrying the fitted rates at efficiency 1.0 (they are achieved rates): a ``cpu``
    profile of this host, or, for a fit from stored runs (``result.machine``), one of the device
    those runs measured (a ``gpu`` profile for CUDA runs).

    Energy, capacity, static power and the rates the data cannot identify come from ``base``: the
    catalogue profile of the runs' GPU when there is one, else the built-in ``host-cpu``
    estimates (capacity from this machine's RAM, or the stored runs' machine's), because timing
    runs cannot measure them.
    """
    from perfsdk.hardware.catalog import builtin_profiles, get_profile

    machine = result.machine
    if base is None and machine is not None and machine.base:
        base = get_profile(machine.base)
    base = base or builtin_profiles()["host-cpu"]
    fps = result.flops_per_s or base.effective_flops(machine.dtype if machine is not None else "float32")
    bps = result.bytes_per_s or base.effective_bandwidth_bytes_per_s
    capacity_gb: float | None
    if machine is not None:
        cpu, kind, capacity_gb = machine.label, machine.kind, machine.capacity_gb or base.memory_capacity_gb
    else:
        kind = "cpu"
        try:
            import psutil

            capacity_gb = psutil.virtual_memory().total / 1e9
        except Exception:
            capacity_gb = base.memory_capacity_gb
        cpu = this_host()
    missing = [k for k, v in (("FLOP/s", result.flops_per_s), ("bandwidth", result.bytes_per_s)) if v is None]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = (f"Fitted by perfsdk calibrate on {when} from {result.observations} measured phases "
              f"(least squares on the simulation's own cost model). {note}".strip())
    if result.drift_pct is not None:
        over = f"; {result.passes} passes" if result.passes else ""
        source += (f" The same configurations ran {result.drift_pct:.1f} % slower in the calibration's slowest "
                   f"pass than in its fastest (median over configurations{over})")
        if result.normalised_drift_pct is not None:
            source += (f"; {result.normalised_drift_pct:.1f} % once each was divided by the reference workload "
                       "timed around it")
            if result.reference_tracking is not None:
                source += f" (to the power {result.reference_tracking:.2f}, the one the passes follow it with)"
        source += "."
    if result.memory_tracking is not None and result.rest_tracking is not None:
        source += (f" Told apart by each phase's share of memory traffic, the memory traffic followed the reference "
                   f"workload to the power {result.memory_tracking:.2f}, the rest to {result.rest_tracking:.2f}.")
    if missing:
        source += f" Not identifiable from the data, kept from {base.name}: {', '.join(missing)}."
    source += f" Energy, static power and efficiency-free rates: energy figures copied from {base.name} (estimates)."
    peak = fps / 1e12
    k = result.coefficients
    from perfsdk.hardware.profile import CalibrationRecord

    record = CalibrationRecord(
        host=cpu, fitted_at=when, params=list(PARAMS), coefficients=[float(k[p]) for p in PARAMS],
        replicates=result.replicates, held_out=result.held_out, levels=result.levels,
        run_scatter=result.run_scatter,
        held_out_whole_family=result.held_out_whole_family, families=result.families,
        cache_bytes=result.cache_bytes, pack_rows=result.pack_rows, reference=result.reference,
        reference_s=result.reference_s, reference_tracking=result.reference_tracking,
        rest_tracking=result.rest_tracking, memory_tracking=result.memory_tracking,
        memory_reference=result.memory_reference, memory_reference_s=result.memory_reference_s,
        compute_reference=result.compute_reference, compute_reference_s=result.compute_reference_s,
        drift_pct=result.drift_pct,
        normalised_drift_pct=result.normalised_drift_pct, passes=result.passes, threads=result.threads,
        clock=result.clock, small_m_gaps=result.small_m_gaps,
        pack_fast_bytes=result.pack_fast[0] if result.pack_fast and result.pack_rows else 0.0,
        pack_fast_share=result.pack_fast[1] if result.pack_fast and result.pack_rows else None,
        few_rows=result.few_rows if result.pack_rows else None, weight_row_costs=result.weight_row_costs,
        cache_shares=result.cache_shares if result.cache_bytes else None)
    cached = bool(result.cache_bytes) and k.get("s_per_cached_byte", 0) > 0
    where = "this host" if machine is None else f"{cpu} in stored runs"
    return HardwareProfile(
        name=name, kind=kind, variant=f"{cpu}, fitted rates", source=source,
        description=f"Effective rates of {where} as perfsdk measured them (use with compute/memory efficiency 1.0).",
        memory_bandwidth_gbs=bps / 1e9, memory_pj_per_bit=base.memory_pj_per_bit,
        # the host link of a device profile is the base's (timing runs do not measure it)
        host_to_device_gbs=base.host_to_device_gbs, host_to_device_pj_per_bit=base.host_to_device_pj_per_bit,
        device_to_host_gbs=base.device_to_host_gbs, device_to_host_pj_per_bit=base.device_to_host_pj_per_bit,
        memory_capacity_gb=round(capacity_gb, 1) if capacity_gb else None,
        peak_tflops=({"fp32": peak, "bf16": peak, "fp16": peak} if result.flops_per_s  # type: ignore[arg-type]
                     else {k: v * base.compute_efficiency for k, v in base.peak_tflops.model_dump().items() if v}),
        compute_pj_per_flop=base.compute_pj_per_flop, static_power_w=base.static_power_w,
        compute_efficiency=1.0, memory_efficiency=1.0,
        op_overhead_s=result.coefficients["op_overhead_s"],
        launch_overhead_s=result.coefficients.get("launch_overhead_s", 0.0), step_overhead_s=result.coefficients["step_overhead_s"],
        call_overhead_s=k.get("call_overhead_s", 0.0) if result.per_call else None,
        prefill_call_overhead_s=k.get("prefill_call_overhead_s", 0.0) if result.per_call else None,
        prefill_overhead_s=result.coefficients["prefill_overhead_s"],
        decode_warmup_steps=result.decode_warmup_steps,
        matmul_half_rows=result.matmul_half_rows or None,
        matmul_small_m_gaps=result.small_m_gaps if result.matmul_half_rows else None,
        matmul_pack_rows=result.pack_rows or None,
        matmul_pack_gbs=(1e-9 / result.coefficients["s_per_packed_byte"]
                         if result.pack_rows and result.coefficients.get("s_per_packed_byte", 0) > 0 else None),
        matmul_pack_fast_mb=(result.pack_fast[0] / 1e6 if result.pack_fast and result.pack_rows else None),
        matmul_pack_fast_share=(result.pack_fast[1] if result.pack_fast and result.pack_rows else None),
        matmul_few_rows=result.few_rows if result.pack_rows else None,
        cache_mb=result.cache_bytes / 1e6 if cached else None,
        cache_bandwidth_gbs=1e-9 / k["s_per_cached_byte"] if cached else None,
        cache_shares=result.cache_shares if cached else None,
        softmax_ns_per_element=k.get("s_per_score", 0.0) * 1e9 or None,
        matmul_ns_per_weight_row=k.get("s_per_weight_row", 0.0) * 1e9 or None,
        matmul_weight_row_costs=result.weight_row_costs if k.get("s_per_weight_row", 0.0) > 0 else None,
        fresh_write_gbs=1e-9 / k["s_per_fresh_byte"] if k.get("s_per_fresh_byte", 0.0) > 0 else None,
        calibration=record,
    )



@dataclass
class ConfigurationSamples:
    """One calibration configuration: its observations (measured at the central estimate) and,
    for each of them, the value measured in every pass (what the bootstrap resamples)."""

    model: str
    observations: list[Observation]
    per_pass: list[list[float]]
    #: the model's width (hidden size) and family (model type): see :func:`held_out_predictions`
    width: int | None = None
    family: str | None = None


def _refit(result: FitResult, observations: list[Observation], *, fit_step_overhead: bool,
           robust: float | None) -> np.ndarray:
    """The coefficients (in :data:`PARAMS` order) fitted to ``observations`` at ``result``'s
    cache and repacking sizes, the small-M term fitted as in ``result``."""
    res = _fit_cache_at(observations, None, result.cache_bytes, result.pack_rows,
                        fit_step_overhead=fit_step_overhead, max_iter=30, robust=robust,
                        weight_row_term="s_per_weight_row" not in result.fixed, held=result.held)
    return np.array([res.coefficients[p] for p in PARAMS])


def bootstrap_coefficients(result: FitResult, configs: list[ConfigurationSamples], fixed: list[Observation], *,
                           replicates: int = 40, seed: int = 0, fit_step_overhead: bool = True,
                           robust: float | None = 0.1) -> list[list[float]]:
    """Coefficients refitted on ``replicates`` bootstrap resamples: the configurations drawn with
    replacement and, for each, its passes drawn with replacement (the median of the drawn passes
    is the measurement). ``fixed`` observations (the micro-kernels) are in every resample."""
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    out: list[list[float]] = []
    n = len(configs)
    if n < 2:
        return out
    for _ in range(replicates):
        obs = list(fixed)
        for i in rng.integers(0, n, n):
            c = configs[int(i)]
            for ob, values in zip(c.observations, c.per_pass):
                vals = np.asarray(values, dtype=float)
                pick = vals[rng.integers(0, len(vals), len(vals))] if len(vals) > 1 else vals
                obs.append(replace(ob, measured_s=float(np.median(pick))))
        if len(obs) < 3:
            continue
        out.append(_refit(result, obs, fit_step_overhead=fit_step_overhead, robust=robust).tolist())
    return out


@dataclass
class HeldOut:
    """One configuration predicted by a fit that left its model out: ``errors`` ``[prefill,
    decode]`` (fractions, ``(predicted - measured) / measured``), the configuration's ``family``
    (model type, None when unknown) and whether the fit left out that ``whole_family``."""

    errors: list[float]
    family: str | None
    whole_family: bool


def held_out_predictions(result: FitResult, configs: list[ConfigurationSamples], fixed: list[Observation], *,
                         fit_step_overhead: bool = True, robust: float | None = 0.1) -> list[HeldOut]:
    """Every configuration predicted by a fit on the other models' configurations only: how far
    the cost model misses a model it was not fitted on. Needs at least two models.

    The models of the most common width are held out one at a time; models of other widths stay
    in every fit. They are there to pin what one width alone cannot (the fixed costs that dominate
    a very narrow model), and leaving one out measures how well the remaining design identifies
    those costs, not how far the model misses a model like the ones predicted.

    With models of several families (``family``), the family most of them belong to is treated
    so, and every other family is left out whole, all its models at once, and predicted by a fit
    on the rest (``whole_family``): how far the calibration misses a family it never saw, which
    is what a prediction of another family's model risks."""
    models = list(dict.fromkeys(c.model for c in configs))
    out: list[HeldOut] = []
    if len(models) < 2:
        return out
    families = {c.model: c.family for c in configs}
    per_family: dict[Any, list[str]] = {}
    for m in models:
        per_family.setdefault(families[m], []).append(m)
    main = max(per_family, key=lambda f: len(per_family[f]))
    own = per_family[main]
    widths = {c.model: c.width for c in configs}
    counts: dict[Any, int] = {}
    for m in own:
        counts[widths[m]] = counts.get(widths[m], 0) + 1
    common = max(counts, key=lambda w: counts[w])
    groups = [([m], False) for m in own if counts[common] == 1 or widths[m] == common]
    groups += [(ms, True) for f, ms in per_family.items() if f != main]
    for group, whole in groups:
        train = list(fixed) + [ob for c in configs if c.model not in group for ob in c.observations]
        if len(train) < 3:
            continue
        x = _refit(result, train, fit_step_overhead=fit_step_overhead, robust=robust)
        for c in configs:
            if c.model not in group:
                continue
            errs = {ob.phase: (ob.predict(x, 0.0, result.cache_bytes, result.pack_rows) - ob.measured_s)
                    / ob.measured_s for ob in c.observations}
            if "prefill" in errs and "decode" in errs:
                out.append(HeldOut([float(errs["prefill"]), float(errs["decode"])], c.family, whole))
    return out


def held_out_errors(result: FitResult, configs: list[ConfigurationSamples], fixed: list[Observation], *,
                    fit_step_overhead: bool = True, robust: float | None = 0.1) -> list[list[float]]:
    """``[prefill error, decode error]`` of every configuration of :func:`held_out_predictions`."""
    return [h.errors for h in held_out_predictions(result, configs, fixed, fit_step_overhead=fit_step_overhead,
                                                   robust=robust)]


def keep_held_out(result: FitResult, configs: list[ConfigurationSamples], fixed: list[Observation], *,
                  fit_step_overhead: bool = True) -> None:
    """Set ``result``'s held-out errors, which of them left out a whole family, and the
    calibration's families (what the intervals of its predictions draw on)."""
    held = held_out_predictions(result, configs, fixed, fit_step_overhead=fit_step_overhead)
    result.held_out = [h.errors for h in held]
    result.held_out_whole_family = [h.whole_family for h in held]
    result.families = sorted({c.family for c in configs if c.family})


def _held_out_loss(errors: list[list[float]]) -> float:
    """Mean squared relative error of held-out predictions (prefill and decode)."""
    flat = [e for pair in errors for e in pair]
    return float(np.mean(np.square(flat))) if flat else float("nan")


def keep_cache(with_cache: FitResult, without: FitResult, configs: list[ConfigurationSamples],
               fixed_with: list[Observation], fixed_without: list[Observation], *,
               fit_step_overhead: bool = True) -> tuple[bool, str]:
    """Whether a fit with a cache (``with_cache``) should be kept over the best fit without one:
    only when it also predicts the calibration's models left out of the fit
    (:func:`held_out_errors`) better, by :data:`CACHE_MIN_GAIN` in mean squared relative error.

    A cache is chosen on the fit's own configurations; from one calibration to the next of the
    same machine the choice flipped (a 16 MB cache in one, none in the other, both within the
    in-sample rule), and the two predicted the same unseen families 8-20 % apart, the one with
    the cache no closer to what was measured. What a prediction of another model needs is the
    out-of-sample error, so that decides. Returns the decision and a sentence saying why."""
    held_with = held_out_errors(with_cache, configs, fixed_with, fit_step_overhead=fit_step_overhead)
    held_without = held_out_errors(without, configs, fixed_without, fit_step_overhead=fit_step_overhead)
    loss_with, loss_without = _held_out_loss(held_with), _held_out_loss(held_without)
    size = f"{with_cache.cache_bytes / 1e6:g} MB"
    if not (np.isfinite(loss_with) and np.isfinite(loss_without)):
        return True, f"a {size} cache kept: no model could be left out to check it"
    rms_with, rms_without = 100 * loss_with ** 0.5, 100 * loss_without ** 0.5
    if loss_with <= (1.0 - CACHE_MIN_GAIN) * loss_without:
        return True, (f"a {size} cache kept: it predicts the models left out of the fit with {rms_with:.1f} % rms "
                      f"error, {rms_without:.1f} % without")
    return False, (f"no cache: a {size} cache fitted the calibration better, but predicts the models left out of "
                   f"the fit with {rms_with:.1f} % rms error against {rms_without:.1f} % without")


def checked_cache(result: FitResult, fixed: list[Observation], refit_without: Any,
                  configs: list[ConfigurationSamples], *,
                  fit_step_overhead: bool = True) -> tuple[FitResult, list[Observation]]:
    """``(result, fixed)``, or the fit without a cache that ``refit_without()`` returns (with its
    fixed observations) where :func:`keep_cache` drops the cache ``result`` chose; the kept fit's
    ``cache_note`` says why. A fit without a cache is returned as it is."""
    if not result.cache_bytes:
        return result, fixed
    without, fixed_without = refit_without()
    keep, note = keep_cache(result, without, configs, fixed, fixed_without, fit_step_overhead=fit_step_overhead)
    chosen, chosen_fixed = (result, fixed) if keep else (without, fixed_without)
    chosen.cache_note = note
    return chosen, chosen_fixed

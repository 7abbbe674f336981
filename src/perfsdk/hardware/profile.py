"""The hardware profile: what the simulation needs to know about one device.

A profile is a YAML mapping validated by :class:`HardwareProfile` (the JSON Schema
``schemas/hardware.schema.json`` is generated from it). Units are in the field names:
bandwidths in GB/s (10^9 bytes per second), energies in pJ per bit or per FLOP, peak compute in
TFLOPS (10^12 operations per second, dense, no sparsity), times in seconds or ns per element.

Spec sheets disagree (SXM vs PCIe, boost vs base clock, sparse vs dense): every profile names its
exact ``variant`` and cites its ``source``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DeviceKind = Literal["gpu", "cpu", "pim", "accelerator"]

#: Peak-compute keys, and the torch dtype names that map to each.
DTYPE_KEYS: dict[str, str] = {
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "fp8": "fp8",
    "int8": "int8",
    "qint8": "int8",
    "uint8": "int8",
    "int4": "int4",
    "uint4": "int4",
    "quint4x2": "int4",
}

#: Bytes per element for each peak-compute key (int4 packs two per byte).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5,
}

# When a profile lacks the op's dtype, try these (in order) before failing.
_DTYPE_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": ("tf32",),
    "tf32": ("fp32",),
    "fp16": ("bf16",),
    "bf16": ("fp16",),
    "fp8": ("int8", "fp16", "bf16"),
    "int8": ("fp8", "fp16", "bf16"),
    "int4": ("int8", "fp8", "fp16", "bf16"),
}


class HardwareProfileError(ValueError):
    """An invalid hardware profile; the message names the file (if any) and the field path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakTflops(_Strict):
    """Dense peak throughput per data type, in TFLOPS (TOPS for integer types)."""

    fp32: float | None = Field(default=None, gt=0, description="FP32 (non-tensor-core) TFLOPS")
    tf32: float | None = Field(default=None, gt=0, description="TF32 tensor-core TFLOPS, dense")
    fp16: float | None = Field(default=None, gt=0, description="FP16 TFLOPS, dense")
    bf16: float | None = Field(default=None, gt=0, description="BF16 TFLOPS, dense")
    fp8: float | None = Field(default=None, gt=0, description="FP8 TFLOPS, dense")
    int8: float | None = Field(default=None, gt=0, description="INT8 TOPS, dense")
    int4: float | None = Field(default=None, gt=0, description="INT4 TOPS, dense")

    @model_validator(mode="after")
    def _at_least_one(self) -> PeakTflops:
        if all(getattr(self, k) is None for k in type(self).model_fields):
            raise ValueError("give the peak for at least one data type (fp32, tf32, fp16, bf16, fp8, int8, int4)")
        return self

    def available(self) -> dict[str, float]:
        """The data types this device has a peak for, ``{key: tflops}``."""
        return {k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None}


def log_interp(x: Any, xs: list[float], ys: list[float]) -> Any:
    """``ys`` at ``x`` (a number or a numpy array), linear in log x between the ascending positive
    ``xs`` and held beyond them."""
    return np.interp(np.log(np.clip(np.asarray(x, dtype=float), xs[0], xs[-1])), np.log(xs), ys)


class SmallMGaps(_Strict):
    """How far the small-M slowdown ``h`` of a matrix product departs from the fitted one, by how
    its weight is stored and by its inner size K (the input features the product sums over), as a
    host's calibration measured it: a gap in rows at each measured K for a weight stored [out, in]
    (a linear layer) and one stored [in, out] (a Conv1D), each linear in log K between the listed
    sizes and held beyond them.

    With ``anchor`` (the measured ``h`` the gaps are taken from), a product takes the fitted ``h``
    scaled by its own measured ``h`` over the anchor, ``h * (anchor - gap) / anchor``, at most
    ``h``: a kernel that measured a third of the anchor's slowdown keeps a third of the fitted
    one, and one measured slower than the anchor keeps it whole (a small anchor, as one thread
    measures, would otherwise multiply the ladder's noise into ``h``). Without, it takes
    ``h - gap``. Either way at least 0."""

    inner: list[float] = Field(min_length=1, description="Inner sizes K measured, ascending")
    out_in: list[float] = Field(description="Gap in rows at each inner size, weight stored [out, in]")
    in_out: list[float] = Field(description="Gap in rows at each inner size, weight stored [in, out]")
    anchor: float | None = Field(
        default=None, gt=0,
        description="The measured h the gaps are taken from (rows): a product then takes the fitted h times "
                    "(anchor - gap) / anchor, between 0 and 1; none: the fitted h less the gap")

    @model_validator(mode="after")
    def _aligned(self) -> SmallMGaps:
        if len(self.out_in) != len(self.inner) or len(self.in_out) != len(self.inner):
            raise ValueError(f"out_in and in_out need one gap per inner size ({len(self.inner)}), "
                             f"got {len(self.out_in)} and {len(self.in_out)}")
        if any(k <= 0 for k in self.inner) or any(b <= a for a, b in zip(self.inner, self.inner[1:])):
            raise ValueError(f"inner sizes must be positive and ascending, got {self.inner}")
        return self

    def gap(self, inner: float, in_out: bool) -> float:
        """The gap of a product of inner size ``inner`` over a weight stored [in, out]
        (``in_out``) or [out, in]: linear in log K between the sizes, held beyond them."""
        return float(log_interp(inner, self.inner, self.in_out if in_out else self.out_in))

    def scale(self, inner: float, in_out: bool) -> float | None:
        """The share of the fitted ``h`` such a product keeps, ``(anchor - gap) / anchor`` between
        0 and 1 (None without an anchor: the gap is subtracted instead)."""
        if self.anchor is None:
            return None
        return float(self.shares(self.gap(inner, in_out)))

    def shares(self, gaps: Any) -> Any:
        """``(anchor - gap) / anchor`` between 0 and 1 for a gap or an array of them (an anchor
        must be set)."""
        assert self.anchor is not None
        return np.clip(1.0 - np.asarray(gaps) / self.anchor, 0.0, 1.0)

    def half_rows(self, h: float, inner: float, in_out: bool) -> float:
        """The ``h`` of such a product when the fitted one is ``h``."""
        s = self.scale(inner, in_out)
        return h * s if s is not None else max(0.0, h - self.gap(inner, in_out))



class WeightRowCosts(_Strict):
    """The fixed cost of each row of a matrix product's weight as stored, by the row's length in
    bytes, as a host's calibration measured it (one-row products over fp32 weights of the same
    bytes streamed from memory, rows of 128 to 4096 elements): linear in log length between the
    listed lengths, held beyond them. A CPU matrix-vector kernel streams a weight of short rows
    slower than one of long rows, and not in proportion to the rows: on a 2-core x86 host (one
    thread, 8.4 MB weights) rows of 128, 256, 512, 1024 and 4096 elements streamed at 8.2, 10.3,
    13.3, 16.6 and 22.1 GB/s: 40, 55, 65 and 67 ns a row more than the 4096-element rows took. A
    calibration's table costs its longest rows nothing (the memory's rate is theirs)."""

    row_bytes: list[float] = Field(min_length=1, description="Lengths of a stored row measured, bytes, ascending")
    ns: list[float] = Field(description="Cost of one stored row at each length, ns")

    @model_validator(mode="after")
    def _aligned(self) -> WeightRowCosts:
        if len(self.ns) != len(self.row_bytes):
            raise ValueError(f"ns needs one cost per row length ({len(self.row_bytes)}), got {len(self.ns)}")
        if any(b <= 0 for b in self.row_bytes) or any(b <= a for a, b in zip(self.row_bytes, self.row_bytes[1:])):
            raise ValueError(f"row lengths must be positive and ascending, got {self.row_bytes}")
        if any(c < 0 for c in self.ns):
            raise ValueError(f"costs per row must be at least 0, got {self.ns}")
        return self

    def at(self, row_bytes: Any) -> Any:
        """The cost in ns of one stored row of ``row_bytes`` bytes (a number or a numpy array):
        linear in log length between the listed lengths, held beyond them."""
        out = log_interp(row_bytes, self.row_bytes, self.ns)
        return float(out) if np.ndim(out) == 0 else out



class CacheShares(_Strict):
    """The share of a forward pass's bytes that the cache serves, by the bytes of weights and KV
    cache the pass touches, as a host's calibration measured it (one-row products over 4 MiB fp32
    weights cycled over working sets of 4 to 384 MiB, each set's time placed between the in-cache
    time and the memory's): linear in log bytes between the listed sizes, held beyond them, in
    place of min(1, cache / bytes). A pass that cycles through more than the cache can keep less
    of it than that ratio: each weight may be pushed out before it comes round again. Two threads
    on a 2-core x86 host with an 11.5 MB cache: one-row products over [2048, 256] weights kept 0.42
    of their bytes in the cache at 1.5 times its size and none at 1.8 times (the ratio: 0.69 and
    0.55), where the calibration's [1024, 1024] ones followed the ratio closely (0.72-0.82 at 16
    MiB against 0.69-0.81)."""

    resident_bytes: list[float] = Field(min_length=1, description="Bytes a pass touches, measured, ascending")
    share: list[float] = Field(description="Share of those bytes served from the cache at each size, 0 to 1, "
                                           "not rising with the size")

    @model_validator(mode="after")
    def _aligned(self) -> CacheShares:
        if len(self.share) != len(self.resident_bytes):
            raise ValueError(f"share needs one value per size ({len(self.resident_bytes)}), got {len(self.share)}")
        if any(b <= 0 for b in self.resident_bytes) or any(
                b <= a for a, b in zip(self.resident_bytes, self.resident_bytes[1:])):
            raise ValueError(f"sizes must be positive and ascending, got {self.resident_bytes}")
        if any(not 0.0 <= f <= 1.0 for f in self.share):
            raise ValueError(f"shares must lie between 0 and 1, got {self.share}")
        if any(b > a for a, b in zip(self.share, self.share[1:])):
            raise ValueError(f"shares must not rise with the size, got {self.share}")
        return self

    def at(self, resident_bytes: Any) -> Any:
        """The share served from the cache for a pass touching ``resident_bytes`` (a number or a
        numpy array): linear in log bytes between the listed sizes, held beyond them."""
        out = log_interp(np.maximum(resident_bytes, 1.0), self.resident_bytes, self.share)
        return float(out) if np.ndim(out) == 0 else out


class FewRowRatios(_Strict):
    """What a matrix product of a few rows costs against the same product of one row, as a host's
    calibration measured it (a staircase of linear products of 1 to 16 rows over fp32 weights
    streamed from memory): a CPU kernel runs one row as a matrix-vector product and two or three
    as one more pass over the weight each, then repacks the weight from four rows on, so the time
    steps up and down with the rows in a way no rate per FLOP or per byte follows. A product of R
    rows (from 2 up to the last listed count) costs its one-row time times the ratio at R (linear
    between the listed counts).

    ``streamed`` holds over a weight of ``streamed_mb`` and more (the staircase's weight, which
    the first pass leaves in no cache); ``cached``, where given, over a weight of at most
    ``cached_mb`` (the cores' own caches keep it between passes); between the two sizes the ratio
    is linear in log bytes. (Two threads on a 2-core x86 host, timed alone: 1.72-2.10 at 2 rows and
    1.35-1.64 at 4 over weights of 8-17 MB; 1.25-1.44 and 1.34-1.48 over weights of at most 1 MB.)
    The kernel a few rows take depends on the weight's shape as well as its size (two threads on a
    2-core AMD host, 8.4 MB weights: 1.26-1.44 at 4 rows over [4096, 512], 1.47-1.53 over [8192, 256],
    1.94 over [512, 4096]), so each ratio is the geometric mean over ``shapes`` weights of one size
    and inner sizes apart."""

    rows: list[int] = Field(min_length=1, description="Row counts measured, ascending, from 2")
    streamed: list[float] = Field(description="Time at each row count over the one-row time, streamed weight")
    streamed_mb: float = Field(gt=0, description="The streamed weight's size, MB")
    cached: list[float] | None = Field(default=None,
                                       description="The same over a weight of at most cached_mb; none: as streamed")
    cached_mb: float | None = Field(default=None, gt=0, description="Largest weight that takes cached, MB")
    shapes: int = Field(default=1, ge=1, description="Weight shapes of one size (inner sizes apart) each ratio is "
                                                      "the geometric mean over")

    @model_validator(mode="after")
    def _aligned(self) -> FewRowRatios:
        if any(r < 2 for r in self.rows) or any(b <= a for a, b in zip(self.rows, self.rows[1:])):
            raise ValueError(f"rows must be ascending counts of at least 2, got {self.rows}")
        for name in ("streamed", "cached"):
            ys = getattr(self, name)
            if ys is not None and (len(ys) != len(self.rows) or any(y <= 0 for y in ys)):
                raise ValueError(f"{name} needs one positive ratio per row count ({len(self.rows)}), got {ys}")
        if (self.cached is None) != (self.cached_mb is None):
            raise ValueError("cached and cached_mb go together")
        return self

    def ratio(self, rows: float, weight_bytes: float) -> float | None:
        """The ratio of a product of ``rows`` rows over a weight of ``weight_bytes``; None where
        the staircase does not reach (one row, or more than its last count)."""
        import math

        if rows < 1.5 or rows > self.rows[-1]:
            return None
        xs = [1.0, *map(float, self.rows)]
        slow = float(np.interp(rows, xs, [1.0, *self.streamed]))
        if self.cached is None or self.cached_mb is None:
            return slow
        fast = float(np.interp(rows, xs, [1.0, *self.cached]))
        lo, hi = self.cached_mb * 1e6, self.streamed_mb * 1e6
        if weight_bytes <= lo or hi <= lo:
            return fast if weight_bytes <= lo else slow
        if weight_bytes >= hi:
            return slow
        t = math.log(weight_bytes / lo) / math.log(hi / lo)
        return fast + t * (slow - fast)


#: the rates that price the bytes streamed from memory (the memory-bound bytes, and the weights a
#: matrix product repacks), and the calibration coefficients of the same: what
#: :meth:`HardwareProfile.slower_by` scales by the memory traffic's own factor
MEMORY_RATES = ("memory_bandwidth_gbs", "matmul_pack_gbs")
MEMORY_COEFFICIENTS = ("s_per_byte", "s_per_packed_byte")
#: the calibration's coefficients of arithmetic (the cost per FLOP and the small-M slowdown's
#: cost per row and FLOP, whose ratio is the slowdown's size): with ``peak_tflops``, what runs at the cores' speed
COMPUTE_COEFFICIENTS = ("s_per_flop", "s_per_row_flop")


class CalibrationRecord(_Strict):
    """What a calibration on a host keeps so that its predictions can state their uncertainty.

    Written by ``perfsdk calibrate``; the simulation turns it into an interval on every predicted
    time (:mod:`perfsdk.simulation.uncertainty`). Three sources of spread are kept apart:

    - ``replicates``: the cost model's coefficients refitted on bootstrap resamples of the
      calibration's configurations and passes (how well the timings pin the coefficients);
    - ``held_out``: relative errors ``(predicted - measured) / measured`` of the prefill and of the
      decode of each calibration configuration, predicted by a fit that left that configuration's
      model out (how far the cost model misses a model it was not fitted on); those whose fit left
      out the configuration's whole family (``held_out_whole_family``) are how far it misses a
      family it never saw, which is what a prediction of a family outside ``families`` draws on
      (each error both ways: which way another family misses is its own);
    - ``levels``: the reference workload's times over the calibration, relative to their median
      (how much the machine's own speed moved while it was measured);
    - ``run_scatter``: each configuration's time in one pass on the raw clock over its median over
      the passes (how far one run strays on this machine: the machine's moves and the short stalls
      a run of a few milliseconds meets). The intervals draw the run's level from it, and from
      ``levels`` where a calibration did not keep it.
    """

    host: str = Field(min_length=1, description="The machine the calibration ran on (CPU model)")
    fitted_at: str = Field(min_length=1, description="When (UTC)")
    level: float = Field(default=0.9, gt=0, lt=1, description="Coverage of the intervals drawn from this record")
    params: list[str] = Field(min_length=1, description="Names of the coefficients, in the order of the vectors below")
    coefficients: list[float] = Field(description="The fitted coefficients")
    replicates: list[list[float]] = Field(default_factory=list,
                                          description="Coefficients of the bootstrap refits")
    held_out: list[list[float]] = Field(default_factory=list,
                                        description="[prefill error, decode error] of each configuration predicted "
                                                    "without its model, as fractions")
    held_out_whole_family: list[bool] = Field(
        default_factory=list,
        description="For each held_out entry, whether the fit that predicted it left out the configuration's whole "
                    "family (a family other than the calibration's main one); empty: not recorded")
    families: list[str] = Field(
        default_factory=list,
        description="The families (model types) the calibration measured; a prediction of any other family draws its "
                    "model error from the held_out entries of families left out whole, each taken both ways (the "
                    "measurement as far above the prediction as below)")
    levels: list[float] = Field(default_factory=list,
                                description="The reference workload's times relative to their median, to the power "
                                            "reference_tracking")
    run_scatter: list[float] = Field(
        default_factory=list,
        description="Each calibration configuration's TTFT and decode time in one pass, on the raw clock, over its "
                    "median over the passes: how far one run strays on this machine; empty: not recorded (the "
                    "intervals then draw on levels)")
    cache_bytes: float = Field(default=0.0, ge=0, description="Cache size the coefficients were fitted at")
    pack_rows: float = Field(default=0.0, ge=0, description="Repacking size the coefficients were fitted at")
    pack_fast_bytes: float = Field(default=0.0, ge=0,
                                   description="Weights of at most these bytes whose further passes the fit priced at "
                                               "pack_fast_share of the rest's (the profile's matmul_pack_fast_mb); "
                                               "0: none")
    pack_fast_share: float | None = Field(default=None, gt=0, le=1,
                                          description="That share (the profile's matmul_pack_fast_share)")
    reference: str | None = Field(default=None, description="The reference workload timed around every configuration")
    reference_s: float | None = Field(default=None, gt=0, description="Its median time, s")
    reference_tracking: float | None = Field(
        default=None, ge=0, le=1,
        description="The exponent b of time ∝ level ** b that the configurations' passes follow the reference with "
                    "(1: exactly as it moves, 0: not at all); the normalisation divides by level ** b, and levels "
                    "are stored to that power")
    rest_tracking: float | None = Field(
        default=None, ge=0, le=1,
        description="The exponent that the work other than memory traffic follows the reference with, told apart "
                    "from the memory traffic's (memory_tracking) by each phase's share of memory traffic; None: "
                    "not told apart (reference_tracking for all)")
    memory_tracking: float | None = Field(
        default=None, ge=0, le=1,
        description="The exponent that the memory traffic (the costs per byte of memory_bandwidth_gbs and "
                    "matmul_pack_gbs) follows the reference with; None: as the rest")
    memory_reference: str | None = Field(
        default=None, description="The memory-bound workload timed right after the reference workload each time")
    memory_reference_s: float | None = Field(default=None, gt=0, description="Its median time, s")
    compute_reference: str | None = Field(
        default=None, description="The compute-bound workload timed right after the reference workload each time")
    compute_reference_s: float | None = Field(default=None, gt=0, description="Its median time, s")
    drift_pct: float | None = Field(default=None, description="Slowest pass over fastest, raw timings, percent")
    normalised_drift_pct: float | None = Field(
        default=None, description="The same after each configuration is divided by the adjacent reference, percent")
    passes: int | None = Field(default=None, ge=1, description="Round-robin passes over the configurations that were run")
    threads: int | None = Field(default=None, ge=1, description="torch threads the calibration ran with")
    in_out_rows: float | None = Field(
        default=None,
        description="Rows of the small-M slowdown that a product over a weight stored [in, out] runs without, "
                    "against the same product over a weight stored [out, in], measured by the calibration's "
                    "micro-kernels: such a product's h is max(0, matmul_half_rows - this) (profiles before "
                    "small_m_gaps)")
    small_m_gaps: SmallMGaps | None = Field(
        default=None,
        description="The small-M slowdown's gaps by weight layout and inner size that the calibration's layout "
                    "ladder measured and its fit priced the measured products with (the profile's "
                    "matmul_small_m_gaps)")
    few_rows: FewRowRatios | None = Field(
        default=None,
        description="The few-row staircase the fit priced the measured products of a few rows with (the profile's "
                    "matmul_few_rows)")
    weight_row_costs: WeightRowCosts | None = Field(
        default=None,
        description="The cost per stored weight row by the row's length that the fit priced the measured products "
                    "with (the profile's matmul_weight_row_costs; the held s_per_weight_row is the cost per row it "
                    "stands for)")
    cache_shares: CacheShares | None = Field(
        default=None,
        description="The share served from the cache by the bytes a pass touches that the fit priced the measured "
                    "phases and stored rows with (the profile's cache_shares); None: min(1, cache_bytes / bytes)")
    clock: Literal["wall", "cpu"] | None = Field(default=None, description="The clock its times were taken on")

    def layout_gaps(self) -> SmallMGaps | None:
        """``small_m_gaps``; for a record from before them, ``in_out_rows`` as the gap of every
        product over a weight stored [in, out], whatever its inner size (None: neither)."""
        if self.small_m_gaps is not None or self.in_out_rows is None:
            return self.small_m_gaps
        return SmallMGaps(inner=[1.0], out_in=[0.0], in_out=[self.in_out_rows])

    def speed_factor(self, reference_now_s: float) -> float:
        """How much longer every time takes with the reference workload at ``reference_now_s``
        instead of its calibration median: ``(now / reference_s) ** reference_tracking`` (the
        power the calibration's configurations followed the reference with; 1 when unknown).
        :meth:`speed_factors` tells the memory traffic's part apart."""
        if self.reference_s is None:
            raise ValueError("this calibration timed no reference workload")
        b = self.reference_tracking if self.reference_tracking is not None else 1.0
        return float((reference_now_s / self.reference_s) ** b)

    def speed_factors(self, reference_now_s: float, memory_now_s: float | None = None,
                      compute_now_s: float | None = None) -> tuple[float, float, float]:
        """How much longer the fixed costs and the rest, the memory traffic, and the arithmetic
        take with the reference workload at ``reference_now_s`` instead of its calibration median:
        the ratio to the powers ``rest_tracking``, ``memory_tracking`` and ``rest_tracking``; all
        :meth:`speed_factor` where the calibration did not tell the memory's apart. With the memory
        reference timed now (``memory_now_s``) and in the calibration, the memory traffic's is its
        ratio instead, in proportion, and likewise the arithmetic's with the compute reference
        (``compute_now_s``): on a shared host the memory's rate, the cores' and the rest drifted
        apart over minutes, and each side reference moved with the calibration's coefficients of
        its kind."""
        f = self.speed_factor(reference_now_s)  # raises without a reference
        apart = self.rest_tracking is not None and self.memory_tracking is not None and self.reference_s is not None
        ratio = reference_now_s / self.reference_s  # type: ignore[operator]
        rest = float(ratio ** self.rest_tracking) if apart else f  # type: ignore[operator]
        memory = float(ratio ** self.memory_tracking) if apart else f  # type: ignore[operator]
        if memory_now_s is not None and self.memory_reference_s is not None:
            memory = float(memory_now_s / self.memory_reference_s)
        compute = rest
        if compute_now_s is not None and self.compute_reference_s is not None:
            compute = float(compute_now_s / self.compute_reference_s)
        return rest, memory, compute

    @model_validator(mode="after")
    def _shapes(self) -> CalibrationRecord:
        n = len(self.params)
        if len(self.coefficients) != n or any(len(r) != n for r in self.replicates):
            raise ValueError(f"coefficients and every replicate need {n} values (one per name in params)")
        if any(len(h) != 2 for h in self.held_out):
            raise ValueError("each held_out entry is [prefill error, decode error]")
        if self.held_out_whole_family and len(self.held_out_whole_family) != len(self.held_out):
            raise ValueError(f"held_out_whole_family needs one value per held_out entry ({len(self.held_out)}), "
                             f"got {len(self.held_out_whole_family)}")
        return self


class HardwareProfile(_Strict):
    """One device (a GPU, a host CPU, a processing-in-memory chip or DIMM, ...).

    The simulation costs each operation as
    ``max(flops / (peak[dtype] * compute_efficiency), bytes / (memory_bandwidth * memory_efficiency))
    + op_overhead_s`` and its energy as ``flops * compute_pj_per_flop + bits * memory_pj_per_bit
    + static_power_w * time``. Host-link fields cost transfer points (data sent to the device
    and back through the host); a ``cpu`` profile may leave them out (it *is* the host).
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="Lower-case slug used on the CLI, e.g. h100-sxm")
    kind: DeviceKind = Field(description="gpu, cpu, pim or accelerator")
    variant: str = Field(min_length=1, description="Exact product variant the numbers describe (form factor, memory, clocks)")
    source: str = Field(min_length=1, description="Where the numbers come from (document names); say which are estimates")
    description: str = ""

    host_to_device_gbs: float | None = Field(default=None, gt=0, description="Host to device link bandwidth, GB/s (one direction)")
    host_to_device_pj_per_bit: float | None = Field(default=None, ge=0, description="Host to device transfer energy, pJ/bit")
    device_to_host_gbs: float | None = Field(default=None, gt=0, description="Device to host link bandwidth, GB/s (one direction)")
    device_to_host_pj_per_bit: float | None = Field(default=None, ge=0, description="Device to host transfer energy, pJ/bit")

    memory_bandwidth_gbs: float = Field(gt=0, description="Device memory bandwidth, GB/s")
    memory_pj_per_bit: float = Field(ge=0, description="Device memory access energy, pJ/bit")
    memory_capacity_gb: float | None = Field(
        default=None, gt=0,
        description="Device memory capacity, GB (10^9 bytes). Unset: not stated, the memory fit is not checked")

    peak_tflops: PeakTflops = Field(description="Dense peak compute per data type")
    compute_pj_per_flop: float = Field(ge=0, description="Dynamic compute energy, pJ/FLOP")

    softmax_ns_per_element: float | None = Field(default=None, ge=0, description="Softmax cost, ns/element (replaces the FLOP term)")
    activation_ns_per_element: float | None = Field(default=None, ge=0, description="SiLU/GELU cost, ns/element")
    norm_ns_per_element: float | None = Field(default=None, ge=0, description="RMSNorm/LayerNorm cost, ns/element")

    matmul_half_rows: float | None = Field(
        default=None, ge=0,
        description="Rows (tokens x batch) at which a matrix product reaches half of the compute rate; "
                    "compute time is scaled by (rows + this) / rows (with matmul_pack_rows P: from 4P rows, "
                    "below which the repacking staircase describes small products). Unset: full rate at any size")
    matmul_half_rows_in_out: float | None = Field(
        default=None, ge=0,
        description="matmul_half_rows for a matrix product whose weight is stored [in, out] (transformers' "
                    "Conv1D) instead of [out, in] (a linear layer's): a CPU kernel runs products of few rows at "
                    "another speed on each layout. Unset: matmul_half_rows for both. matmul_small_m_gaps, "
                    "where set, takes its place")
    matmul_small_m_gaps: SmallMGaps | None = Field(
        default=None,
        description="Rows taken off matmul_half_rows by the weight's layout and the product's inner size K (the "
                    "input features it sums over): a CPU kernel's speed on products of few rows depends on both "
                    "(with two threads on one x86 host, [out, in] products of R = 16-48 rows took (R + 64 to 104) / R "
                    "of their full-speed time at K <= 640, (R + 2 to 38) / R at K >= 768). Measured by perfsdk calibrate; unset: "
                    "matmul_half_rows_in_out, else matmul_half_rows for every product")
    matmul_few_rows: FewRowRatios | None = Field(
        default=None,
        description="A matrix product of 2 rows up to the last count of rows costs its one-row time "
                    "(max(compute, memory) and the cost per stored weight row, priced at one row) times the ratio "
                    "this staircase gives at its rows and weight size, in place of the small-M slowdown and the "
                    "repacking passes. Measured by perfsdk calibrate; unset: matmul_half_rows and matmul_pack_rows "
                    "price every product")
    matmul_ns_per_weight_row: float | None = Field(
        default=None, ge=0,
        description="Fixed cost of each row of a matrix product's weight as stored (the output features of a "
                    "linear layer, the input features of a Conv1D, experts reached x input features of a grouped "
                    "expert product), ns, added to its time on top of max(compute, memory): a CPU "
                    "matrix-vector kernel pays it per stored row besides streaming the bytes from memory "
                    "(with cache_mb, only on the share of the weight not served from the cache). Unset: none")
    matmul_weight_row_costs: WeightRowCosts | None = Field(
        default=None,
        description="The cost of each stored weight row by the row's length in bytes (the weight's bytes over its "
                    "stored rows), in place of matmul_ns_per_weight_row, on the same products and share of the "
                    "weight: a CPU matrix-vector kernel streams short rows slower than long ones, not in "
                    "proportion to the rows. Measured by perfsdk calibrate; unset: matmul_ns_per_weight_row for "
                    "every row")
    matmul_pack_rows: float | None = Field(
        default=None, ge=1,
        description="P: matrix products with at least this many rows repack their weights and stream them "
                    "once per block of P rows (ceil(rows / P) more passes over them up to 4P - 1 rows, one from "
                    "4P rows, when the blocked kernel keeps them in cache), at matmul_pack_gbs (CPU BLAS). "
                    "Unset: none")
    matmul_pack_gbs: float | None = Field(default=None, gt=0,
                                          description="Rate at which weights are repacked, GB/s (see matmul_pack_rows)")
    matmul_pack_fast_mb: float | None = Field(
        default=None, gt=0,
        description="A matrix product's weight (one expert's, of a grouped product) of at most this many MB stays in "
                    "the cores' own caches after the product's first pass over it, and its further passes "
                    "(matmul_pack_rows) take matmul_pack_fast_share of the time matmul_pack_gbs gives them. Measured "
                    "by perfsdk calibrate (the level-2 cache of one core times the threads); unset: every weight at "
                    "matmul_pack_gbs")
    matmul_pack_fast_share: float | None = Field(
        default=None, gt=0, le=1,
        description="The share of matmul_pack_gbs's time that a further pass over a weight of at most "
                    "matmul_pack_fast_mb takes (measured by perfsdk calibrate: the extra time of a staircase of "
                    "products of 1-8 rows over such a weight, against the same over a larger one)")
    fresh_write_gbs: float | None = Field(
        default=None, gt=0,
        description="Rate, GB/s, at which a decode step writes an output that outgrows every buffer freed before "
                    "it (the KV cache concatenated one position longer each step, tensors of 128 KiB and more): "
                    "the allocator maps new pages and each is faulted in on its first write, on top of the "
                    "bytes' own time. Set by perfsdk calibrate; unset: none (a caching allocator, a static cache)")
    cache_mb: float | None = Field(
        default=None, gt=0,
        description="Cache that holds the weights and KV cache of a forward pass, MB (10^6 bytes): a pass "
                    "touching R bytes gets min(1, cache/R) of its bytes at cache_bandwidth_gbs, the rest at "
                    "the memory bandwidth (cache_shares, where set, gives that share instead). Unset: all bytes at "
                    "the memory bandwidth")
    cache_shares: CacheShares | None = Field(
        default=None,
        description="The share of a pass's bytes served from the cache by the bytes it touches, in place of "
                    "min(1, cache/R), on the bytes and on the stored rows alike: a pass that cycles through more "
                    "than the cache can keep less of it than that ratio. Measured by perfsdk calibrate; needs "
                    "cache_mb")
    cache_bandwidth_gbs: float | None = Field(default=None, gt=0, description="Cache bandwidth, GB/s (see cache_mb)")
    static_power_w: float = Field(default=0.0, ge=0, description="Static (idle) power, W")
    compute_efficiency: float = Field(default=1.0, gt=0, le=1, description="Achieved fraction of peak compute")
    memory_efficiency: float = Field(default=1.0, gt=0, le=1, description="Achieved fraction of memory bandwidth")
    op_overhead_s: float = Field(default=0.0, ge=0, description="Fixed cost per operation (kernel launch, dispatch), s")
    launch_overhead_s: float = Field(default=0.0, ge=0,
                                     description="Fixed cost of each further kernel call an operation stands for "
                                                 "beyond its first (an eager RMSNorm is six calls), s")
    call_overhead_s: float | None = Field(
        default=None, ge=0,
        description="Fixed cost of each ATen call a model's code makes that runs a kernel (the Python and "
                    "dispatcher time around it; views and other calls that move no bytes are free), s. Set by perfsdk calibrate: it then replaces "
                    "op_overhead_s and launch_overhead_s, and predictions count the calls of the model's own code "
                    "(captured on the meta device). Unset: op_overhead_s and launch_overhead_s")
    prefill_call_overhead_s: float | None = Field(
        default=None, ge=0,
        description="With call_overhead_s: the fixed cost of each such call in a pass over a whole input (the "
                    "prefill, an encoder's pass, a single forward), where its tensors are the prompt's, s. Set by "
                    "perfsdk calibrate. Unset: call_overhead_s")
    step_overhead_s: float = Field(default=0.0, ge=0, description="Fixed cost per forward pass (framework, sampling), s")
    prefill_overhead_s: float = Field(default=0.0, ge=0,
                                      description="Fixed cost once per generate call, in the prefill (input "
                                                  "preparation, cache set-up), s")
    decode_warmup_steps: float = Field(default=0.0, ge=0,
                                       description="How many steady decode steps the first decode steps of a "
                                                   "generate call take beyond their own count (they run slower "
                                                   "after the prefill and settle): a decode of n steps takes "
                                                   "1 + k/n times n steady steps, so a TPOT over few new tokens "
                                                   "carries more of it. Set by perfsdk calibrate")
    calibration: CalibrationRecord | None = Field(
        default=None,
        description="Written by perfsdk calibrate: what the fit needs to put an interval on its predictions. "
                    "Unset: the profile is a spec sheet or a hand-written file, and predictions carry no interval")

    @model_validator(mode="after")
    def _link(self) -> HardwareProfile:
        if self.kind != "cpu":
            missing = [f for f in ("host_to_device_gbs", "host_to_device_pj_per_bit", "device_to_host_gbs",
                                   "device_to_host_pj_per_bit") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"a {self.kind} profile needs the host link: missing {', '.join(missing)}")
        return self

    # -- helpers used by the cost model -------------------------------------------------------

    def dtype_key(self, dtype: str) -> str:
        """The ``peak_tflops`` key used for ``dtype`` (a torch dtype name or a key).

        Falls back to a related type the device has (bf16 <-> fp16, fp32 <-> tf32, int4 -> int8
        ...), and raises :class:`HardwareProfileError` when none fits.
        """
        d = dtype.removeprefix("torch.").lower()
        key = DTYPE_KEYS.get(d)
        if key is None:
            raise HardwareProfileError(f"profile {self.name}: unknown data type {dtype!r}")
        avail = self.peak_tflops.available()
        if key in avail:
            return key
        for alt in _DTYPE_FALLBACK.get(key, ()):
            if alt in avail:
                return alt
        raise HardwareProfileError(
            f"profile {self.name}: no peak_tflops for {key} (has: {', '.join(sorted(avail))})"
        )

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (before the efficiency factor)."""
        return float(getattr(self.peak_tflops, self.dtype_key(dtype))) * 1e12

    def effective_flops(self, dtype: str) -> float:
        """Achievable FLOP/s for ``dtype``: peak times ``compute_efficiency``."""
        return self.peak_flops(dtype) * self.compute_efficiency

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        """Achievable memory bandwidth in bytes/s: peak times ``memory_efficiency``."""
        return self.memory_bandwidth_gbs * 1e9 * self.memory_efficiency

    @property
    def memory_capacity_bytes(self) -> int | None:
        """Capacity in bytes, ``None`` when the profile does not state it."""
        return int(self.memory_capacity_gb * 1e9) if self.memory_capacity_gb is not None else None

    @property
    def peak_assumed(self) -> bool:
        """True when both efficiency factors are 1.0: the device is costed at its peak."""
        return self.compute_efficiency == 1.0 and self.memory_efficiency == 1.0

    @property
    def has_host_link(self) -> bool:
        """False for the host itself: transfers through the host cost nothing."""
        return self.host_to_device_gbs is not None and self.device_to_host_gbs is not None

    def slower_by(self, factor: float, memory_factor: float | None = None,
                  compute_factor: float | None = None) -> HardwareProfile:
        """The same device with every time it prices ``factor`` times as long: each rate
        (``*_gbs``, ``peak_tflops``) divided by ``factor``, each fixed or per-element cost (``*_s``,
        ``*_ns_per_*``) multiplied by it; sizes, energies per bit or FLOP and power unchanged.
        ``memory_factor`` (default ``factor``) takes the place of ``factor`` for the memory
        traffic: the rates of :data:`MEMORY_RATES` and the calibration's coefficients of them.
        A calibration record's coefficients (all seconds per unit) and reference time follow, so
        the intervals keep their relative width. Used to bring a calibrated host to its speed of
        the moment (the reference workload timed again)."""
        mf = factor if memory_factor is None else memory_factor
        cf = factor if compute_factor is None else compute_factor
        if factor <= 0 or mf <= 0 or cf <= 0:
            raise ValueError(f"profile {self.name}: a speed factor must be positive, got {factor}, {mf} and {cf}")
        update: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None or isinstance(value, bool):
                continue
            if name.endswith("_gbs"):
                update[name] = value / (mf if name in MEMORY_RATES else factor)
            elif name.endswith("_s") or "_ns_per_" in name:
                update[name] = value * factor
        update["peak_tflops"] = PeakTflops(**{k: v / cf for k, v in self.peak_tflops.available().items()})
        cal = self.calibration
        if cal is not None:
            per = [mf if p in MEMORY_COEFFICIENTS else cf if p in COMPUTE_COEFFICIENTS else factor for p in cal.params]
            update["calibration"] = cal.model_copy(update={
                "coefficients": [c * f for c, f in zip(cal.coefficients, per)],
                "replicates": [[c * f for c, f in zip(r, per)] for r in cal.replicates],
                "reference_s": cal.reference_s * factor if cal.reference_s is not None else None,
                "memory_reference_s": cal.memory_reference_s * mf if cal.memory_reference_s is not None else None,
                "compute_reference_s": cal.compute_reference_s * cf if cal.compute_reference_s is not None else None})
        return self.model_copy(update=update)


def format_validation_error(err: ValidationError, origin: str) -> str:
    """``origin: field.path: message; ...`` with ``unknown key`` for extra fields."""
    from perfsdk.errors import format_validation_error as _format

    return f"{origin}: invalid hardware profile: " + _format(err, model=HardwareProfile)


def parse_profile(data: Any, origin: str = "<profile>") -> HardwareProfile:
    """Validate a mapping (or pass a :class:`HardwareProfile` through); errors name the field."""
    if isinstance(data, HardwareProfile):
        return data
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{origin}: expected a mapping, got {type(data).__name__}")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as err:
        raise HardwareProfileError(format_validation_error(err, origin)) from None


def read_profile_file(path: str | Path) -> tuple[list[HardwareProfile], bool]:
    """The profiles of a YAML file and whether it is a device-keyed file (see
    :func:`load_profile_file`)."""
    from perfsdk.hardware.devicefile import is_device_file, parse_device_file
    from perfsdk.yamlio import read_yaml

    p = Path(path)
    data = read_yaml(p, what="hardware profile file", error=HardwareProfileError)
    if isinstance(data, dict) and set(data) == {"profiles"}:
        items = data["profiles"]
        if not isinstance(items, list):
            raise HardwareProfileError(f"{p}: profiles: expected a list")
        return [parse_profile(item, f"{p}: profiles.{i}") for i, item in enumerate(items)], False
    if is_device_file(data):
        return parse_device_file(data, str(p)), True
    return [parse_profile(data, str(p))], False


def load_profile_file(path: str | Path) -> list[HardwareProfile]:
    """Read one YAML file: a profile mapping, ``profiles: [...]`` with several, or a device-keyed
    file (device name -> figures, see :mod:`perfsdk.hardware.devicefile`) with one or more."""
    return read_profile_file(path)[0]


def profiles_to_yaml(profiles: list[HardwareProfile]) -> str:
    """One profile as a mapping, several as ``profiles: [...]`` (both load with
    :func:`load_profile_file`)."""
    if len(profiles) == 1:
        return profile_to_yaml(profiles[0])
    docs = [p.model_dump(mode="json", exclude_none=True) for p in profiles]
    return yaml.safe_dump({"profiles": docs}, sort_keys=False)


def profile_to_yaml(profile: HardwareProfile) -> str:
    """The profile as YAML, unset optional fields left out."""
    return yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False)

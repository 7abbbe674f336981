"""The predictor: cost a list of operations on one or several devices, per phase and per layer.

Execution is modelled as sequential (each op waits for the previous one, as in autoregressive
decoding with batch-synchronous layers): the phase time is the sum of op times, transfer points
and a per-forward-pass overhead. Phase energy is the dynamic energy of every op and transfer plus
the static power of every device in the mapping over the whole phase.

Phases: ops of ``generate`` give ``prefill`` and ``decode`` (TTFT, TPOT, tokens/s); ops of a plain
forward call of any module (``s.forward``) give ``forward`` (time and energy per forward pass).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from perfsdk.hardware.catalog import Catalog, normalize_name
from perfsdk.hardware.profile import CalibrationRecord, HardwareProfile
from perfsdk.capture.ops import OpRecord
from perfsdk.simulation.costmodel import (activation_in_bytes, activation_out_bytes, cost_op, op_bytes,
                                          resident_bytes, transfer_cost, warmup_factor)
from perfsdk.simulation.mapping import Mapping, MappingError
from perfsdk.simulation.uncertainty import bagged_factors, replicate_ratios

if TYPE_CHECKING:
    import numpy as np

PhaseName = Literal["encode", "prefill", "decode", "forward"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PhasePrediction(_Frozen):
    """Predicted time and energy of one phase (all its steps together)."""

    time_s: float
    energy_j: float
    avg_power_w: float | None
    steps: float = Field(description="Forward passes in the phase (weighted when decode steps are sampled)")
    compute_s: float = 0.0
    memory_s: float = 0.0
    transfer_s: float = 0.0
    overhead_s: float = 0.0
    flops: float = 0.0
    bytes_moved: float = 0.0
    bound: str = "memory"
    time_s_low: float | None = Field(default=None, description="Lower bound of the interval on time_s (calibrated "
                                     "profiles; see SimulationResult.interval_level)")
    time_s_high: float | None = None


class LayerPrediction(_Frozen):
    """One module in one phase: its predicted time (summed over the phase's steps) and bound."""

    name: str
    phase: PhaseName
    device: str
    time_s: float
    share_pct: float
    energy_j: float
    bound: str
    compute_s: float
    memory_s: float
    transfer_s: float
    flops: float
    bytes_moved: float
    ops: int


class DevicePrediction(_Frozen):
    """One device instance: what it holds and whether that fits."""

    name: str
    profile: str
    busy_s: float
    weight_bytes: int
    kv_cache_bytes: int
    capacity_bytes: int | None = Field(description="None: the profile does not state its capacity")
    fits_in_memory: bool | None = Field(description="None: not checked (capacity not stated)")
    compute_efficiency: float = Field(default=1.0, description="Fraction of peak compute assumed")
    memory_efficiency: float = Field(default=1.0, description="Fraction of peak memory bandwidth assumed")
    peak_assumed: bool = Field(default=True, description="Both efficiencies are 1.0: costed at the device's peak")


class IntervalTerm(_Frozen):
    """One source of a predicted time's interval on its own, the other two held at the prediction:
    the central share (the interval's level) of the measurements that source alone allows, each
    bound over the prediction. Which source widens an interval most says what would narrow it."""

    low: float = Field(description="The lower bound over the prediction (0.8: 20 % below)")
    high: float = Field(description="The upper bound over the prediction (1.25: 25 % above)")


class SimulationResult(_Frozen):
    """Predicted performance of a workload on a device (or a mapping of devices)."""

    hardware: str
    devices: list[DevicePrediction]
    model: str | None = None
    op_source: str = Field(description="captured (ops of a real run) or analytic (from the model config)")
    dtype: str | None = None
    batch_size: int
    input_tokens: int | None = None
    output_tokens: int
    ttft_s: float | None = Field(description="Prefill time (generate ops); None for forward ops")
    tpot_s: float | None
    output_tokens_per_s: float | None = Field(description="None for forward ops (no tokens generated)")
    e2e_s: float
    energy_j: float
    energy_j_per_output_token: float | None = Field(description="None for forward ops")
    forward_s: float | None = Field(default=None, description="Time of one forward pass (forward ops)")
    energy_j_per_forward: float | None = Field(default=None, description="Energy of one forward pass (forward ops)")
    fits_in_memory: bool | None = Field(description="None: some device does not state its capacity")
    memory_required_bytes: int
    phases: dict[str, PhasePrediction]
    layers: list[LayerPrediction]
    categories: dict[str, dict[str, float]] = Field(default_factory=dict, description="phase -> category -> time_s")
    notes: list[str] = Field(default_factory=list)
    origin: str = Field(default="user file", description="What the times rest on: calibrated (on a host, with an "
                        "interval), spec sheet (catalogue figures and efficiency estimates) or user file")
    origin_detail: str = Field(default="", description="The origin as a sentence (host and date of a calibration)")
    energy_origin: str = Field(default="", description="What the energy figures rest on (never calibrated by timing)")
    interval_level: float | None = Field(default=None, description="Coverage of the *_low/*_high bounds (0.9: 90 %); "
                                         "None: no interval")
    interval_note: str | None = Field(default=None, description="Why there is no interval, when there is none")
    interval_basis: str | None = Field(default=None, description="Which of the calibration's held-out errors the "
                                       "interval's model error draws on (by the model's family)")
    interval_terms: dict[str, dict[str, IntervalTerm]] = Field(
        default_factory=dict, description="By metric (ttft_s, tpot_s, e2e_s, forward_s), then by source "
        "(coefficients: the calibration's bootstrap refits; model_error: its cost model's errors on models left "
        "out of the fit; run: how far one run strays on the machine): the interval that source alone gives, "
        "the others held at the prediction; empty without an interval")
    ttft_s_low: float | None = None
    ttft_s_high: float | None = None
    tpot_s_low: float | None = None
    tpot_s_high: float | None = None
    e2e_s_low: float | None = None
    e2e_s_high: float | None = None
    output_tokens_per_s_low: float | None = None
    output_tokens_per_s_high: float | None = None
    forward_s_low: float | None = None
    forward_s_high: float | None = None

    def interval(self, metric: str) -> tuple[float, float] | None:
        """``(low, high)`` of ``metric`` (``ttft_s``, ``tpot_s``, ``e2e_s``, ``output_tokens_per_s``,
        ``forward_s``), or None without an interval."""
        lo, hi = getattr(self, f"{metric}_low", None), getattr(self, f"{metric}_high", None)
        return None if lo is None or hi is None else (lo, hi)


@dataclass
class _Acc:
    time_s: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    transfer_s: float = 0.0
    overhead_s: float = 0.0
    dyn_j: float = 0.0
    energy_j: float = 0.0
    flops: float = 0.0
    bytes_moved: float = 0.0
    ops: int = 0
    device: str = ""

    def bound(self) -> str:
        if self.transfer_s > max(self.compute_s, self.memory_s):
            return "transfer"
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass
class _DevState:
    profile: HardwareProfile
    busy_s: float = 0.0
    weights: dict[str, int] = field(default_factory=dict)
    kv: dict[str, int] = field(default_factory=dict)


def _phase_of(op: OpRecord) -> PhaseName:
    if op.phase in ("encode", "decode", "forward"):
        return op.phase
    return "prefill"


def _all_fit(flags: list[bool | None]) -> bool | None:
    """False if any device overflows, None if some fit is unknown, else True."""
    if any(f is False for f in flags):
        return False
    return None if any(f is None for f in flags) else True


class Simulator:
    """Costs op lists on a default device plus the devices of an optional mapping."""

    def __init__(self, hardware: HardwareProfile, mapping: Mapping | None = None,
                 catalog: Catalog | None = None) -> None:
        self.mapping = mapping or Mapping()
        self.profiles: dict[str, HardwareProfile] = {}
        cat = catalog
        for dev, prof_name in self.mapping.devices.items():
            if prof_name == hardware.name:
                self.profiles[dev] = hardware
                continue
            cat = cat or Catalog.load()
            self.profiles[dev] = cat.get(prof_name)
        self.default_device = self.mapping.default or hardware.name
        if self.default_device not in self.profiles:
            self.profiles[self.default_device] = hardware
        # rule device name -> device instance, where they differ (a rule naming the default
        # device's profile in other spelling, PIM_AI_1chip for pim-ai-1chip, is that device)
        self._alias: dict[str, str] = {}
        for rule in self.mapping.layers:
            if rule.device in self.profiles or rule.device in self._alias:
                continue
            # a rule may name a profile directly: one device instance of that profile
            cat = cat or Catalog.load()
            if rule.device not in cat:
                raise MappingError(
                    f"mapping: layers: device {rule.device!r} is neither in devices nor a hardware profile "
                    f"(available: {', '.join(cat.names())})"
                )
            prof = cat.get(rule.device)
            same = next((d for d in self.profiles if normalize_name(d) == prof.name), None)
            if same is not None and self.profiles[same].name == prof.name:
                self._alias[rule.device] = same
            else:
                self.profiles[rule.device] = prof
        self.hardware = hardware

    def device_of(self, module_path: str) -> tuple[str, Any]:
        """(device instance, matching rule or None) of the ops of ``module_path``."""
        dev, rule = self.mapping.resolve(module_path)
        dev = dev or self.default_device
        return self._alias.get(dev, dev), rule

    def predict(self, ops: list[OpRecord], *, batch_size: int | None = None, input_tokens: int | None = None,
                step_weights: dict[int, float] | None = None, dtype: str | None = None, top_n: int = 10,
                model: str | None = None, op_source: str = "captured",
                kv_cache_bytes: int | None = None, weight_bytes: int | None = None,
                family: str | None = None) -> SimulationResult:
        """Predict TTFT, TPOT, throughput, energy and memory fit for ``ops``.

        ``step_weights`` gives how many real steps each step index stands for (sampled decode
        steps); ``dtype`` overrides the ops' dtype for peak lookup; ``kv_cache_bytes`` replaces
        the KV size read off the ops (the largest ``kv_bytes`` per attention module);
        ``weight_bytes`` (the model's total) replaces the weights read off the ops for the
        default device (captured embedding lookups only report the rows they gather).
        ``family``: the model's type (``config.model_type``), which decides the model error its
        interval draws on (:func:`~perfsdk.simulation.uncertainty.model_errors`; None: a family
        the calibration did not measure).
        """
        if not ops:
            raise ValueError("no operations to simulate")
        if op_source != "analytic":
            ops = as_module_calls(ops)
        devs = {name: _DevState(p) for name, p in self.profiles.items()}
        present = {_phase_of(op) for op in ops}
        names: list[PhaseName] = []
        if "encode" in present:
            names.append("encode")
        if present & {"prefill", "decode"}:
            names += ["prefill", "decode"]
        if "forward" in present:
            names.append("forward")
        phases: dict[PhaseName, _Acc] = {ph: _Acc() for ph in names}
        steps: dict[PhaseName, dict[int, float]] = {ph: {} for ph in names}
        layers: dict[tuple[str, PhaseName], _Acc] = defaultdict(_Acc)
        cats: dict[PhaseName, dict[str, float]] = {ph: defaultdict(float) for ph in names}
        sent_groups: set[tuple[str, str, int]] = set()
        # weights + KV cache each forward pass touches on each device (for profiles with a cache)
        resident: dict[tuple[str, str, int], float] = defaultdict(float)
        if any(p.cache_mb for p in self.profiles.values()):
            for op in ops:
                dev = self.device_of(op.module_path)[0]
                resident[(dev, op.phase, op.step)] += resident_bytes(op)

        by_phase: dict[str, list[OpRecord]] = defaultdict(list)
        for op in ops:
            by_phase[_phase_of(op)].append(op)
        ratios = self._replicate_ratios(by_phase, step_weights)
        # a calibrated profile predicts each phase's time as the median over its bootstrap refits
        # (:func:`~perfsdk.simulation.uncertainty.bagged_factors`): every op's time scaled alike
        factor = bagged_factors(ratios) if ratios else {}

        for op in ops:
            ph = _phase_of(op)
            w = step_weights.get(op.step, 1.0) if step_weights else 1.0
            w_t = w * factor.get(ph, 1.0)
            steps[ph][op.step] = w
            dev_name, rule = self.device_of(op.module_path)
            st = devs[dev_name]
            prof = st.profile
            c = cost_op(op, prof, dtype, resident.get((dev_name, op.phase, op.step)))
            if rule is not None and rule.transfer == "t":
                c.transfer_s, c.transfer_energy_j = transfer_cost(prof, activation_in_bytes(op), activation_out_bytes(op))
            elif rule is not None and rule.transfer == "m":
                key = (rule.group or rule.match, op.phase, op.step)
                h2d = 0 if key in sent_groups else activation_in_bytes(op)
                sent_groups.add(key)
                c.transfer_s, c.transfer_energy_j = transfer_cost(prof, h2d, activation_out_bytes(op))
            t = c.time_s * w_t
            nbytes = op_bytes(op) * w
            for acc in (phases[ph], layers[(op.module_path, ph)]):
                acc.time_s += t
                acc.compute_s += c.compute_s * w_t
                acc.memory_s += (c.memory_s + c.serial_s + c.pack_s + c.alloc_s) * w_t
                acc.transfer_s += c.transfer_s * w_t
                acc.overhead_s += c.overhead_s * w_t
                acc.dyn_j += c.dynamic_energy_j * w
                acc.energy_j += c.energy_j * w
                acc.flops += op.flops * w
                acc.bytes_moved += nbytes
                acc.ops += 1
            layers[(op.module_path, ph)].device = dev_name
            cats[ph][op.category] += t
            st.busy_s += t
            if op.weight_bytes:
                st.weights[op.module_path] = max(st.weights.get(op.module_path, 0), op.weight_bytes)
            if op.kv_bytes and op.category == "attention":
                st.kv[op.module_path] = max(st.kv.get(op.module_path, 0), op.kv_bytes)

        static_w = sum(p.profile.static_power_w for p in devs.values())
        step_overhead = self.profiles[self.default_device].step_overhead_s
        prefill_overhead = self.profiles[self.default_device].prefill_overhead_s
        decode_warmup = self.profiles[self.default_device].decode_warmup_steps
        out_phases: dict[str, PhasePrediction] = {}
        for ph, acc in phases.items():
            n_steps = sum(steps[ph].values())
            if ph == "encode" and not n_steps:
                continue  # a model without an encoder or vision tower has no encode phase
            overhead = (step_overhead * n_steps + (prefill_overhead if ph == "prefill" and n_steps else 0.0)
                        ) * factor.get(ph, 1.0)
            time_s = acc.time_s + overhead
            if ph == "decode":
                # the first steps run slower than the steady ones the costs above price
                warm = time_s * (warmup_factor(decode_warmup, n_steps) - 1.0)
                time_s, overhead = time_s + warm, overhead + warm
            energy = acc.dyn_j + static_w * time_s
            out_phases[ph] = PhasePrediction(
                time_s=time_s, energy_j=energy, avg_power_w=energy / time_s if time_s > 0 else None,
                steps=n_steps, compute_s=acc.compute_s, memory_s=acc.memory_s, transfer_s=acc.transfer_s,
                overhead_s=acc.overhead_s + overhead, flops=acc.flops, bytes_moved=acc.bytes_moved,
                bound=acc.bound(),
            )

        notes: list[str] = []
        if batch_size is None:
            first = ops[0].input_shapes[0] if ops[0].input_shapes else (1,)
            batch_size = int(first[0]) if first else 1
            notes.append(f"batch size {batch_size} read from the first op's input shape")
        generates = "prefill" in out_phases
        n_decode = out_phases["decode"].steps if generates else 0.0
        has_prefill = generates and out_phases["prefill"].steps > 0
        gen_per_seq = n_decode + (1 if has_prefill else 0)
        encode_s = out_phases["encode"].time_s if "encode" in out_phases else 0.0
        e2e = sum(ph.time_s for ph in out_phases.values())
        energy = sum(ph.energy_j for ph in out_phases.values())
        out_tokens = batch_size * gen_per_seq
        fwd = out_phases.get("forward")
        n_fwd = fwd.steps if fwd is not None else 0.0

        if kv_cache_bytes is not None:
            total_kv = sum(sum(st.kv.values()) for st in devs.values()) or 1
            for st in devs.values():
                share = sum(st.kv.values()) / total_kv
                st.kv = {"_": int(kv_cache_bytes * share)} if st.kv else {}
            if not any(st.kv for st in devs.values()):
                devs[self.default_device].kv = {"_": kv_cache_bytes}
        if weight_bytes is not None:
            mapped = sum(sum(st.weights.values()) for n, st in devs.items() if n != self.default_device)
            devs[self.default_device].weights = {"_": max(0, weight_bytes - mapped)}
        dev_out = []
        for name, st in devs.items():
            wb, kvb = sum(st.weights.values()), sum(st.kv.values())
            cap = st.profile.memory_capacity_bytes
            dev_out.append(DevicePrediction(
                name=name, profile=st.profile.name, busy_s=st.busy_s, weight_bytes=wb, kv_cache_bytes=kvb,
                capacity_bytes=cap, fits_in_memory=None if cap is None else wb + kvb <= cap,
                compute_efficiency=st.profile.compute_efficiency, memory_efficiency=st.profile.memory_efficiency,
                peak_assumed=st.profile.peak_assumed))
        unknown = [d.name for d in dev_out if d.capacity_bytes is None]
        if unknown:
            notes.append(f"memory fit not checked on {', '.join(unknown)}: the profile states no capacity")

        layer_rows = []
        for ph in names:
            if ph not in out_phases:
                continue
            total = out_phases[ph].time_s or 1.0
            rows = sorted(((k, a) for k, a in layers.items() if k[1] == ph), key=lambda kv: -kv[1].time_s)
            for (name, _), a in rows[: max(0, top_n)]:
                layer_rows.append(LayerPrediction(
                    name=name, phase=ph, device=a.device, time_s=a.time_s, share_pct=100.0 * a.time_s / total,
                    energy_j=a.energy_j, bound=a.bound(), compute_s=a.compute_s, memory_s=a.memory_s,
                    transfer_s=a.transfer_s, flops=a.flops, bytes_moved=a.bytes_moved, ops=a.ops))

        if factor:
            n_reps = max(len(r) for r in ratios.values())
            moved = ", ".join(f"{ph} {100 * (f - 1):+.1f} %" for ph, f in factor.items() if ph in out_phases)
            notes.append(f"times are the median of the calibration's {n_reps} bootstrap refits' predictions "
                         f"(against its central fit: {moved})")
        bounds_ = self._interval(by_phase, out_phases, step_weights, n_decode, out_tokens, n_fwd, family, ratios)
        for ph, (lo, hi) in bounds_.pop("phase_bounds", {}).items():
            out_phases[ph] = out_phases[ph].model_copy(update={"time_s_low": lo, "time_s_high": hi})
        return SimulationResult(
            **bounds_,
            hardware=self.hardware.name if len(self.profiles) == 1 else
            ", ".join(d if normalize_name(d) == p.name else f"{d}={p.name}" for d, p in self.profiles.items()),
            devices=dev_out,
            model=model,
            op_source=op_source,
            dtype=dtype or ops[0].dtype,
            batch_size=batch_size,
            input_tokens=input_tokens,
            output_tokens=int(round(gen_per_seq)),
            ttft_s=encode_s + out_phases["prefill"].time_s if generates else None,
            tpot_s=out_phases["decode"].time_s / n_decode if n_decode > 0 else None,
            output_tokens_per_s=(out_tokens / e2e if e2e > 0 else 0.0) if generates else None,
            e2e_s=e2e,
            energy_j=energy,
            energy_j_per_output_token=(energy / out_tokens if out_tokens else 0.0) if generates else None,
            forward_s=fwd.time_s / n_fwd if fwd is not None and n_fwd > 0 else None,
            energy_j_per_forward=fwd.energy_j / n_fwd if fwd is not None and n_fwd > 0 else None,
            fits_in_memory=_all_fit([d.fits_in_memory for d in dev_out]),
            memory_required_bytes=sum(d.weight_bytes + d.kv_cache_bytes for d in dev_out),
            phases=out_phases,
            layers=layer_rows,
            categories={ph: dict(v) for ph, v in cats.items() if ph in out_phases},
            notes=notes,
        )

    def _unique_profiles(self) -> list[HardwareProfile]:
        """The profiles the devices use, each once."""
        return list({id(p): p for p in self.profiles.values()}.values())

    def _calibration(self) -> CalibrationRecord | None:
        """The calibration record of the one profile every device uses (None: none, or several profiles)."""
        profiles = self._unique_profiles()
        return profiles[0].calibration if len(profiles) == 1 else None

    def _replicate_ratios(self, by_phase: dict[str, list[OpRecord]],
                          step_weights: dict[int, float] | None) -> dict[str, np.ndarray]:
        """Each phase's cost under every bootstrap refit over the central fit's, where one calibrated
        profile with refits prices every op ({} otherwise)."""
        cal = self._calibration()
        if cal is None or not cal.replicates:
            return {}
        return replicate_ratios(cal, dict(by_phase), step_weights)

    def _interval(self, by_phase: dict[str, list[OpRecord]], phases: dict[str, PhasePrediction],
                  step_weights: dict[int, float] | None, n_decode: float, out_tokens: float,
                  n_fwd: float, family: str | None = None,
                  ratios: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Origin fields, and the interval bounds where every device is calibrated
        (:mod:`perfsdk.simulation.uncertainty`; ``ratios``: each phase's bootstrap refits over the
        central fit, already computed)."""
        from perfsdk.simulation.uncertainty import bounds, no_interval_reason, origin_text, profile_origin

        profiles = self._unique_profiles()
        origins = {profile_origin(p) for p in profiles}
        out: dict[str, Any] = {
            "origin": origins.pop() if len(origins) == 1 else "mixed",
            "origin_detail": "; ".join(f"{p.name}: {origin_text(p)}" for p in profiles),
            "energy_origin": "; ".join(
                f"{p.name}: " + ("energy figures copied from host-cpu (estimates; timing cannot measure them)"
                                 if p.calibration is not None else f"{origin_text(p)}") for p in profiles),
        }
        reason = no_interval_reason(profiles)
        if reason is None and len(profiles) > 1:
            reason = "no interval: the mapping spreads the work over several devices (one calibration each)"
        if reason is not None:
            out["interval_note"] = reason
            return out
        import numpy as np

        from perfsdk.simulation.uncertainty import INTERVAL_TERMS, model_error_basis, time_interval_samples

        cal = profiles[0].calibration
        assert cal is not None
        out["interval_basis"] = model_error_basis(cal, family)
        times = {ph: p.time_s for ph, p in phases.items()}
        priced = [ph for ph in times if by_phase.get(ph)]
        ops = {ph: by_phase[ph] for ph in priced}
        kept = {ph: ratios[ph] for ph in priced} if ratios else None

        def metrics(terms: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            smp = time_interval_samples(cal, ops, times, step_weights, family=family, ratios=kept,
                                        terms=terms).phases
            return smp, _metric_samples(smp, n_decode, out_tokens, n_fwd)

        level = cal.level
        smp, every = metrics(INTERVAL_TERMS)
        out["interval_level"] = level
        out["phase_bounds"] = {ph: bounds(v, level) for ph, v in smp.items()}
        for metric, values in every.items():
            out[f"{metric}_low"], out[f"{metric}_high"] = bounds(values, level)
        # each source on its own, as factors of the prediction: what widens the interval most
        point = _metric_samples({ph: np.array([t]) for ph, t in times.items() if ph in smp}, n_decode, out_tokens,
                                n_fwd)
        alone = {term: metrics((term,))[1] for term in INTERVAL_TERMS}
        out["interval_terms"] = {
            metric: {term: IntervalTerm(low=lo / float(point[metric][0]), high=hi / float(point[metric][0]))
                     for term in INTERVAL_TERMS for lo, hi in [bounds(alone[term][metric], level)]}
            for metric in TERM_METRICS if metric in every and float(point[metric][0]) > 0}
        return out


#: the predicted times whose interval :attr:`SimulationResult.interval_terms` breaks down by source
TERM_METRICS = ("ttft_s", "tpot_s", "e2e_s", "forward_s")


def _metric_samples(smp: dict[str, np.ndarray], n_decode: float, out_tokens: float,
                    n_fwd: float) -> dict[str, np.ndarray]:
    """The possible values of each predicted metric from the possible times of its phases (the
    samples of one combination of sources taken together across phases)."""
    out: dict[str, np.ndarray] = {}
    if "prefill" in smp:
        ttft = smp["prefill"] + smp.get("encode", 0.0)
        e2e = ttft + smp.get("decode", 0.0)
        out["ttft_s"], out["e2e_s"] = ttft, e2e
        if n_decode > 0 and "decode" in smp:
            out["tpot_s"] = smp["decode"] / n_decode
        if out_tokens:
            out["output_tokens_per_s"] = out_tokens / e2e
    if "forward" in smp and n_fwd > 0:
        out["forward_s"] = smp["forward"] / n_fwd
        if "prefill" not in smp:
            out["e2e_s"] = smp["forward"]
    return out


def as_module_calls(ops: list[OpRecord]) -> list[OpRecord]:
    """Captured ATen ops costed as the module calls they come from.

    A profile's ``op_overhead_s`` is the fixed cost of one operation as the analytic generator
    writes it (a linear layer, a normalisation, a rotary embedding: one module-level call of
    Python and framework code) and ``launch_overhead_s`` that of each further kernel call it
    makes. A capture sees every kernel call on its own; consecutive calls of one module in one
    forward pass are one such operation: the first stands for all of them (``launches`` the
    count), the others keep their compute and bytes and add no fixed cost (``launches`` 0).
    Ops that cost nothing (views) and analytic ops (``launches`` other than 1) are left alone.
    """
    from dataclasses import replace

    out = list(ops)
    run_start: int | None = None
    run_len = 0

    def close() -> None:
        if run_start is not None and run_len > 1:
            out[run_start] = replace(out[run_start], launches=run_len)

    prev: tuple[str, int, str] | None = None
    for i, op in enumerate(ops):
        if op.launches != 1 or not (op.flops or op_bytes(op)):
            continue
        key = (op.module_path, op.step, op.phase)
        if key == prev:
            out[i] = replace(op, launches=0)
            run_len += 1
            continue
        close()
        prev, run_start, run_len = key, i, 1
    close()
    return out


_FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def rescale_ops(ops: list[OpRecord], dtype: str) -> list[OpRecord]:
    """Copies of ``ops`` as if run in ``dtype`` rather than the dtype the model ran in (that of the
    matrix products' weights, else the most frequent floating-point dtype of the ops): the ops in
    that dtype get the new dtype and their byte counts scaled by the
    element-size ratio; ops in another dtype (the float32 a bfloat16 model's norms compute in),
    integer and index ops are left alone. A conversion between two floating-point dtypes that
    become one in ``dtype`` (a bfloat16 capture's casts to float32 and back, predicted in float32)
    is left out: the run in ``dtype`` makes no such call."""
    from collections import Counter
    from dataclasses import replace

    from perfsdk.simulation.analytic import dtype_bytes

    weighted = Counter(o.dtype for o in ops if o.weight_bytes and o.dtype in _FLOAT_DTYPES)
    counts = weighted or Counter(o.dtype for o in ops if o.dtype in _FLOAT_DTYPES)
    source = counts.most_common(1)[0][0] if counts else dtype

    def as_run(d: str) -> str:
        return dtype if d == source else d

    new = dtype_bytes(dtype)
    out = []
    for op in ops:
        if (op.input_dtype in _FLOAT_DTYPES and op.dtype in _FLOAT_DTYPES and op.input_dtype != op.dtype
                and as_run(op.input_dtype) == as_run(op.dtype)):
            continue  # a conversion that does nothing in ``dtype``
        if op.dtype != source or source == dtype:
            out.append(op)
            continue
        f = new / dtype_bytes(op.dtype)
        out.append(replace(op, dtype=dtype, bytes_read=int(op.bytes_read * f), bytes_written=int(op.bytes_written * f),
                           weight_bytes=int(op.weight_bytes * f), kv_bytes=int(op.kv_bytes * f)))
    return out


def simulate_model(arch: Any, hardware: HardwareProfile, *, batch_size: int = 1, input_tokens: int = 128,
                   output_tokens: int = 128, dtype: str = "bfloat16", mapping: Mapping | None = None,
                   top_n: int = 10, max_decode_steps: int = 64, catalog: Catalog | None = None,
                   images: int | None = None, name: str | None = None) -> SimulationResult:
    """Analytic fast path: generate the ops of ``generate`` from an
    :class:`~perfsdk.models.arch.Architecture` (or a config it is read from) and predict.

    Long generations are costed on ``max_decode_steps`` evenly spaced decode steps, each
    weighted to stand for its share of all steps (KV traffic grows linearly, so this is exact
    up to rounding for the context-dependent terms). ``images``: images per sequence of a
    vision-language model (default 1).
    """
    from perfsdk.models.arch import architecture_from_config, generate_shape
    from perfsdk.simulation.analytic import dtype_bytes, generation_ops, sampled_decode_steps

    arch = architecture_from_config(arch)
    steps, weights = sampled_decode_steps(output_tokens, max_decode_steps)
    ops = generation_ops(arch, batch_size, input_tokens, output_tokens, dtype, decode_steps=steps, images=images)
    weights = {0: 1.0, **weights}
    shape = generate_shape(arch, batch_size, input_tokens, output_tokens, images)
    kv = arch.kv_cache_bytes(batch_size, shape.prompt_tokens + output_tokens - 1, dtype_bytes(dtype),
                             encoder_tokens=shape.encoder_tokens)
    sim = Simulator(hardware, mapping, catalog)
    res = sim.predict(ops, batch_size=batch_size, input_tokens=input_tokens, step_weights=weights, dtype=dtype,
                      top_n=top_n, model=name or arch.architecture or arch.model_type, op_source="analytic",
                      kv_cache_bytes=kv, family=arch.model_type or None)
    if hardware.call_overhead_s is not None:
        res = res.model_copy(update={"notes": [*res.notes, ANALYTIC_CALLS_NOTE]})
    return res


#: What an analytic prediction on a profile priced per ATen call leaves out.
ANALYTIC_CALLS_NOTE = ("the profile prices every kernel call of the model's code (call_overhead_s), and the analytic "
                       "ops count the kernel calls the architecture description writes, not those of the model's "
                       "own code (predict from the model's config to count its calls)")


def simulate_config(config: Any, hardware: HardwareProfile, *, batch_size: int = 1, input_tokens: int = 128,
                    output_tokens: int = 128, dtype: str = "bfloat16", mapping: Mapping | None = None,
                    top_n: int = 10, max_decode_steps: int = 64, catalog: Catalog | None = None,
                    images: int | None = None, name: str | None = None) -> SimulationResult:
    """Predict ``generate`` of any family ``transformers`` builds from ``config``.

    A family the architecture description covers takes the analytic fast path
    (:func:`simulate_model`); any other is captured from its own code on the meta device
    (:func:`perfsdk.flops.meta.capture_generation_ops`), costed the same way, with the KV cache
    the model builds. Decode steps are sampled as in the fast path.
    """
    from perfsdk.flops.meta import _architecture_or_none

    arch = _architecture_or_none(config)
    if arch is not None and hardware.call_overhead_s is not None:
        # a calibrated host prices every ATen call of the model's own code: count them
        try:
            return simulate_captured(config, hardware, batch_size=batch_size, input_tokens=input_tokens,
                                     output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n,
                                     max_decode_steps=max_decode_steps, catalog=catalog, images=images, name=name)
        except Exception as exc:  # the capture failed: the analytic ops, with what that leaves out said
            res = simulate_model(arch, hardware, batch_size=batch_size, input_tokens=input_tokens,
                                 output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n,
                                 max_decode_steps=max_decode_steps, catalog=catalog, images=images, name=name)
            return res.model_copy(update={"notes": [*res.notes, f"meta-device capture failed ({exc!r})"]})
    if arch is not None:
        return simulate_model(arch, hardware, batch_size=batch_size, input_tokens=input_tokens,
                              output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n,
                              max_decode_steps=max_decode_steps, catalog=catalog, images=images, name=name)
    return simulate_captured(config, hardware, batch_size=batch_size, input_tokens=input_tokens,
                             output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n,
                             max_decode_steps=max_decode_steps, catalog=catalog, images=images, name=name)


def simulate_captured(config: Any, hardware: HardwareProfile, *, batch_size: int = 1, input_tokens: int = 128,
                      output_tokens: int = 128, dtype: str = "bfloat16", mapping: Mapping | None = None,
                      top_n: int = 10, max_decode_steps: int = 64, catalog: Catalog | None = None,
                      images: int | None = None, name: str | None = None) -> SimulationResult:
    """Predict ``generate`` of ``config`` from its own code captured on the meta device, whether
    or not the architecture description covers its family (:func:`simulate_config` takes the
    analytic path where it does; both cost a model alike)."""
    from perfsdk.flops.meta import capture_generation_ops
    from perfsdk.simulation.analytic import dtype_bytes, sampled_decode_steps

    steps, weights = sampled_decode_steps(output_tokens, max_decode_steps)
    cap = capture_generation_ops(config, batch_size, input_tokens, output_tokens, steps, images=images)
    ops = rescale_ops(cap.ops, dtype)
    scale = dtype_bytes(dtype) / cap.element_bytes
    kv = int(cap.kv_cache_bytes * scale) if cap.kv_cache_bytes else None
    sim = Simulator(hardware, mapping, catalog)
    family = getattr(config, "model_type", None) or None
    model_type = family or type(config).__name__
    res = sim.predict(ops, batch_size=batch_size, input_tokens=input_tokens, step_weights={0: 1.0, **weights},
                      dtype=dtype, top_n=top_n, model=name or model_type, op_source="meta-device capture",
                      kv_cache_bytes=kv, weight_bytes=int(cap.param_count * dtype_bytes(dtype)), family=family)
    from perfsdk.flops.meta import _architecture_or_none

    if _architecture_or_none(config) is None:
        said = f"analytic cross-check: not available for model type {model_type}"
    else:  # described, but captured on purpose (a calibrated host prices every ATen call)
        said = "ops captured from the model's own code: the calibrated profile prices each ATen call"
    notes = [*res.notes, *cap.notes, said]
    return res.model_copy(update={"notes": notes})

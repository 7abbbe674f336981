"""The ``simulation`` collector: predicts the measured workload on other hardware profiles and
checks the prediction on this machine's. The ``simulate``, ``hardware`` and ``calibrate``
commands are in :mod:`perfsdk.cli.simulate`."""

from __future__ import annotations

import json
import statistics
from typing import Any

import structlog
from pydantic import Field, model_validator

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.hardware.catalog import Catalog, get_profile, is_profile_path, profile_for_device
from perfsdk.hardware.profile import (HardwareProfile, HardwareProfileError, profile_to_yaml, profiles_to_yaml,
                                      read_profile_file)
from perfsdk.fmt import fmt_s as _fmt_s
from perfsdk.plugins import hookimpl
from perfsdk.simulation.mapping import MappingError, mapping_from
from perfsdk.simulation.predictor import IntervalTerm, SimulationResult, Simulator, rescale_ops, simulate_model
from perfsdk.simulation.uncertainty import TERM_NAMES, widest_source

log = structlog.get_logger("perfsdk.simulation")


# -- collector ------------------------------------------------------------------------------------


class SimulationConfig(CollectorConfig):
    """Settings of the ``simulation`` collector."""

    targets: list[str] = Field(
        default_factory=list,
        description="Profiles to predict for: names, or YAML paths. A device-keyed hardware file (device name -> "
                    "figures) makes all its devices available to the mapping and predicts the host (the measured "
                    "device) with the mapped layers on them")
    host: str | None = Field(default=None, description="Profile of the measured device (default: host-cpu on CPU, "
                                                        "the matching GPU profile on CUDA)")
    mapping: dict[str, Any] | str | None = Field(default=None, description="Mapping (inline or a YAML path)")
    hardware_files: list[str] = Field(default_factory=list, description="Extra profile files")
    dtype: str | None = Field(default=None, description="Predict as if run in this dtype (default: as measured)")
    num_key_value_heads: int | None = Field(
        default=None, ge=1,
        description="Predict generate steps as if the model had this many KV heads (analytic ops from the model's "
                    "config; the measured device is still predicted as run)")
    sliding_window: int | None = Field(
        default=None, ge=0,
        description="Predict generate steps with this attention window (0: full attention); analytic ops from the "
                    "model's config")
    top_n: int = Field(default=5, ge=0, description="Layers listed per phase and target")
    at_current_speed: bool = Field(
        default=False,
        description="With a host profile calibrated on this machine: time its reference workload again after the "
                    "run (three seconds) and predict the measured device at the machine's speed of the moment, its "
                    "interval widened by how far such a window strays from the machine's level")

    @model_validator(mode="after")
    def _files(self) -> SimulationConfig:
        # bad hardware or mapping files fail the configuration, before anything is measured
        try:
            for f in [*self.hardware_files, *(t for t in self.targets if is_profile_path(t))]:
                read_profile_file(f)
            if self.host is not None and is_profile_path(self.host):
                read_profile_file(self.host)
            mapping_from(self.mapping)
        except (HardwareProfileError, MappingError) as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def overrides(self) -> dict[str, Any]:
        """The architecture overrides that are set (dtype apart)."""
        return {k: v for k, v in (("num_key_value_heads", self.num_key_value_heads),
                                  ("sliding_window", self.sliding_window)) if v is not None}


class LayerSummary(CollectorResult):
    """One layer (module path) in one phase on one target."""

    name: str
    phase: str
    time_s: float
    bound: str
    device: str | None = None
    share_pct: float | None = None
    energy_j: float | None = None
    compute_s: float | None = None
    memory_s: float | None = None
    transfer_s: float | None = None


class DeviceSummary(CollectorResult):
    """A device of a prediction and the efficiency it was costed at."""

    name: str
    profile: str
    compute_efficiency: float
    memory_efficiency: float
    peak_assumed: bool
    fits_in_memory: bool | None = None


class TargetPrediction(CollectorResult):
    """Predicted performance of the captured step on one profile (or mapping of devices)."""

    hardware: str | None = None
    op_source: str = "captured"
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens_per_s: float | None = None
    energy_j_per_output_token: float | None = None
    forward_s: float | None = None
    energy_j_per_forward: float | None = None
    forward_avg_power_w: float | None = None
    energy_j: float | None = None
    fits_in_memory: bool | None = None
    prefill_time_s: float | None = None
    decode_time_s: float | None = None
    prefill_avg_power_w: float | None = None
    decode_avg_power_w: float | None = None
    devices: list[DeviceSummary] = Field(default_factory=list)
    top_layers: list[LayerSummary] = Field(default_factory=list)
    origin: str | None = Field(default=None, description="calibrated, spec sheet or user file (see "
                               "perfsdk.simulation.uncertainty)")
    origin_detail: str | None = None
    energy_origin: str | None = None
    interval_level: float | None = Field(default=None, description="Coverage of the *_low/*_high bounds; None: "
                                         "no interval (interval_note says why)")
    interval_note: str | None = None
    interval_basis: str | None = Field(default=None, description="Which held-out errors of the calibration the "
                                       "interval's model error draws on (by the model's family)")
    interval_terms: dict[str, dict[str, IntervalTerm]] = Field(
        default_factory=dict, description="By metric, then by source (coefficients, model_error, run): the "
        "interval that source alone gives, as factors of the prediction (SimulationResult.interval_terms)")
    ttft_s_low: float | None = None
    ttft_s_high: float | None = None
    tpot_s_low: float | None = None
    tpot_s_high: float | None = None
    output_tokens_per_s_low: float | None = None
    output_tokens_per_s_high: float | None = None
    forward_s_low: float | None = None
    forward_s_high: float | None = None
    prefill_time_s_low: float | None = None
    prefill_time_s_high: float | None = None
    decode_time_s_low: float | None = None
    decode_time_s_high: float | None = None


class PhaseError(CollectorResult):
    measured_s: float | None
    predicted_s: float | None
    error_pct: float | None
    predicted_low_s: float | None = Field(default=None, description="The prediction's interval (calibrated profile)")
    predicted_high_s: float | None = None
    inside_interval: bool | None = Field(default=None, description="Whether the measurement falls inside the "
                                         "interval; None without an interval")


_NOTES = {
    "generate": ("ops captured by replaying the first measured generate step after the run (same inputs, same "
                 "number of tokens), so no measured window carries capture overhead"),
    "forward": ("ops captured by replaying the first measured forward step after the run (same inputs), so no "
                "measured window carries capture overhead"),
}


class SimulationCollectorResult(CollectorResult):
    """Predictions for each target and, for the measured device, predicted vs measured."""

    status: str = "ok"
    reason: str | None = None
    step_kind: str | None = Field(default=None, description="generate or forward: the kind of step simulated")
    captured_step: int | None = None
    compared_steps: int = Field(default=0, description="Measured steps of the captured step's shape (same model, "
                                "batch, input and output tokens) whose median the comparison uses")
    captured_ops: int = 0
    op_source: str = "captured"
    note: str = _NOTES["generate"]
    batch_size: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    measured_profile: str | None = None
    dtype: str | None = Field(default=None, description="dtype override of the targets (None: as measured)")
    overrides: dict[str, int] = Field(default_factory=dict,
                                      description="num_key_value_heads / sliding_window the targets assume")
    predictions: dict[str, TargetPrediction] = Field(default_factory=dict)
    comparison: dict[str, PhaseError] = Field(default_factory=dict)
    errors: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    speed_factor: float | None = Field(
        default=None, description="at_current_speed: how much longer every predicted time of the measured device was "
                                  "made, from its reference workload timed after the run (None: not re-timed)")
    memory_speed_factor: float | None = Field(
        default=None, description="at_current_speed: the same for the memory traffic, where the calibration told "
                                  "its exponent apart or timed the memory reference (None: as speed_factor, or not "
                                  "re-timed)")
    compute_speed_factor: float | None = Field(
        default=None, description="at_current_speed: the same for the arithmetic, where the calibration timed the "
                                  "compute reference (None: as speed_factor, or not re-timed)")


def _summarize(res: SimulationResult, top_n: int) -> TargetPrediction:
    ph = res.phases
    fwd = ph.get("forward")
    layers = [LayerSummary(name=l.name, phase=l.phase, time_s=l.time_s, bound=l.bound, device=l.device,
                           share_pct=l.share_pct, energy_j=l.energy_j, compute_s=l.compute_s, memory_s=l.memory_s,
                           transfer_s=l.transfer_s)
              for p in ph for l in [x for x in res.layers if x.phase == p][:top_n]]
    return TargetPrediction(
        hardware=res.hardware, op_source=res.op_source,
        ttft_s=res.ttft_s, tpot_s=res.tpot_s, output_tokens_per_s=res.output_tokens_per_s,
        energy_j_per_output_token=res.energy_j_per_output_token,
        forward_s=res.forward_s, energy_j_per_forward=res.energy_j_per_forward,
        forward_avg_power_w=fwd.avg_power_w if fwd is not None else None, energy_j=res.energy_j,
        fits_in_memory=res.fits_in_memory,
        prefill_time_s=ph["prefill"].time_s if "prefill" in ph else None,
        decode_time_s=ph["decode"].time_s if "decode" in ph else None,
        prefill_avg_power_w=ph["prefill"].avg_power_w if "prefill" in ph else None,
        decode_avg_power_w=ph["decode"].avg_power_w if "decode" in ph else None,
        devices=[DeviceSummary(name=d.name, profile=d.profile, compute_efficiency=d.compute_efficiency,
                               memory_efficiency=d.memory_efficiency, peak_assumed=d.peak_assumed,
                               fits_in_memory=d.fits_in_memory) for d in res.devices],
        top_layers=layers,
        origin=res.origin, origin_detail=res.origin_detail, energy_origin=res.energy_origin,
        interval_level=res.interval_level, interval_note=res.interval_note, interval_basis=res.interval_basis,
        interval_terms=res.interval_terms,
        ttft_s_low=res.ttft_s_low, ttft_s_high=res.ttft_s_high, tpot_s_low=res.tpot_s_low,
        tpot_s_high=res.tpot_s_high, output_tokens_per_s_low=res.output_tokens_per_s_low,
        output_tokens_per_s_high=res.output_tokens_per_s_high, forward_s_low=res.forward_s_low,
        forward_s_high=res.forward_s_high,
        prefill_time_s_low=ph["prefill"].time_s_low if "prefill" in ph else None,
        prefill_time_s_high=ph["prefill"].time_s_high if "prefill" in ph else None,
        decode_time_s_low=ph["decode"].time_s_low if "decode" in ph else None,
        decode_time_s_high=ph["decode"].time_s_high if "decode" in ph else None,
    )


def _err(pred: float | None, meas: float | None, low: float | None = None,
         high: float | None = None) -> PhaseError:
    """Predicted against measured: the signed error and, with an interval, whether the
    measurement falls inside it."""
    e = 100.0 * (pred - meas) / meas if pred is not None and meas else None
    inside = None if pred is None or meas is None or low is None or high is None else low <= meas <= high
    return PhaseError(measured_s=meas, predicted_s=pred, error_pct=e, predicted_low_s=low if pred is not None else None,
                      predicted_high_s=high if pred is not None else None, inside_interval=inside)


class _Target:
    """What one entry of ``targets`` predicts: the default device, under a label."""

    def __init__(self, label: str, profile: HardwareProfile, device_file: bool = False) -> None:
        self.label = label
        self.profile = profile
        self.device_file = device_file


def _resolve_target(target: str, catalog: Catalog, host: HardwareProfile) -> _Target:
    """A profile name, a profile file, or a device-keyed file (its devices join the catalogue
    and the host stays the default device: they are accelerators next to it)."""
    if is_profile_path(target):
        profs, device_keyed = read_profile_file(target)
        for prof in profs:
            catalog.add(prof, target)
        if device_keyed:
            return _Target(target, host, device_file=True)
        if len(profs) != 1:
            raise HardwareProfileError(f"{target}: holds {len(profs)} profiles ({', '.join(p.name for p in profs)}); "
                                       f"name one of them and list the file in hardware_files")
        return _Target(target, profs[0])
    return _Target(target, catalog.get(target))


def _model_shape(model: Any, overrides: dict[str, int]) -> Any:
    """The model's architecture (from its config) with the overrides applied."""
    from perfsdk.models.arch import architecture_from_config

    cfg = getattr(model, "config", None)
    if cfg is None:
        raise ValueError("num_key_value_heads / sliding_window need a model with a transformers config")
    return apply_overrides(architecture_from_config(cfg), overrides.get("num_key_value_heads"),
                           overrides.get("sliding_window"))


def _window_text(arch: Any) -> str:
    wins = {w for w in arch.layer_windows} or {None}
    return "full" if wins == {None} else ", ".join(str(w) if w else "full" for w in sorted(wins, key=lambda w: w or 0))


def apply_overrides(arch: Any, kv_heads: int | None = None, sliding_window: int | None = None) -> Any:
    """``arch`` with another number of KV heads and/or one attention window for every layer
    (0: full attention). KV heads must divide the attention heads (grouped-query attention)."""
    from dataclasses import replace

    changes: dict[str, Any] = {}
    if kv_heads is not None:
        if kv_heads < 1 or arch.num_heads % kv_heads:
            raise ValueError(f"num_key_value_heads {kv_heads} must divide the model's {arch.num_heads} attention "
                             f"heads")
        changes["num_kv_heads"] = kv_heads
    if sliding_window is not None:
        if sliding_window < 0:
            raise ValueError(f"sliding_window {sliding_window}: must be 0 (full attention) or a window length")
        changes["layer_windows"] = tuple([sliding_window or None] * arch.num_layers)
    return replace(arch, **changes) if changes else arch


class _PhaseSplitUnavailable(RuntimeError):
    """The capture could not tell prefill from decode."""


def _served_ops(session: Any, step: Any) -> tuple[list[Any], int] | str:
    """The operations of a served request, captured from the model's config on the meta device
    (its real prompt and output token counts, batch 1), and its weight bytes; or why not."""
    from perfsdk.flops.meta import capture_generation_ops

    config = session.backend.served_config() if hasattr(session.backend, "served_config") else None
    if config is None:
        return ("the served model's config is not here: set model.tokenizer (or model.id) to a local folder "
                "holding its config.json")
    n_in = max(1, step.input_tokens[0] if step.input_tokens else 1)
    n_out = len(step.token_times_ns)
    try:
        cap = capture_generation_ops(config, 1, n_in, n_out, list(range(1, n_out)))
    except Exception as exc:
        return f"the served model's config could not be captured: {exc!r}"
    return cap.ops, cap.param_count * cap.element_bytes


class SimulationCollector(Collector):
    """Predicts the measured workload on other hardware, and checks the prediction on this one.

    Opt-in. After the run, the first measured ``generate`` step (or, when the run has none, the
    first measured ``forward`` step of any ``nn.Module``) is replayed once under operation capture
    (outside every measured window); its ops are costed on each target profile and on the
    measured device's profile, whose prediction is compared with the step's measurement.
    """

    name = "simulation"
    title = "Simulation"
    Config = SimulationConfig
    Result = SimulationCollectorResult
    default_enabled = False
    description = "Predicted TTFT/TPOT (or forward time)/energy on other hardware profiles; predicted vs measured here"

    @classmethod
    def summary_rows(cls, result: SimulationCollectorResult) -> list[tuple[str, str]]:
        if result.status != "ok":
            return [("simulation", f"unavailable: {result.reason}")]
        return [("targets", ", ".join(result.predictions) or "-")]

    @classmethod
    def summary_tables(cls, result: SimulationCollectorResult) -> list[Any]:
        """Predictions per target, predicted vs measured here, and layers of forward steps."""
        if result.status != "ok":
            return []
        return _summary_tables(result.model_dump(mode="json"))

    @classmethod
    def report_section(cls, result: SimulationCollectorResult, run: Any) -> Any:
        from perfsdk.collector import ReportSection, rich_table_html

        sec = ReportSection(cls.title)
        if result.status != "ok":
            sec.notes.append(f"unavailable: {result.reason}")
            return sec
        sec.html += [rich_table_html(t) for t in _summary_tables(result.model_dump(mode="json"))]
        sec.notes.append(result.note)
        return sec

    def __init__(self, config: SimulationConfig | None = None) -> None:
        super().__init__(config)
        self._step: Any = None
        self._forward_step: Any = None
        # (TTFT, decode) of every measured step of the captured step's shape
        self._same: list[tuple[float, float | None]] = []

    @staticmethod
    def _shape(step: Any) -> tuple[Any, ...]:
        return (id(step.model), step.batch_size, tuple(step.input_tokens or ()), len(step.token_times_ns))

    @hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        if step.warmup or step.error is not None:
            return
        if step.kind == "generate" and len(step.token_times_ns) >= 1:
            if self._step is None:
                self._step = step
            # the timed steps alone: an instrumented copy (FLOPs capture, hooks) runs far slower
            if step.served is None and not step.instrumented_by and self._shape(step) == self._shape(self._step):
                n = len(step.token_times_ns)
                self._same.append(((step.token_times_ns[0] - step.start_ns) / 1e9,
                                   (step.token_times_ns[-1] - step.token_times_ns[0]) / 1e9 if n > 1 else None))
        elif self._forward_step is None and step.kind == "forward" and step.end_ns is not None:
            self._forward_step = step

    def _replay(self, step: Any) -> list[Any]:
        import torch

        from perfsdk.capture import OperationCapture

        if step.kind == "forward":
            with torch.inference_mode(), OperationCapture(step.model, phase="forward") as cap:
                step.model(*step.args, **step.inputs)
            return cap.records
        kwargs = dict(step.inputs)
        kwargs.update(step.gen_kwargs or {})
        n = len(step.token_times_ns)
        kwargs["max_new_tokens"] = n
        kwargs["min_new_tokens"] = n
        kwargs.pop("streamer", None)
        kwargs.pop("max_length", None)
        with torch.inference_mode(), OperationCapture(step.model, auto_phase=True) as cap:
            step.model.generate(**kwargs)
        if cap.phase_unavailable:
            raise _PhaseSplitUnavailable(cap.phase_unavailable)
        return cap.records

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> SimulationCollectorResult:
        cfg: SimulationConfig = self.config  # type: ignore[assignment]
        step = self._step or self._forward_step
        if step is None:
            return SimulationCollectorResult(status="unavailable",
                                             reason="no measured generate or forward step to simulate")
        forward = step.kind == "forward"
        served_weights: int | None = None
        if step.served is not None:
            got = _served_ops(session, step)
            if isinstance(got, str):
                return SimulationCollectorResult(status="unavailable", reason=got)
            ops, served_weights = got
        elif not callable(step.model):
            return SimulationCollectorResult(status="unavailable", reason="the step's model is not callable")
        else:
            try:
                ops = self._replay(step)
            except _PhaseSplitUnavailable as exc:  # predicting prefill and decode needs the split
                return SimulationCollectorResult(status="unavailable", reason=str(exc))
            except Exception as exc:
                return SimulationCollectorResult(status="unavailable", reason=f"operation capture failed: {exc!r}")
        if not ops:
            return SimulationCollectorResult(status="unavailable", step_kind=step.kind, captured_step=step.index,
                                             reason="the step executed no tensor operation inside the model")
        target_ops = rescale_ops(ops, cfg.dtype) if cfg.dtype else ops
        try:
            # the session's plugin manager: profiles of session(plugins=[...]), entry points loaded once
            catalog = Catalog.load(cfg.hardware_files, pm=getattr(session, "pm", None))
            mapping = mapping_from(cfg.mapping)
            measured_name = cfg.host or profile_for_device(getattr(session, "device", None)) or "host-cpu"
            host = _resolve_target(measured_name, catalog, catalog.get("host-cpu")).profile
        except (HardwareProfileError, MappingError) as exc:
            return SimulationCollectorResult(status="unavailable", reason=str(exc))
        weight_bytes = served_weights
        try:
            from perfsdk.models.info import weight_bytes as _wb

            if step.model is not None:
                weight_bytes = int(_wb(step.model))
        except Exception:
            pass
        b = step.batch_size
        in_tok = None if forward else max((o.context_len or 0) for o in ops if o.phase == "prefill")
        n_out = None if forward else len(step.token_times_ns)
        notes: list[str] = []
        overrides = cfg.overrides
        shape = None
        errors: dict[str, str] = {}
        if overrides and forward:
            notes.append("num_key_value_heads / sliding_window apply to generate steps only: not applied to this "
                         "forward step")
            overrides = {}
        elif overrides:
            try:
                shape = _model_shape(step.model, overrides)
            except (ValueError, TypeError) as exc:
                errors["overrides"] = str(exc)
        out = SimulationCollectorResult(step_kind=step.kind, captured_step=step.index, captured_ops=len(ops),
                                        note=_NOTES[step.kind], batch_size=b, input_tokens=in_tok, output_tokens=n_out,
                                        measured_profile=measured_name, dtype=cfg.dtype, overrides=overrides)
        if step.served is None and host.kind == "cpu":  # a model run in this process, on its CPU
            import torch

            from perfsdk.simulation.uncertainty import threads_mismatch

            said = threads_mismatch(host, torch.get_num_threads())
            if said:
                notes.append(said)
        model_id = getattr(session.model_info, "model_id", None) if getattr(session, "model_info", None) else None
        # the model's type decides which held-out errors its interval draws on (a plain module: none)
        family = getattr(getattr(step.model, "config", None), "model_type", None) or None
        preds: dict[str, TargetPrediction] = {}
        full: dict[str, Any] = {}
        now_host: HardwareProfile | None = None
        if cfg.at_current_speed:
            from perfsdk.simulation.calibration.measure import at_current_speed

            try:
                now_host, factor, said = at_current_speed(host)
                notes.append(said)
                cal = host.calibration
                apart = cal is not None and ((cal.memory_tracking is not None and cal.rest_tracking is not None)
                                             or cal.memory_reference_s is not None)
                memory = host.memory_bandwidth_gbs / now_host.memory_bandwidth_gbs if apart else None
                fp32, fp32_now = host.peak_tflops.fp32, now_host.peak_tflops.fp32
                compute = (fp32 / fp32_now if cal is not None and cal.compute_reference_s is not None and fp32
                           and fp32_now else None)
                out = out.model_copy(update={"speed_factor": factor, "memory_speed_factor": memory,
                                             "compute_speed_factor": compute})
            except ValueError as exc:
                errors["at_current_speed"] = str(exc)
        for target in [*cfg.targets, measured_name]:
            if target in preds or (target != measured_name and "overrides" in errors):
                continue
            here = target == measured_name  # the measured device: as run, no mapping, no dtype change
            try:
                tgt = _resolve_target(target, catalog, host)
                if here and now_host is not None:
                    tgt = _Target(tgt.label, now_host, device_file=tgt.device_file)
                sim_mapping = None if here else mapping
                if shape is not None and not here:
                    assert in_tok is not None and n_out is not None
                    dtype = cfg.dtype or next((o.dtype for o in ops if o.category == "matmul"), ops[0].dtype)
                    res = simulate_model(shape, tgt.profile, batch_size=b, input_tokens=in_tok, output_tokens=n_out,
                                         dtype=dtype, mapping=sim_mapping, top_n=cfg.top_n, catalog=catalog)
                else:
                    sim = Simulator(tgt.profile, sim_mapping, catalog)
                    res = sim.predict(ops if here else target_ops, batch_size=b, input_tokens=in_tok, top_n=cfg.top_n,
                                      weight_bytes=weight_bytes, model=model_id, dtype=None if here else cfg.dtype,
                                      family=family)
            except (HardwareProfileError, MappingError, ValueError) as exc:
                errors[target] = str(exc)
                continue
            preds[target] = _summarize(res, cfg.top_n)
            full[target] = res.model_dump(mode="json")
        comparison: dict[str, PhaseError] = {}
        if measured_name in preds:
            p = preds[measured_name]
            if forward:
                comparison = {"forward": _err(p.forward_s, step.duration_s, p.forward_s_low, p.forward_s_high)}
            else:
                n = len(step.token_times_ns)
                # the median over the run's steps of this shape (the replayed step among them): one
                # step, often the coldest, is a poor yardstick for a prediction of the typical one
                same = self._same or [((step.token_times_ns[0] - step.start_ns) / 1e9,
                                       (step.token_times_ns[-1] - step.token_times_ns[0]) / 1e9 if n > 1 else None)]
                ttft = statistics.median(t for t, _ in same)
                decode = statistics.median(d for _, d in same if d is not None) if n > 1 else None
                out = out.model_copy(update={"compared_steps": len(same)})
                comparison = {
                    "prefill": _err(p.prefill_time_s, ttft, p.prefill_time_s_low, p.prefill_time_s_high),
                    "decode": _err(p.decode_time_s if n > 1 else None, decode, p.decode_time_s_low,
                                   p.decode_time_s_high),
                    "tpot": _err(p.tpot_s, decode / (n - 1) if decode is not None else None, p.tpot_s_low,
                                 p.tpot_s_high),
                }
        far = [(ph, e.error_pct) for ph, e in comparison.items() if e.error_pct is not None and abs(e.error_pct) > FAR_PCT]
        if far and preds[measured_name].origin != "calibrated":
            ph, pct = max(far, key=lambda x: abs(x[1]))
            shown = preds[measured_name].hardware or measured_name
            notes.append(f"the {shown} profile ({preds[measured_name].origin}) misses this measurement by "
                         f"{pct:+.0f} % ({ph}): it prices the device's operations, not what this machine adds around "
                         "them (a host that launches the kernels, the framework); fit this machine from stored runs "
                         "with `perfsdk calibrate --from-store STORE --run ID -o host.yaml` and set "
                         "collectors.simulation.host: host.yaml")
        try:
            session.add_artifact("simulation.json", json.dumps(full, indent=1))
        except Exception as exc:  # the summary in the result is what matters
            log.warning("could not attach simulation details", error=repr(exc))
        return out.model_copy(update={"predictions": preds, "comparison": comparison, "errors": errors,
                                      "notes": notes})


#: A prediction of the measured device further off than this (%) gets a note on how to calibrate.
FAR_PCT = 50.0


def _profile(name_or_path: str, catalog: Catalog) -> HardwareProfile:
    """A profile by name, or the single device of a YAML file (added to ``catalog``)."""
    return get_profile(name_or_path, catalog=catalog)


def _yes(v: bool | None) -> str:
    return "?" if v is None else ("yes" if v else "NO")


def _eff(d: dict[str, Any]) -> str:
    if d.get("peak_assumed"):
        return f"{d['name']}: peak"
    return f"{d['name']}: {d['compute_efficiency']:.2f} compute, {d['memory_efficiency']:.2f} memory"


def _with_interval(p: dict[str, Any], metric: str) -> str:
    """``9.1 ms`` or, with an interval, ``9.1 ms (8.4–10.2)``."""
    value = _fmt_s(p.get(metric))
    lo, hi = p.get(f"{metric}_low"), p.get(f"{metric}_high")
    if lo is None or hi is None or p.get(metric) is None:
        return value
    return f"{value} ({_fmt_s(lo)}–{_fmt_s(hi)})"


def _origin_caption(predictions: dict[str, Any]) -> str:
    """Where each prediction's figures come from, and the intervals' coverage."""
    parts = []
    for name, p in predictions.items():
        origin = p.get("origin") or "?"
        if p.get("interval_level"):
            terms = p.get("interval_terms") or {}
            said = [f"{label}'s {TERM_NAMES.get(w, w)}" for m, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"),
                                                                          ("forward_s", "forward pass"))
                    if terms.get(m) for w in [widest_source({src: (t["low"], t["high"])
                                                             for src, t in terms[m].items()})] if w]
            parts.append(f"{name}: {origin}, {100 * p['interval_level']:.0f} % interval in brackets"
                         + (f" (widest source: {', '.join(said)})" if said else ""))
        else:
            parts.append(f"{name}: {origin}, no interval")
    return "; ".join(parts)


def _summary_tables(res: dict[str, Any]) -> list[Any]:
    """Rich tables of a simulation result (its JSON form): predictions per target, predicted vs
    measured, and for forward steps the layers on each target."""
    from rich.table import Table

    if res.get("status") != "ok":
        t = Table(title="Simulation", show_header=False, show_edge=False)
        t.add_row("simulation", f"unavailable: {res.get('reason')}")
        return [t]
    forward = res.get("step_kind") == "forward"
    shape = (f"batch {res.get('batch_size')}" if forward else
             f"batch {res.get('batch_size')}, {res.get('input_tokens')} in / {res.get('output_tokens')} out")
    pt = Table(title=f"Simulation (ops of {'forward ' if forward else ''}step {res.get('captured_step')}, {shape})",
               show_edge=False)
    cols = (("profile", "forward", "J/forward", "fits", "efficiency") if forward else
            ("profile", "TTFT", "TPOT", "tokens/s", "J/token", "fits", "efficiency"))
    for c in cols:
        pt.add_column(c, justify="left" if c in ("profile", "efficiency") else "right")
    for name, p in res.get("predictions", {}).items():
        label = f"{name} (measured here)" if name == res.get("measured_profile") else name
        eff = "; ".join(_eff(d) for d in p.get("devices", []))
        if forward:
            j = p.get("energy_j_per_forward")
            pt.add_row(label, _with_interval(p, "forward_s"), "-" if j is None else f"{j:.3g}",
                       _yes(p.get("fits_in_memory")), eff)
        else:
            tps, j = p.get("output_tokens_per_s"), p.get("energy_j_per_output_token")
            pt.add_row(label, _with_interval(p, "ttft_s"), _with_interval(p, "tpot_s"),
                       "-" if tps is None else f"{tps:.1f}", "-" if j is None else f"{j:.3g}",
                       _yes(p.get("fits_in_memory")), eff)
    pt.caption = _origin_caption(res.get("predictions", {}))
    tables = [pt]
    comp = res.get("comparison") or {}
    if comp:
        n_same = res.get("compared_steps") or 0
        said = [f"measured: median of the run's {n_same} steps of this shape"] if n_same > 1 else []
        if res.get("speed_factor") is not None:
            memory, compute = res.get("memory_speed_factor"), res.get("compute_speed_factor")
            said.append(f"predicted at this machine's speed after the run: x {res['speed_factor']:.3f}"
                        + ("" if memory is None else f", the memory traffic x {memory:.3f}")
                        + ("" if compute is None else f", the arithmetic x {compute:.3f}")
                        + " (its calibration's reference workload timed again)")
        elif (res.get("errors") or {}).get("at_current_speed"):
            said.append(f"at the calibration's speed: {res['errors']['at_current_speed']}")
        ct = Table(title=f"Predicted vs measured on {res.get('measured_profile')}", show_edge=False,
                   caption="; ".join(said) or None)
        level = (res.get("predictions", {}).get(res.get("measured_profile")) or {}).get("interval_level")
        heads = ["phase", "measured", "predicted", "error"]
        if level:
            heads += [f"{100 * level:.0f} % interval", "inside"]
        for h in heads:
            ct.add_column(h, justify="right" if h != "phase" else "left")
        for ph, e in comp.items():
            err = "-" if e.get("error_pct") is None else f"{e['error_pct']:+.1f}%"
            row = [ph, _fmt_s(e.get("measured_s")), _fmt_s(e.get("predicted_s")), err]
            if level:
                lo, hi = e.get("predicted_low_s"), e.get("predicted_high_s")
                row += ["-" if lo is None or hi is None else f"{_fmt_s(lo)}–{_fmt_s(hi)}",
                        "-" if e.get("inside_interval") is None else ("yes" if e["inside_interval"] else "NO")]
            ct.add_row(*row)
        tables.append(ct)
    if forward:
        for name, p in res.get("predictions", {}).items():
            if name == res.get("measured_profile") or not p.get("top_layers"):
                continue
            lt = Table(title=f"Layers on {name}", show_edge=False)
            for c in ("layer", "device", "time", "compute", "memory", "transfer", "energy J", "bound"):
                lt.add_column(c, justify="left" if c in ("layer", "device", "bound") else "right")
            for l in p["top_layers"]:
                lt.add_row(l["name"] or "(root)", l.get("device") or "-", _fmt_s(l["time_s"]), _fmt_s(l.get("compute_s")),
                           _fmt_s(l.get("memory_s")), _fmt_s(l.get("transfer_s")),
                           "-" if l.get("energy_j") is None else f"{l['energy_j']:.4g}", l["bound"])
            tables.append(lt)
    return tables


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(SimulationCollector)

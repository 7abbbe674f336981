"""The ``flops`` collector (opt-in) and the ``perfsdk flops`` command.

The collector counts the real run (``perfsdk flops``, in :mod:`perfsdk.cli.flops`, counts a
configuration without weights). By default (``steps: first``) it counts the first measured
step of each distinct shape — (kind, batch size, padded input length, generation settings) —
because counting runs every operation through a Python dispatch hook, which slows the counted
step down; the counted step's FLOPs are then exact for that shape. ``steps: all`` counts every
measured step. The counted steps are instrumented copies of the measured ones (same inputs, run
by the session after the timed steps), so the counter's slowdown never enters the latency
figures. Totals (``flops_total`` …) are over the counted steps. Achieved FLOP/s divide those
FLOPs by the durations of measured steps of the same shape (with
``instrumentation.replay: false``, by the counted step's own, slowed, duration when no other
step has its shape — then ``notes`` says so).

Quantized models (torch dynamic int8, bitsandbytes) are counted on a weightless meta-device copy
of the unquantized architecture with the same batch, input length and number of generated
positions; ``method`` says so.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import structlog
from pydantic import BaseModel, Field

from perfsdk.capture import CONVENTION
from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.events import Step
from perfsdk.flops.counter import FLAG_THRESHOLD_PCT, FlopsCount, deviation_pct
from perfsdk.plugins import hookimpl

log = structlog.get_logger("perfsdk.collectors.flops")

Backend = Literal["torch", "ptflops", "fvcore", "analytic"]


class FlopsConfig(CollectorConfig):
    """Settings of the flops collector."""

    backend: Backend = Field(default="torch", description="torch (dispatch-level, default), ptflops, fvcore, analytic")
    steps: Literal["first", "all"] = Field(
        default="first", description="count the first measured step of each distinct shape, or every measured step")
    top_n: int = Field(default=10, ge=0, description="modules listed in top_modules")
    peak_tflops: float | None = Field(default=None, gt=0, description="hardware peak (TFLOP/s) for MFU")
    hardware: str | None = Field(
        default=None, description="hardware profile whose peak (for the model dtype) gives MFU (default: on CUDA, "
                                  "the catalogue profile of the GPU by its name, when there is one)")


class TopModule(BaseModel):
    """One module's share of the counted FLOPs."""

    name: str
    flops: int
    share_pct: float


class CountedStep(BaseModel):
    """One counted step."""

    step: int
    replay_of: int | None = None
    kind: str
    batch_size: int
    input_tokens: int
    forwards: int
    flops: int
    analytic_flops: int | None = None
    duration_s: float | None = None


class FlopsResult(CollectorResult):
    """FLOPs and MACs of the counted steps, the analytic comparison, and achieved FLOP/s."""

    status: Literal["ok", "unavailable"] = "ok"
    reason: str | None = None
    flops_total: int | None = Field(default=None, description="flops_encode + flops_prefill + flops_decode "
                                    "(+ flops_forward for non-generative steps)")
    flops_encode: int | None = Field(default=None, description="encoder / vision or audio tower and projector")
    flops_prefill: int | None = None
    flops_decode: int | None = None
    flops_forward: int | None = None
    macs_total: int | None = None
    macs_encode: int | None = None
    macs_prefill: int | None = None
    macs_decode: int | None = None
    flops_per_output_token: float | None = Field(
        default=None, description="all FLOPs (encode and prefill included) over the output tokens")
    flops_per_decode_token: float | None = Field(
        default=None, description="decode FLOPs over the tokens the decode steps produced (output tokens less the "
                                  "first of each request, which the prefill produced)")
    analytic_flops_total: int | None = None
    deviation_pct: float | None = None
    deviation_flagged: bool | None = None
    backend: str | None = None
    method: str | None = None
    convention: str = CONVENTION
    achieved_flops_per_s: float | None = None
    mfu_pct: float | None = None
    peak_tflops: float | None = None
    decode_forwards: int | None = None
    output_tokens: int | None = None
    steps_counted: int = 0
    steps_measured: int = 0
    top_modules: list[TopModule] = Field(default_factory=list)
    by_module_type: list[TopModule] = Field(default_factory=list)
    by_category: list[TopModule] = Field(default_factory=list)
    counted_steps: list[CountedStep] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def result_fields(count: FlopsCount, analytic_total: int | None, *, output_tokens: int | None,
                  decode_tokens: int | None = None, top_n: int = 10,
                  time_s: float | None = None, peak_tflops: float | None = None) -> dict[str, Any]:
    """The result fields shared by the collector and ``perfsdk flops --json``."""
    dev = deviation_pct(count.flops_total, analytic_total) if analytic_total is not None else None
    achieved = count.flops_total / time_s if time_s else None
    mfu = 100.0 * achieved / (peak_tflops * 1e12) if achieved is not None and peak_tflops else None
    return {
        "flops_total": count.flops_total,
        "flops_encode": count.flops_encode,
        "flops_prefill": count.flops_prefill,
        "flops_decode": count.flops_decode,
        "flops_forward": count.flops_forward,
        "macs_total": count.macs_total,
        "macs_encode": count.macs_encode,
        "macs_prefill": count.macs_prefill,
        "macs_decode": count.macs_decode,
        "flops_per_output_token": (count.flops_total / output_tokens) if output_tokens else None,
        "flops_per_decode_token": (count.flops_decode / decode_tokens) if decode_tokens else None,
        "analytic_flops_total": analytic_total,
        "deviation_pct": dev,
        "deviation_flagged": (abs(dev) > FLAG_THRESHOLD_PCT) if dev is not None else None,
        "backend": count.backend,
        "method": count.method,
        "convention": count.convention,
        "achieved_flops_per_s": achieved,
        "mfu_pct": mfu,
        "peak_tflops": peak_tflops,
        "decode_forwards": count.decode_forwards,
        "output_tokens": output_tokens,
        "top_modules": count.top_modules(top_n),
        "by_module_type": count.shares("module_types"),
        "by_category": count.shares("categories"),
        "notes": list(count.notes),
    }


def _step_shape(step: Step) -> tuple[Any, ...]:
    ids: Any = step.inputs.get("input_ids") if step.inputs else None
    shape = getattr(ids, "shape", None)
    length = int(shape[-1]) if shape is not None and len(shape) >= 2 else max(step.input_tokens or [0])
    gen = tuple(sorted((k, repr(v)) for k, v in (step.gen_kwargs or {}).items()
                       if k in ("max_new_tokens", "min_new_tokens", "max_length", "do_sample", "num_beams")))
    return step.kind, step.batch_size, length, gen


def _padded_len(step: Step) -> int:
    return int(_step_shape(step)[2])


def _text_tokens_and_images(arch: Any, step: Step) -> tuple[int, int]:
    """The prompt's text tokens and images per sequence of a step.

    A vision-language model's ``input_ids`` already hold the image tokens the processor put in:
    they are taken out of the text and counted as images (from ``pixel_values``).
    """
    tokens = _padded_len(step)
    if arch is None or not arch.is_multimodal:
        return tokens, 0
    px = step.inputs.get("pixel_values") if step.inputs else None
    shape = getattr(px, "shape", None)
    images = int(shape[0]) // max(step.batch_size, 1) if shape is not None and len(shape) == 4 else 0
    return tokens - images * arch.image_tokens_per_image, images


def analytic_unavailable(config: Any) -> str:
    """The note for a model the architecture description does not cover."""
    model_type = getattr(config, "model_type", None) or type(config).__name__
    return f"analytic cross-check: not available for model type {model_type}"


def _architecture_of(model: Any) -> Any:
    from perfsdk.models.arch import architecture_from_config

    try:
        return architecture_from_config(model.config)
    except (AttributeError, TypeError, ValueError):
        return None


def _analytic_for_step(model: Any, step: Step, positions: int) -> int | None:
    from perfsdk.flops.analytic import analytic_forward, analytic_generate

    arch = _architecture_of(model)
    if arch is None:
        return None
    try:
        tokens, images = _text_tokens_and_images(arch, step)
        if step.kind == "generate":
            return analytic_generate(arch, step.batch_size, tokens, positions, images=images).flops_total
        keep = step.inputs.get("logits_to_keep") if step.inputs else None
        return analytic_forward(arch, step.batch_size, tokens, int(keep) if isinstance(keep, int) and keep > 0 else None,
                                images=images).flops_total
    except (TypeError, ValueError):
        return None


#: Distinct (prompt, output) token counts of a served run counted on the meta device.
MAX_SERVED_SHAPES = 64


class FlopsCollector(Collector):
    """FLOPs and MACs of the real run: encode/prefill/decode split, per module, analytic deviation, MFU."""

    name = "flops"
    title = "FLOPs"
    Config = FlopsConfig
    Result = FlopsResult
    default_enabled = False
    description = "FLOPs/MACs of the run (encode/prefill/decode, per module), deviation from the analytic model, MFU"
    key_columns = ("flops_total", "mfu_pct")
    instruments_steps = True

    @classmethod
    def summary_rows(cls, result: FlopsResult) -> list[tuple[str, str]]:
        from perfsdk.fmt import fmt_num

        if result.status != "ok":
            return [("FLOPs", f"unavailable: {result.reason}")]
        rows = [("FLOPs encode", fmt_num(result.flops_encode))] if result.flops_encode else []
        rows.append(("FLOPs prefill / decode", f"{fmt_num(result.flops_prefill)} / {fmt_num(result.flops_decode)}"))
        if result.flops_forward:
            rows.append(("FLOPs forward", fmt_num(result.flops_forward)))
        if result.deviation_pct is not None:
            rows.append(("vs analytic", f"{result.deviation_pct:+.1f} %{' (flagged)' if result.deviation_flagged else ''}"))
        if result.mfu_pct is not None:
            rows.append(("MFU", f"{result.mfu_pct:.2f} %"))
        if result.reason:
            rows.append(("FLOPs phases", result.reason))
        return rows

    @classmethod
    def report_section(cls, result: FlopsResult, run: Any) -> Any:
        from perfsdk.collector import ReportFigure, ReportSection, html_table, scalar_items
        from perfsdk.experiments.report import bar_figure

        sec = ReportSection(cls.title)
        if result.status != "ok":
            sec.notes.append(f"unavailable: {result.reason}")
            return sec
        panels = {"by category": {r.name: float(r.flops) for r in result.by_category},
                  "by module type": {r.name: float(r.flops) for r in result.by_module_type},
                  "top modules": {r.name: float(r.flops) for r in result.top_modules}}
        png = bar_figure("FLOPs breakdowns", {k: v for k, v in panels.items() if len(v) >= 2})
        if png:
            sec.figures.append(ReportFigure("flops-breakdown", "FLOPs breakdown", png))
        sec.html.append(html_table(["field", "value"], [[k, v] for k, v in scalar_items(result)], "kv"))
        sec.notes += result.notes
        return sec

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.cfg: FlopsConfig = self.config  # type: ignore[assignment]
        self._seen: set[tuple[Any, ...]] = set()
        self._cap: Any = None
        self._cap_step: int | None = None
        self._pending: set[int] = set()  # step indexes to count after the step
        self._counted: list[tuple[Step, FlopsCount, int | None, tuple[Any, ...]]] = []
        self._notes: list[str] = []
        self._forward_rows: list[dict[str, Any]] = []
        self._served_reason: str | None = None

    def wants_to_instrument(self, session: Any, step: Step) -> bool:
        """The first measured step of each shape (``steps: first``), or every one (``all``)."""
        key = _step_shape(step)
        if self.cfg.steps == "first" and key in self._seen:
            return False
        self._seen.add(key)
        return True

    @hookimpl
    def perfsdk_before_generate(self, session: Any, step: Step) -> None:
        if self.name not in step.instrumented_by:
            return
        model = step.model
        from perfsdk.flops.counter import is_quantized

        quant = is_quantized(model) if model is not None else None
        if self.cfg.backend == "torch" and quant is None:
            from perfsdk.capture import OperationCapture

            cap = OperationCapture(model, auto_phase=step.kind == "generate", phase="forward", step=step.index)
            cap.__enter__()
            self._cap, self._cap_step = cap, step.index
        else:
            self._pending.add(step.index)

    @hookimpl
    def perfsdk_after_generate(self, session: Any, step: Step) -> None:
        count: FlopsCount | None = None
        if self._cap is not None and self._cap_step == step.index:
            cap, self._cap, self._cap_step = self._cap, None, None
            cap.__exit__(None, None, None)
            if step.error is not None:
                return
            from perfsdk.flops.counter import count_from_records

            count = count_from_records(cap.records, "torch", "capture")
            if cap.phase_unavailable and cap.phase_unavailable not in self._notes:
                self._notes.append(cap.phase_unavailable)
            for f in count.forwards:
                self._forward_rows.append({"step": step.index, **f})
        elif step.index in self._pending:
            self._pending.discard(step.index)
            if step.error is not None:
                return
            count = self._count_after(step)
        if count is None:
            return
        positions = len(step.token_times_ns) if step.kind == "generate" else 0
        analytic = _analytic_for_step(step.model, step, positions)
        if analytic is None:
            why = analytic_unavailable(getattr(step.model, "config", None))
            if why not in self._notes:
                self._notes.append(why)
        self._counted.append((step, count, analytic, _step_shape(step)))

    def _count_served(self, session: Any, measured: list[Step]) -> None:
        """A served model: each measured request counted from the model's config on the meta
        device, for its real prompt and output token counts (requests of equal counts share one
        count; at most ``MAX_SERVED_SHAPES`` distinct ones, the rest scaled from the nearest)."""
        from perfsdk.flops.meta import count_config

        config = session.backend.served_config() if hasattr(session.backend, "served_config") else None
        if config is None:
            self._served_reason = ("the served model's config is not here: set model.tokenizer (or model.id) to a "
                                   "local folder holding its config.json")
            return
        cache: dict[tuple[int, int], FlopsCount] = {}
        for step in measured:
            if step.kind != "generate" or not step.output_tokens:
                continue
            key = (max(1, step.input_tokens[0] if step.input_tokens else 1), int(step.output_tokens[0]))
            if key not in cache:
                if len(cache) >= MAX_SERVED_SHAPES:
                    continue
                try:
                    cache[key] = count_config(config, 1, key[0], key[1])
                except Exception as exc:
                    self._served_reason = f"the served model's config could not be counted: {exc}"
                    return
            count = cache[key]
            self._counted.append((step, count, None, ("served", *key)))
        skipped = sum(1 for st in measured if st.kind == "generate" and st.output_tokens
                      and (max(1, st.input_tokens[0] if st.input_tokens else 1), int(st.output_tokens[0])) not in cache)
        self._notes.append("served model: FLOPs counted from its config on the meta device for each request's "
                           "prompt and output token counts (batch 1 each: how the server batched requests is not "
                           "visible from the client)")
        if skipped:
            self._notes.append(f"{skipped} requests of further distinct shapes left out of the count "
                               f"(at most {MAX_SERVED_SHAPES} shapes are counted)")
        arch = _architecture_of(type("M", (), {"config": config})())
        if arch is None:
            self._notes.append(analytic_unavailable(config))

    def _count_after(self, step: Step) -> FlopsCount | None:
        """Count a step that could not be captured inline (other backends, quantized models)."""
        from perfsdk.flops.counter import count_analytic, count_third_party, is_quantized

        model = step.model
        positions = len(step.token_times_ns) if step.kind == "generate" else 0
        arch = _architecture_of(model)
        b, (t, images) = step.batch_size, _text_tokens_and_images(arch, step)
        quant = is_quantized(model)
        if self.cfg.backend == "analytic":
            return count_analytic(model.config, b, t, positions, images=images)
        if quant is not None:
            from perfsdk.flops.meta import count_meta_generate, meta_copy

            meta = meta_copy(model)
            c = count_meta_generate(meta, b, t, positions, images=images)
            c.method = f"meta-device copy of the unquantized architecture ({quant} model)"
            c.notes.append(f"{quant} layers counted with their unquantized shapes (same matrix products)")
            return c
        return count_third_party(self.cfg.backend, model, b, t, positions)

    def _peak(self, session: Any) -> float | None:
        if self.cfg.peak_tflops:
            return self.cfg.peak_tflops
        from perfsdk.hardware.catalog import get_profile, profile_for_device

        name = self.cfg.hardware or profile_for_device(getattr(session, "device", None))
        if name:
            try:
                dtype = "float32"
                info = getattr(session, "model_info", None)
                if info is not None and getattr(info, "dtype", None):
                    dtype = str(info.dtype)
                # the session's plugin manager: its plugins' profiles, entry points not loaded again
                peak = get_profile(name, pm=getattr(session, "pm", None)).peak_flops(dtype) / 1e12
                if not self.cfg.hardware:
                    self._notes.append(f"MFU against the {name} profile's {dtype} peak ({peak:g} TFLOP/s, spec "
                                       "sheet), the profile of the GPU this ran on (collectors.flops.hardware or "
                                       "peak_tflops to choose)")
                return peak
            except Exception as exc:
                self._notes.append(f"no peak from hardware profile {name!r}: {exc}")
        return None

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> FlopsResult:
        if self._cap is not None:  # a step never finished
            self._cap.__exit__(None, None, None)
            self._cap = None
        measured = session.measured_steps
        if not getattr(session, "in_process", True):
            self._count_served(session, measured)
        if not self._counted:
            reason = self._served_reason or "no measured step was counted"
            return FlopsResult(status="unavailable", reason=reason, steps_measured=len(measured),
                               backend=self.cfg.backend)
        total = FlopsCount(backend=self._counted[0][1].backend, method=self._counted[0][1].method)
        analytic_total: int | None = 0
        output_tokens = decode_tokens = 0
        time_s = 0.0
        slowed = False
        counted_ids = {s.index for s, _, _, _ in self._counted}
        rows: list[CountedStep] = []
        for step, count, analytic, key in self._counted:
            total.add(count)
            if total.method != count.method:
                total.method = "mixed: " + ", ".join(sorted({c.method for _, c, _, _ in self._counted}))
            analytic_total = None if analytic is None or analytic_total is None else analytic_total + analytic
            output_tokens += sum(step.output_tokens or [])
            decode_tokens += sum(max(0, n - 1) for n in step.output_tokens or [])
            positions = len(step.token_times_ns)
            twins = [s.duration_s for s in measured if s.index not in counted_ids and _step_shape(s) == key
                     and len(s.token_times_ns) == positions and s.duration_s]
            if twins:
                time_s += sum(twins) / len(twins)  # type: ignore[arg-type]
            elif step.duration_s:
                time_s += step.duration_s
                if count.backend == "torch" and count.method == "capture":
                    slowed = True
            rows.append(CountedStep(step=step.index, replay_of=step.replay_of, kind=step.kind, batch_size=step.batch_size,
                                    input_tokens=_padded_len(step), forwards=len(count.forwards) or 1,
                                    flops=count.flops_total, analytic_flops=analytic, duration_s=step.duration_s))
        served = [s for s, _, _, _ in self._counted if s.served is not None]
        if served:  # requests overlap: achieved FLOP/s over the wall time they spanned
            time_s = (max(s.end_ns or s.start_ns for s in served) - min(s.start_ns for s in served)) / 1e9
            slowed = False
        if slowed:
            total.notes.append("achieved FLOP/s uses a counted step's own duration, which includes the counter's "
                               "overhead (no uncounted step of the same shape was measured)")
        fields = result_fields(total, analytic_total, output_tokens=output_tokens or None,
                               decode_tokens=decode_tokens or None, top_n=self.cfg.top_n,
                               time_s=time_s or None, peak_tflops=self._peak(session))
        fields["notes"] = list(fields["notes"]) + self._notes
        if self._forward_rows:
            session.add_series("flops_forwards", self._forward_rows)
        split = next((n for n in self._notes if n.startswith("phase split unavailable")), None)
        if split is not None:
            fields["reason"] = split
        return FlopsResult(status="ok", steps_counted=len(self._counted), steps_measured=len(measured),
                           counted_steps=rows, **fields)


# -- CLI ---------------------------------------------------------------------------------------


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(FlopsCollector)

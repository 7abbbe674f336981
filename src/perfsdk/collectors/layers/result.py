"""What the ``layers`` collector stores (``collectors.layers`` of a run)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field

from perfsdk.collector import CollectorResult

LayerPhase = Literal["encode", "prefill", "decode", "forward"]
PHASES: tuple[LayerPhase, ...] = ("encode", "prefill", "decode", "forward")

#: A module setting worth showing (``in_features``, ``kernel_size``, ``eps`` ...).
ParamValue = Union[bool, int, float, str, list[int], None]


class ModuleRow(CollectorResult):
    """One module's calls in one phase, summed over the instrumented steps."""

    path: str
    module_type: str
    phase: LayerPhase
    depth: int
    order: int = Field(default=0, description="Position of the module in the model (named_modules order).")
    calls: int
    total_s: float
    mean_s: float
    share_pct: float = Field(description="total_s / instrumented step time * 100")
    phase_share_pct: float | None = Field(
        default=None, description="total_s / top-module time in this phase * 100")
    input_shapes: list[list[int]] = Field(default_factory=list,
                                          description="Tensor input shapes of the first call in this phase.")
    params: dict[str, ParamValue] = Field(
        default_factory=dict,
        description="The module's settings: in_features, out_features, bias, kernel_size, stride, eps, ...")
    parameters: int | None = Field(default=None, description="Parameters the module holds (its children included).")


class ModuleTypeRow(CollectorResult):
    """All modules of one class in one phase."""

    module_type: str
    phase: LayerPhase
    modules: int
    calls: int
    total_s: float
    mean_s: float
    share_pct: float
    phase_share_pct: float | None = None


class PhaseRow(CollectorResult):
    """Top-module calls of one phase, summed over the instrumented steps (for ``encode``: the
    outermost encode-module calls; an encode pass inside a top-module call is taken out of that
    call's phase)."""

    phase: LayerPhase
    forwards: int
    total_s: float
    mean_s: float
    share_pct: float
    context_len_min: int | None = None
    context_len_max: int | None = None


class FunctionRow(CollectorResult):
    """Operations of one kind (matmul, attention, softmax, activation, norm) inside one module
    and phase.

    Counted by the shared operation capture (``perfsdk.capture``); ``ops`` counts ATen operations
    (a normalization written as several elementwise operations counts each of them).
    """

    path: str
    module_type: str | None = None
    phase: str
    category: str
    ops: int
    flops: int
    elements: int
    bytes: int = Field(description="bytes read + bytes written")
    time_s: float | None = Field(default=None, description="Measured time of these operations.")


class FunctionTotalRow(CollectorResult):
    """All operations of one kind in one phase."""

    phase: str
    category: str
    ops: int
    flops: int
    elements: int
    bytes: int
    time_s: float | None = Field(default=None, description="Measured time of these operations.")
    share_pct: float | None = Field(default=None, description="time_s / instrumented step time * 100")


class FunctionOpRow(CollectorResult):
    """One operation (``aten.softmax``, ``aten.linear`` ...) of a counted kind in one phase."""

    phase: str
    category: str
    op: str
    calls: int
    time_s: float | None = None
    mean_s: float | None = None
    share_pct: float | None = Field(default=None, description="time_s / instrumented step time * 100")
    flops: int = 0
    input_shapes: list[list[int]] = Field(default_factory=list, description="Input shapes of its first call.")


class LayersResult(CollectorResult):
    """Where the step time goes, module by module, for encode, prefill and decode."""

    status: Literal["ok", "unavailable"] = "ok"
    reason: str | None = None
    steps_selection: str
    steps_instrumented: int = 0
    steps_failed: int = 0
    step_indices: list[int] = Field(default_factory=list)
    step_time_s: float = Field(default=0.0, description="Sum of the instrumented steps' wall times.")
    step_time_mean_s: float | None = None
    modules_timed: int = 0
    synchronized: bool = Field(default=False, description="Timestamps synchronize CUDA before being read.")
    phases: list[PhaseRow] = Field(default_factory=list)
    coverage_modules: list[str] = Field(default_factory=list)
    coverage_time_s: float | None = None
    coverage_pct: float | None = Field(
        default=None, description="Time in the coverage modules / instrumented step time * 100.")
    forward_coverage_pct: float | None = Field(
        default=None, description="Time in the coverage modules / top-module time * 100.")
    overhead_pct: float | None = Field(
        default=None,
        description="(median instrumented / median un-instrumented step time of the same shape - 1) * 100.")
    overhead_method: str = ""
    overhead_compared_steps: int = 0
    overhead_baseline_steps: int = 0
    overhead_reason: str | None = None
    steps_also_profiled: list[int] = Field(
        default_factory=list,
        description="Instrumented steps that torch_profiler also wrapped: their times include the profiler's "
        "slowdown (they are left out of overhead_pct; steps profiled alone are left out of its baseline).")
    hook_calls: int = 0
    hook_time_s: float = 0.0
    hook_time_pct: float | None = Field(default=None, description="hook_time_s / instrumented step time * 100")
    modules: list[ModuleRow] = Field(default_factory=list)
    module_types: list[ModuleTypeRow] = Field(default_factory=list)
    events_series: str | None = None
    events: int = 0
    per_function_status: Literal["off", "ok", "unavailable"] = "off"
    per_function_reason: str | None = None
    per_function: list[FunctionRow] = Field(default_factory=list)
    per_function_totals: list[FunctionTotalRow] = Field(default_factory=list)
    per_function_ops: list[FunctionOpRow] = Field(default_factory=list)

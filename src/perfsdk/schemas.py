"""Result models: what a run produces, stores and exports.

Collector results are stored as plain dicts under ``collectors.<name>`` after being validated
against the collector's own ``Result`` model, so a stored run can be read back without the
plugin that produced it being installed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

SCHEMA_VERSION = "1.0"

RunStatus = Literal["ok", "partial", "failed"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class EnvironmentInfo(_Frozen):
    """Where the run happened."""

    hostname: str | None = None
    os: str | None = None
    platform: str | None = None
    python: str | None = None
    cpu_model: str | None = None
    cpu_cores_physical: int | None = None
    cpu_cores_logical: int | None = None
    ram_bytes: int | None = None
    torch: str | None = None
    transformers: str | None = None
    cuda_available: bool = False
    cuda_version: str | None = None
    gpu_names: list[str] = Field(default_factory=list)
    gpu_driver: str | None = None
    nvml_available: bool = False
    nvml_reason: str | None = None
    rapl_available: bool = False
    rapl_reason: str | None = None
    torch_threads: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class ModelInfo(_Frozen):
    """What was measured."""

    model_id: str | None = None
    model_class: str | None = None
    architecture: str | None = None
    model_type: str | None = None
    parameters: int | None = None
    weights_bytes: int | None = None
    dtype: str | None = None
    device: str | None = None
    quantization: str = "none"
    quant_type: str | None = None
    quant_compute_dtype: str | None = None
    quantized_modules: int | None = None
    attn_implementation: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    load_s: float | None = Field(default=None, description="Loading the model and tokenizer (one-time imports excluded).")
    import_s: float | None = Field(
        default=None, description="One-time imports and set-up before loading (transformers' lazy modules, model "
                                  "class, tokenizer library), timed separately from load_s.")


class WorkloadInfo(_Frozen):
    """What the model was asked to do."""

    prompts_source: str | None = None
    num_prompts: int | None = None
    prompts_filtered: int = 0
    max_input_tokens: int | None = None
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    num_batches: int | None = None
    max_new_tokens: int | None = None
    warmup_runs: int = 0
    timed_runs: int = 0
    iterations: int = 0
    input_tokens_mean: float | None = None
    input_tokens_max: int | None = None
    arrival_pattern: str | None = None
    labelled_prompts: int = 0
    label_map: list[str] | None = None
    images_source: str | None = Field(default=None, description="builtin:shapes, a folder, or the prompt file "
                                      "(its \"image\" fields); none for text-only workloads")
    image_size: int | None = None
    num_crops: int | None = None
    image_views_mean: float | None = Field(default=None, description="image views (global view + tiles) per prompt")
    vision_tokens_mean: float | None = Field(default=None, description="real vision tokens per measured request, "
                                             "read from the vision features")
    vision_tokens_max: int | None = None


class Record(_Frozen):
    """A user metric stored with ``s.record(name, value, unit)``."""

    name: str
    value: float | int | str | bool | None
    unit: str | None = None
    t_s: float | None = None


class ErrorRecord(_Frozen):
    """An error caught during the run."""

    source: str  # collector / exporter name, or "user" / "session"
    hook: str | None = None
    type: str
    message: str
    traceback: str | None = None


Verdict = Literal["valid", "noisy", "invalid"]


class ContentionFigures(_Frozen):
    """CPU used by other processes while timed steps ran (``/proc/stat`` busy time minus this
    process tree's), and other processes on the GPUs in use (NVML)."""

    status: Literal["ok", "unavailable"] = "ok"
    reason: str | None = None
    timed_s: float = Field(default=0.0, description="Wall time the readings cover: the timed steps and their hooks.")
    system_busy_cpu_s: float | None = None
    own_cpu_s: float | None = Field(default=None, description="CPU time of this process and its children.")
    other_cpu_s: float | None = None
    other_cpu_cores: float | None = Field(default=None, description="other_cpu_s / timed_s: CPUs kept busy by others.")
    other_cpu_pct: float | None = Field(default=None, description="other_cpu_s / (timed_s x logical CPUs) x 100.")
    logical_cpus: int | None = None
    gpu_status: str | None = Field(default=None, description="ok, or why GPU processes were not read.")
    gpu_other_pids: list[int] = Field(default_factory=list, description="Other processes seen on the GPUs in use.")


class StabilityFigures(_Frozen):
    """Spread and drift of step latency, over timed steps of the same shape (each step's time
    divided by the median of its shape)."""

    steps: int = Field(default=0, description="Timed steps in shapes that occur at least twice.")
    shapes: int = 0
    cv: float | None = Field(default=None, description="Coefficient of variation (std / mean).")
    drift_pct: float | None = Field(
        default=None, description="Median of the last third of those steps over the first third, minus 1, in %.")
    cold_shapes: int = Field(
        default=0, description="Shapes whose first timed step was their slowest and took more than "
                               "validity.max_cold_ratio times the median of their later steps: first-run costs "
                               "the warm-up did not cover.")
    cold_ratio: float | None = Field(
        default=None, description="The largest first step / median of later steps among those shapes.")


class SampleFigures(_Frozen):
    """How much the statistics rest on."""

    timed_steps: int = 0
    latency_samples: int = Field(default=0, description="Requests of timed generate steps plus timed forward steps.")
    min_samples: int = 0
    timed_wall_s: float | None = Field(default=None, description="First timed step start to last timed step end.")
    sampler_interval_s: float | None = Field(default=None, description="Shortest interval of the sampler's probes.")


class InstrumentedFigures(_Frozen):
    """Steps that collectors instrumented (left out of every statistic)."""

    steps: int = 0
    copies: int = Field(default=0, description="Instrumented copies of timed steps, run after them.")
    in_place: int = Field(default=0, description="Timed steps instrumented themselves (instrumentation.replay: false).")
    by_collector: dict[str, int] = Field(default_factory=dict)
    time_s: float = Field(default=0.0, description="Time spent in instrumented steps.")


class ThrottleFigures(_Frozen):
    """Clock and throttling readings taken while timed steps ran (cpufreq in sysfs, NVML)."""

    samples: int = 0
    cpu_freq_first_mhz: float | None = Field(default=None, description="Median CPU clock, first third of samples.")
    cpu_freq_last_mhz: float | None = Field(default=None, description="Median CPU clock, last third of samples.")
    cpu_freq_change_pct: float | None = None
    cpu_throttle_events: int | None = Field(
        default=None, description="Increase of the thermal throttle counters of all CPUs, where readable.")
    gpu_sm_clock_first_mhz: float | None = None
    gpu_sm_clock_last_mhz: float | None = None
    gpu_sm_clock_change_pct: float | None = None
    gpu_throttle_reasons: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class Validity(_Frozen):
    """Whether the run's numbers can be trusted: ``valid``, ``noisy`` or ``invalid``.

    Each reason starts with its kind (``contention``, ``unstable``, ``drift``, ``few-samples``,
    ``instrumented``, ``throttled``, ``client-bound``); the figures behind them and the thresholds applied are
    kept beside them.
    """

    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    contention: ContentionFigures = Field(default_factory=ContentionFigures)
    stability: StabilityFigures = Field(default_factory=StabilityFigures)
    samples: SampleFigures = Field(default_factory=SampleFigures)
    instrumented: InstrumentedFigures = Field(default_factory=InstrumentedFigures)
    throttling: ThrottleFigures = Field(default_factory=ThrottleFigures)
    thresholds: dict[str, Any] = Field(default_factory=dict)


class RankResult(_Frozen):
    """One rank's share of a distributed run."""

    rank: int
    world_size: int
    hostname: str | None = None
    status: RunStatus = "ok"
    collectors: dict[str, Any] = Field(default_factory=dict)
    errors: list[ErrorRecord] = Field(default_factory=list)


CollectorScope = Literal["process", "merged", "rank0-only"]


class CollectorMeta(_Frozen):
    """Where a collector's top-level result comes from, and whether it was re-validated.

    ``scope``: ``process`` (a single-process run), ``merged`` (every rank's result combined by the
    collector's ``merge_ranks``) or ``rank0-only`` (the collector defines no merge: the top-level
    entry is rank 0's, every rank's own result is kept in ``ranks``). ``installed`` and
    ``validated`` are set when a stored run is read: whether the collector is installed here and
    whether the stored result validated against its ``Result`` model.
    """

    scope: CollectorScope = "process"
    ranks: int | None = None
    plugin: str | None = None
    installed: bool | None = None
    validated: bool | None = None
    validation_error: str | None = None


class RunResult(_Frozen):
    """One measured run, validated; what the store keeps and exporters write."""

    schema_version: str = SCHEMA_VERSION
    run_id: str
    name: str
    status: RunStatus
    validity: Validity | None = Field(default=None, description="Verdict on the run's numbers (runs stored before "
                                                                "verdicts existed have none).")
    started_at: datetime
    finished_at: datetime | None = None
    duration_s: float | None = None
    perfsdk_version: str
    environment: EnvironmentInfo = Field(default_factory=EnvironmentInfo)
    config: dict[str, Any] = Field(default_factory=dict)
    model: ModelInfo | None = None
    workload: WorkloadInfo | None = None
    collectors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    records: list[Record] = Field(default_factory=list)
    errors: list[ErrorRecord] = Field(default_factory=list)
    ranks: list[RankResult] | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    series: dict[str, str] = Field(
        default_factory=dict,
        description="Time series stored next to the result: series name -> file name in the run folder.",
    )
    artifacts: dict[str, str] = Field(
        default_factory=dict,
        description="Other files stored with the run (e.g. profiler traces): name -> file name.",
    )
    collector_meta: dict[str, CollectorMeta] = Field(
        default_factory=dict,
        description="Per collector: scope of its top-level result (process, merged, rank0-only) and validation.",
    )

    _typed: dict[str, tuple[Any, BaseModel]] = PrivateAttr(default_factory=dict)
    _store_root: str | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # the stored fields only: typed views and where the run was read from are not its value
        return isinstance(other, RunResult) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    def collector_result(self, name: str, cls: Any = None) -> Any:
        """The typed ``Result`` of collector ``name`` (``cls``, or the installed collector of that
        name), or ``None`` when absent, not installed, or not valid against its ``Result``."""
        data = self.collectors.get(name)
        if data is None:
            return None
        cached = self._typed.get(name)
        if cached is not None and cached[0] is data and (cls is None or isinstance(cached[1], cls.Result)):
            return cached[1]
        if cls is None:
            from perfsdk.plugins import installed_registry

            cls = installed_registry().collectors.get(name)
            if cls is None:
                return None
        try:
            typed = cls.Result.model_validate(data)
        except ValidationError:
            return None
        self._typed[name] = (data, typed)
        return typed

    def read_series(self, name: str) -> list[dict[str, Any]]:
        """A time series stored with this run (empty when the run was not read from a store or
        has no such series)."""
        if self._store_root is None or name not in self.series:
            return []
        from perfsdk.store import Store

        try:
            return Store(self._store_root).read_series(self.run_id, name)
        except Exception:
            return []

"""Result models: what a run produces, stores and exports.

Collector results are stored as plain dicts under ``collectors.<name>`` after being validated
against the collector's own ``Result`` model, so a stored run can be read back without the
plugin that produced it being installed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    parameters: int | None = None
    weights_bytes: int | None = None
    dtype: str | None = None
    device: str | None = None
    quantization: str = "none"
    attn_implementation: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    load_s: float | None = None


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


class RankResult(_Frozen):
    """One rank's share of a distributed run."""

    rank: int
    world_size: int
    hostname: str | None = None
    status: RunStatus = "ok"
    collectors: dict[str, Any] = Field(default_factory=dict)
    errors: list[ErrorRecord] = Field(default_factory=list)


class RunResult(_Frozen):
    """One measured run, validated; what the store keeps and exporters write."""

    schema_version: str = SCHEMA_VERSION
    run_id: str
    name: str
    status: RunStatus
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

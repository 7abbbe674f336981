"""Benchmark configuration: pydantic models, safe YAML loading and ``--set`` overrides.

Every error names the field path (``workload.batching.batch_size``) or the file at fault and is
raised as :class:`ConfigError`, which the CLI turns into exit code 2.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """Invalid configuration; the message names the field path or file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Dtype = Literal["auto", "float32", "float16", "bfloat16", "float8_e4m3fn"]
Quantization = Literal["none", "dynamic-int8", "bnb-8bit", "bnb-4bit"]
ComputeDtype = Literal["float32", "float16", "bfloat16"]


class ModelConfig(_Strict):
    """Which model to load and how."""

    id: str = "builtin:tiny-llama"
    dtype: Dtype = "float32"
    device: str = "auto"
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "auto"] = "auto"
    quantization: Quantization = "none"
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field(
        default="nf4", description="bnb-4bit only: 4-bit data type, NormalFloat4 or FP4")
    bnb_4bit_compute_dtype: ComputeDtype | None = Field(
        default=None, description="bnb-4bit only: dtype of the matmuls (default: model.dtype, float32 for auto)")
    bnb_4bit_use_double_quant: bool = Field(default=False, description="bnb-4bit only: quantize the scales too")
    config_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="fields set on the model's configuration before it is built, e.g. {num_hidden_layers: 2}")
    trust_remote_code: bool = False
    revision: str | None = None
    backend: str | None = Field(
        default=None, description="what runs the workload: transformers (in this process), openai (a served model) "
                                  "or a plugin's backend; default: openai when endpoint is set, else transformers")
    endpoint: str | None = Field(
        default=None,
        description="base URL of an OpenAI-compatible server (http://HOST:PORT/v1): set, the workload runs "
                    "against it through the openai backend, and model.id is the served model's name")
    api: Literal["completions", "chat"] = Field(
        default="completions", description="served models: /v1/completions or /v1/chat/completions")
    api_key_env: str | None = Field(
        default=None, description="served models: the environment variable holding the API key (never stored)")
    tokenizer: str | None = Field(
        default=None,
        description="served models: a local folder or cached id of the model's tokenizer, to count prompt tokens "
                    "and the tokens of a stream without usage (default: model.id when it is a local folder)")
    request_timeout_s: float = Field(default=120.0, gt=0, description="served models: a request's time limit")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (http://HOST:PORT/v1)")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu", "mps", "cuda") and not v.startswith("cuda:"):
            raise ValueError("must be auto, cpu, mps, cuda or cuda:N")
        return v


class BatchingConfig(_Strict):
    """Fixed batch size, or adaptive batching by a token budget."""

    batch_size: int | None = Field(default=4, ge=1)
    max_batch_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_of(self) -> BatchingConfig:
        if self.max_batch_tokens is not None and "batch_size" not in self.model_fields_set:
            object.__setattr__(self, "batch_size", None)
        if self.batch_size is None and self.max_batch_tokens is None:
            raise ValueError("set batch_size or max_batch_tokens")
        return self


class GenerateConfig(_Strict):
    """Arguments for ``model.generate``."""

    max_new_tokens: int = Field(default=32, ge=1)
    min_new_tokens: int | None = Field(default=None, ge=0)
    do_sample: bool = False
    temperature: float = Field(default=1.0, gt=0)
    top_k: int | None = Field(default=None, ge=1)
    top_p: float | None = Field(default=None, gt=0, le=1)


class ArrivalConfig(_Strict):
    """Delays between requests (batches): none, constant, poisson or burst."""

    pattern: Literal["none", "constant", "poisson", "burst"] = "none"
    delay_s: float = Field(default=0.0, ge=0)
    rate_per_s: float | None = Field(default=None, gt=0)
    burst_size: int = Field(default=4, ge=1)
    burst_interval_s: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _needs(self) -> ArrivalConfig:
        if self.pattern == "poisson" and self.rate_per_s is None:
            raise ValueError("pattern poisson needs rate_per_s")
        return self


class LoadConfig(_Strict):
    """How requests are offered to a served model (and, in-process, the pacing of batches).

    ``concurrency``: a closed loop of N users, each sending its next request when the last one
    finished. ``rate``: an open loop sending at ``rate_per_s`` on a schedule (``constant``,
    ``poisson`` or ``gamma`` inter-arrival times) whether or not earlier requests finished.
    """

    mode: Literal["concurrency", "rate", "sweep", "replay"] = "concurrency"
    concurrency: int = Field(default=1, ge=1)
    rate_per_s: float | None = Field(default=None, gt=0)
    arrival: Literal["constant", "poisson", "gamma"] = "poisson"
    gamma_cv: float = Field(default=2.0, gt=0, description="gamma arrivals: coefficient of variation of the gaps")
    max_concurrency: int | None = Field(
        default=None, ge=1, description="rate mode: requests in flight at most (later ones wait, and that wait is "
                                        "shown as client queueing)")
    duration_s: float | None = Field(default=None, gt=0, description="stop sending after this long (with num_prompts)")
    trace: str | None = None
    time_scale: float = Field(default=1.0, gt=0)
    client_processes: int | Literal["auto"] = "auto"
    client_executor: Literal["local", "ray"] = Field(
        default="local", description="where client processes run: this machine, or a Ray cluster (ray_address)")
    ray_address: str | None = Field(default=None, description="client_executor ray: the cluster (auto, ray://…); "
                                                              "default: a local Ray instance")
    # mode sweep: a full measured point per load level, up through saturation
    sweep: Literal["rate", "concurrency"] = Field(default="rate", description="mode sweep: what rises point by point")
    steps: int = Field(default=6, ge=2, le=50, description="mode sweep: rate levels from 10 % to 130 % of saturation")
    max_rate_per_s: float | None = Field(
        default=None, gt=0, description="mode sweep: the server's saturation rate, when known (else a short burst "
                                        "finds it)")
    probe_concurrency: int = Field(default=8, ge=1, description="mode sweep: users of the saturation burst")
    repeats: int = Field(default=2, ge=0, le=10, description="mode sweep: extra measurements of the SLO-limited rate")
    alpha: float = Field(default=0.01, gt=0, lt=0.5, description="mode sweep: significance of the stop rule's tests")

    @model_validator(mode="after")
    def _needs(self) -> LoadConfig:
        if self.mode == "rate" and self.rate_per_s is None:
            raise ValueError("mode rate needs rate_per_s")
        if self.mode == "replay" and not self.trace:
            raise ValueError("mode replay needs trace (a JSONL or CSV file)")
        return self


class SloConfig(_Strict):
    """Service-level objectives a request must meet to count towards goodput (seconds)."""

    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)


class DatasetConfig(_Strict):
    """Prompts (and labels) from a Hugging Face ``datasets`` dataset."""

    path: str = Field(description="a folder written by save_to_disk, a .csv/.json/.jsonl/.parquet file, "
                                  "or a dataset name on the Hub")
    name: str | None = Field(default=None, description="the dataset's configuration name (Hub datasets)")
    split: str | None = Field(default=None, description="split to read; may be left out when there is only one")
    prompt_column: str = "prompt"
    label_column: str | None = Field(default="label", description="column of the references; null: unlabelled")
    prompt_template: str | None = Field(
        default=None, description="builds the prompt from the row's columns, e.g. 'Review: {text}\\nSentiment:'")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


class WorkloadConfig(_Strict):
    """What the benchmark runner asks the model to do."""

    task: Literal["generate", "forward"] = "generate"
    prompts: str = "builtin:mixed"
    dataset: DatasetConfig | None = None
    label_map: list[str] | None = Field(
        default=None, description="class names by index: labels must be one of them (or an index)")
    num_prompts: int = Field(default=32, ge=1)
    max_input_tokens: int = Field(default=512, ge=1)
    sort_by_length: bool = True
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    warmup_runs: int = Field(default=2, ge=0)
    warmup_every_batch: bool | None = Field(
        default=None,
        description="Warm up on every batch of the workload once (at least warmup_runs runs), so that no timed "
                    "step is the first to meet its shapes: on CUDA, kernel and attention plans are chosen and "
                    "cached per shape, and a batch's first run can take several times its later ones. "
                    "null: on when the model runs on CUDA, off elsewhere")
    min_iterations: int = Field(default=5, ge=1)
    min_duration_s: float = Field(default=0.0, ge=0)
    arrival: ArrivalConfig = Field(default_factory=ArrivalConfig)
    load: LoadConfig | None = Field(
        default=None, description="how requests are offered: closed loop (concurrency) or open loop (rate); "
                                  "in-process runs take mode rate as the pacing of batches")
    slo: SloConfig | None = Field(default=None, description="objectives a request must meet to count in goodput")
    seed: int = 42
    threads: int | None = Field(default=None, ge=1)
    images: str | None = Field(
        default="auto",
        description="Images for vision-language models: auto (builtin:shapes when the model takes images, "
        "none otherwise), none, builtin:shapes, or a folder of images. A .jsonl prompt file's \"image\" "
        "fields take precedence.",
    )
    image_size: int | None = Field(
        default=None, ge=1,
        description="Resize each image so its longer side has this many pixels; with a fixed-resolution "
        "vision encoder, a larger image is cut into tiles of the encoder's input size plus one global view "
        "(more vision tokens).",
    )
    num_crops: int | None = Field(
        default=None, ge=1,
        description="Cut each image into this many crops (grid chosen by aspect ratio) plus one global view, "
        "for fixed-resolution vision encoders.",
    )

    @model_validator(mode="after")
    def _image_knob(self) -> WorkloadConfig:
        if self.image_size is not None and self.num_crops is not None:
            raise ValueError("set either image_size or num_crops, not both")
        return self

    @field_validator("label_map", mode="before")
    @classmethod
    def _label_map_scalars(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        if any(isinstance(x, bool) for x in v):
            raise ValueError("YAML read a name as a boolean (yes/no/on/off/true/false are booleans): quote it")
        return [str(x) if isinstance(x, (int, float)) else x for x in v]

    @field_validator("label_map")
    @classmethod
    def _label_map(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must name at least one class")
        if len(set(v)) != len(v):
            raise ValueError("names repeat")
        return v

    @model_validator(mode="after")
    def _load_and_arrival(self) -> WorkloadConfig:
        if self.load is not None and self.arrival.pattern != "none":
            raise ValueError("set load or arrival, not both: arrival is the older spelling of load "
                             "(arrival: {pattern: poisson, rate_per_s: R} is load: {mode: rate, rate_per_s: R, "
                             "arrival: poisson})")
        return self

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        # compared with the default, not with the fields set, so that a dumped config re-validates
        if self.dataset is not None and self.prompts != "builtin:mixed":
            raise ValueError("set prompts or dataset, not both")
        return self


class InstrumentationConfig(_Strict):
    """Where collectors that instrument steps (``flops``, ``layers``, ``torch_profiler``) get them."""

    replay: bool = Field(
        default=True,
        description="Instrument copies of the timed steps (same inputs, run after the timed steps), so every timed "
        "step stays measured. false: instrument the timed steps themselves; they are then left out of the "
        "statistics and the run's validity says so.")
    share_steps: bool = Field(
        default=False,
        description="Let several instrumenting collectors instrument the same step (their overheads then add up "
        "in each other's figures). false: each gets a step of its own.")


class ValidityConfig(_Strict):
    """Thresholds of the run's validity verdict (``valid`` / ``noisy`` / ``invalid``)."""

    max_contention_pct: float = Field(
        default=10.0, ge=0, le=100,
        description="noisy when other processes used more than this share (%) of all CPUs while timed steps ran")
    invalid_contention_pct: float | None = Field(
        default=None, ge=0, le=100, description="invalid when other processes used more than this share (%); none: never")
    max_cv: float = Field(
        default=0.15, gt=0,
        description="noisy when the coefficient of variation of step latency (steps of the same shape) is above this")
    max_cold_ratio: float = Field(
        default=1.5, gt=1,
        description="noisy (cold-start) when the first timed step of a shape is its slowest and takes more than "
                    "this many times the median of the shape's later steps: a first-run cost the warm-up did not "
                    "cover")
    max_drift_pct: float = Field(
        default=10.0, gt=0,
        description="noisy when the last third of timed steps is slower or faster than the first third by more (%)")
    min_samples: int = Field(
        default=100, ge=1,
        description="noisy below this many latency samples (requests; steps for forward): tail percentiles are "
        "extrapolations")
    max_freq_drop_pct: float = Field(
        default=10.0, gt=0,
        description="throttled (noisy) when the CPU or GPU clock falls by more than this (%) between the first "
        "and the last third of the timed steps")
    sample_interval_s: float = Field(
        default=0.5, gt=0, le=60, description="how often clocks, throttling and GPU processes are read")
    max_client_lag_s: float = Field(
        default=0.01, gt=0,
        description="served models: noisy (client-bound) when the client's sends lag their schedule, or its event "
                    "loop is late, by more than this at p99")


class Config(_Strict):
    """A whole benchmark: model, workload, collectors, exporters, store.

    ``collectors`` is merged onto the default set: naming a collector enables it with the given
    settings, ``name: false`` disables a default one. Each entry is validated against the
    collector's own ``Config`` when the session starts.
    """

    name: str = "perfsdk-run"
    model: ModelConfig = Field(default_factory=ModelConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    collectors: dict[str, dict[str, Any] | bool | None] = Field(default_factory=dict)
    exporters: list[str] = Field(default_factory=lambda: ["json"])
    store: str | None = "perfsdk-results"
    tags: dict[str, str] = Field(default_factory=dict)
    instrumentation: InstrumentationConfig = Field(default_factory=InstrumentationConfig)
    validity: ValidityConfig = Field(default_factory=ValidityConfig)

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, v: Any) -> Any:
        # numbers and booleans (sweep axes such as tags.knob: [1, 2]) are kept as their JSON text
        if isinstance(v, dict):
            return {k: tag_text(x) for k, x in v.items()}
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or len(v) > 200:
            raise ValueError("must be 1 to 200 characters")
        return v


def tag_text(value: Any) -> Any:
    """A tag value as it is stored: strings unchanged, numbers and booleans as JSON text
    (``1`` -> ``"1"``, ``0.5`` -> ``"0.5"``, ``True`` -> ``"true"``). Anything else is returned
    as it is, for validation to reject."""
    if isinstance(value, (bool, int, float)) and not isinstance(value, str):
        import json

        return json.dumps(value)
    return value


def _format_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """``path: message; ...`` with "did you mean" hints for unknown keys (see :mod:`perfsdk.errors`)."""
    from perfsdk.errors import format_validation_error

    return format_validation_error(err, prefix, model or Config)


def parse_config(data: Any, source: str = "config") -> Config:
    """Validate a dict (or ``Config``) into a :class:`Config`; errors name field paths."""
    if isinstance(data, Config):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: invalid configuration: {_format_validation_error(err)}") from None


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file safely; a missing or malformed file raises :class:`ConfigError`."""
    from perfsdk import yamlio

    return yamlio.read_yaml(path, what="config file", error=ConfigError)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], parsed value). Values are parsed as YAML scalars."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key.path=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise ConfigError(f"--set {item!r}: empty key path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def set_dotted(data: dict[str, Any], parts: list[str], value: Any) -> None:
    """``data[parts[0]]...[parts[-1]] = value``, creating mappings on the way.

    Raises ``ValueError("<a.b> is not a mapping")`` when a step on the path holds a non-mapping.
    """
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = {}
            node[part] = nxt
        if not isinstance(nxt, dict):
            raise ValueError(f"{'.'.join(parts[: i + 1])} is not a mapping")
        node = nxt
    node[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a raw config dict (not validated yet)."""
    out = copy.deepcopy(data) if data else {}
    for item in overrides:
        parts, value = parse_override(item)
        try:
            set_dotted(out, parts, value)
        except ValueError as err:
            raise ConfigError(f"--set {item!r}: {err}") from None
    return out


def load_config(source: str | Path | dict[str, Any] | Config | None = None, overrides: list[str] | None = None) -> Config:
    """Load and validate a configuration from a YAML path, a dict, a ``Config`` or nothing."""
    if isinstance(source, Config):
        if not overrides:
            return source
        raw: Any = source.model_dump()
        label = "config"
    elif isinstance(source, (str, Path)):
        raw = read_yaml(source)
        label = str(source)
        if raw is None:
            raw = {}
    else:
        raw = source or {}
        label = "config"
    if overrides:
        if not isinstance(raw, dict):
            raise ConfigError(f"{label}: expected a mapping at the top level")
        raw = apply_overrides(raw, overrides)
    cfg = parse_config(raw, label)
    if isinstance(source, (str, Path)):
        cfg = _resolve_relative_paths(cfg, Path(source).resolve().parent)
    return cfg


def _resolve_relative_paths(cfg: Config, base: Path) -> Config:
    """Prompt files, image folders and local model folders are resolved relative to the config file."""
    wl = cfg.workload
    if not wl.prompts.startswith("builtin:") and not Path(wl.prompts).is_absolute():
        candidate = base / wl.prompts
        if candidate.exists() or not Path(wl.prompts).exists():
            wl = wl.model_copy(update={"prompts": str(candidate)})
    ds = wl.dataset
    if ds is not None and not Path(ds.path).expanduser().is_absolute() and (base / ds.path).exists():
        wl = wl.model_copy(update={"dataset": ds.model_copy(update={"path": str(base / ds.path)})})
    imgs = wl.images
    if imgs and imgs not in ("auto", "none") and not imgs.startswith("builtin:") and not Path(imgs).is_absolute():
        cand = base / imgs
        if cand.exists() or not Path(imgs).exists():
            wl = wl.model_copy(update={"images": str(cand)})
    mid = cfg.model.id
    if mid.startswith((".", "/")) and not Path(mid).is_absolute():
        cand = base / mid
        if cand.exists():
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"id": str(cand)})})
    return cfg.model_copy(update={"workload": wl})


def quickstart_config() -> Config:
    """The built-in quickstart: the embedded tiny model on the mixed prompt set."""
    return Config(name="quickstart")

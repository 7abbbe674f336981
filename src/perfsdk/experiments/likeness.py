"""Whether two runs measured the same thing: their workloads, models and hardware, field by field.

``perfsdk compare`` lists every difference before its table: a run that generated 32 tokens per
request is not slower or faster than one that generated 16, it did something else. Fields one
of the runs does not record (a run stored before the field existed, a session without a
workload config) are not differences; settings that only decide how long a run measures
(warm-up runs, minimum iterations or duration) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfsdk.schemas import RunResult

#: Config workload settings that change how long a run measures, not what it measures.
RUN_LENGTH = ("warmup_runs", "min_iterations", "min_duration_s")
#: What a run's prompts really were, beside the settings (the same file edited, another tokenizer).
WORKLOAD_INFO = {"input_tokens_mean": "input tokens per prompt (mean)",
                 "vision_tokens_mean": "vision tokens per request (mean)"}
MODEL = ("model_id", "model_class", "architecture", "model_type", "parameters", "dtype", "quantization",
         "quant_type", "quant_compute_dtype", "attn_implementation", "num_layers", "hidden_size",
         "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
HARDWARE = ("cpu_model", "cpu_cores_logical", "ram_bytes", "gpu_names", "gpu_driver", "cuda_version",
            "torch_threads")


@dataclass(frozen=True)
class Difference:
    """One field in which two runs differ."""

    group: str  # workload | model | hardware
    field: str
    baseline: Any
    candidate: Any

    def __str__(self) -> str:
        return f"{self.group} {self.field}: {_show(self.baseline)} -> {_show(self.candidate)}"

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "field": self.field, "baseline": self.baseline, "candidate": self.candidate}


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v)) or "none"
    return str(v)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def run_facts(run: RunResult) -> dict[str, dict[str, Any]]:
    """What ``run`` measured: ``{"workload": {...}, "model": {...}, "hardware": {...}}``."""
    workload = {f"workload.{k}": v for k, v in _flat(run.config.get("workload") or {}).items()
                if k.split(".", 1)[0] not in RUN_LENGTH}
    if run.workload is not None:
        workload.update({label: getattr(run.workload, k) for k, label in WORKLOAD_INFO.items()})
    model = {k: getattr(run.model, k) for k in MODEL} if run.model is not None else {}
    hardware = {k: getattr(run.environment, k) for k in HARDWARE}
    if run.model is not None:
        hardware["device"] = run.model.device
    return {"workload": workload, "model": model, "hardware": hardware}


def differences(baseline: RunResult, candidate: RunResult) -> list[Difference]:
    """Every field of :func:`run_facts` that both runs record and in which they differ."""
    fa, fb = run_facts(baseline), run_facts(candidate)
    out = []
    for group in fa:
        for k, va in fa[group].items():
            vb = fb[group].get(k)
            if va is None or vb is None or va == vb:
                continue
            out.append(Difference(group, k, va, vb))
    return out

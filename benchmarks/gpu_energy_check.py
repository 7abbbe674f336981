"""GPU check: a generate workload on CUDA with NVML energy, utilization, latency and memory.

Runs a randomly initialized Llama (1024 wide, 8 layers, bf16) through ``perfsdk.session`` with
the default collectors and prints the figures ``docs/energy.md`` quotes: joules per output
token per phase from the NVML counter, power, GPU utilization, latency and CUDA memory.

Usage: ``PYTHONPATH=src python benchmarks/gpu_energy_check.py [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import perfsdk  # noqa: E402


def _pick(d: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: d[k] for k in keys if d and k in d}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda (the check); cpu only to smoke-test this script")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to(a.device, dtype).eval()
    ids = torch.randint(3, 31990, (a.batch, a.input_tokens), device=a.device)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens,
              min_new_tokens=a.new_tokens, do_sample=False)
    run_cfg = {"collectors": {"utilization": {"interval_s": 0.1}}}
    with perfsdk.session(run_cfg, store=None) as s:
        s.load(model=model, tokenizer=None)
        with s.warmup():
            s.generate(model, **kw)
        for _ in range(a.steps):
            s.generate(model, **kw)
        with s.stage("idle_1s"):  # nothing runs: the stage shows the GPU's idle power
            time.sleep(1.0)
    r = s.result
    e = r.collectors.get("energy", {})
    u = r.collectors.get("utilization", {})
    gpu_key = next((k for k in e.get("energy_j", {}) if k.startswith("nvml:")), None)
    phases = {ph: v.get(gpu_key) for ph, v in e.get("per_phase", {}).items()
              if gpu_key in v and (not ph.startswith("step:") or ph == "step:1")}
    report = {
        "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None, "torch": torch.__version__, "status": r.status,
        "errors": [f"{x.source}/{x.hook}: {x.message}" for x in r.errors],
        "workload": {"batch": a.batch, "input_tokens": a.input_tokens, "new_tokens": a.new_tokens,
                     "measured_steps": a.steps},
        "energy": {
            "status": e.get("status"), "sources": e.get("sources"), "key": gpu_key,
            "session_energy_j": e.get("energy_j"), "steps_energy_j": e.get("steps_energy_j"),
            "output_tokens": e.get("output_tokens"), "j_per_output_token": e.get("j_per_output_token"),
            "output_tokens_per_j": e.get("output_tokens_per_j"), "per_phase": phases,
            "low_confidence_windows": sum(1 for w in e.get("windows", []) if w.get("low_confidence")),
            "windows": len(e.get("windows", [])), "notes": e.get("notes"),
        },
        "utilization": {
            "samples": u.get("samples"), "gpus": u.get("gpus"),
            "per_phase_gpu_util_mean": {ph: [g["utilization_pct"]["mean"] for g in v["gpus"]]
                                        for ph, v in u.get("per_phase", {}).items()},
            "per_phase_gpu_power_mean": {ph: [g["power_w"]["mean"] for g in v["gpus"]]
                                         for ph, v in u.get("per_phase", {}).items()},
            "sampler_cpu_s_per_s": u.get("sampler_cpu_s_per_s"), "notes": u.get("notes"),
        },
        "latency": r.collectors.get("latency"),
        "memory": r.collectors.get("memory"),
        "environment_nvml": _pick(r.environment.model_dump() if hasattr(r.environment, "model_dump") else {},
                                  ("nvml_available", "nvml_reason", "gpu_names", "driver", "cuda")),
    }
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU check: a generate workload on CUDA with NVML energy, utilization, latency and memory.

Runs a randomly initialized Llama (1024 wide, 8 layers, bf16) through ``perfsdk.session`` with
the default collectors and prints the figures ``docs/energy.md`` quotes: joules per output
token per phase from the NVML counter, power, GPU utilization, latency, CUDA memory and the
validity verdict (GPU clocks, throttle reasons, other GPU processes).

CUDA events recorded around every timed ``s.generate`` and ``s.forward`` call are set beside the
session's own step times for the same calls (host clock, device synchronized at each edge), and
a forward is timed by a host timer that does not synchronize, as a naive timer would.

Usage: ``PYTHONPATH=src python benchmarks/gpu_energy_check.py [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import perfsdk  # noqa: E402


def _pick(d: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: d[k] for k in keys if d and k in d}


class _Events:
    """CUDA events recorded around each timed call in the session, to set beside the session's own
    step times (host clock, device synchronized at the step's edges) for the very same calls."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.pairs: list[tuple[Any, Any]] = []

    def __call__(self, fn: Any) -> Any:
        if not self.on:
            return fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        self.pairs.append((start, end))
        return out

    def seconds(self) -> list[float]:
        torch.cuda.synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in self.pairs]


def _clock_check(steps: list[Any], event_s: list[float], model: Any, fwd_kw: dict[str, Any], n: int) -> dict[str, Any]:
    """Per timed step: the session's duration over the CUDA-event duration of the same call; and
    a forward timed by a host timer that does not synchronize (what a naive timer reads)."""
    out: dict[str, Any] = {}
    for kind in ("generate", "forward"):
        pairs = [(st.duration_s, e) for st, e in zip(steps, event_s) if st.kind == kind and st.duration_s]
        if not pairs:
            continue
        ratios = [a / b for a, b in pairs]
        out[kind] = {"steps": len(pairs), "session_p50_s": statistics.median([a for a, _ in pairs]),
                     "event_p50_s": statistics.median([b for _, b in pairs]), "ratio_p50": statistics.median(ratios),
                     "ratio_min": min(ratios), "ratio_max": max(ratios)}
    naive = []
    with torch.inference_mode():
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            model(**fwd_kw)
            naive.append((time.perf_counter_ns() - t0) / 1e9)
    out["forward_host_unsynced_p50_s"] = statistics.median(naive)
    return out


def _counter_refresh(seconds: float = 1.5) -> dict[str, Any]:
    """How often NVML's total-energy counter and power reading change, idle and under load:
    poll both as fast as the host can for ``seconds`` and take the median gap between changes."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)

    def poll() -> dict[str, Any]:
        t_end = time.perf_counter() + seconds
        last_e = last_p = None
        e_changes: list[float] = []
        p_changes: list[float] = []
        reads = 0
        while time.perf_counter() < t_end:
            t = time.perf_counter()
            e, p = pynvml.nvmlDeviceGetTotalEnergyConsumption(h), pynvml.nvmlDeviceGetPowerUsage(h)
            reads += 1
            if last_e is not None and e != last_e:
                e_changes.append(t)
            if last_p is not None and p != last_p:
                p_changes.append(t)
            last_e, last_p = e, p

        def gaps(ts: list[float]) -> float | None:
            d = [b - a for a, b in zip(ts, ts[1:])]
            return statistics.median(d) * 1e3 if d else None
        return {"reads": reads, "read_us": seconds / reads * 1e6, "energy_changes": len(e_changes),
                "energy_gap_ms_p50": gaps(e_changes), "power_changes": len(p_changes), "power_gap_ms_p50": gaps(p_changes)}

    idle = poll()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 10
    for _ in range(int((seconds + 0.5) / per)):  # queued on the GPU; the host polls while it runs
        a @ a
    busy = poll()
    torch.cuda.synchronize()
    return {"idle": idle, "busy": busy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--forward-steps", type=int, default=20, help="timed forwards (prefill-sized) in the session")
    ap.add_argument("--device", default="cuda", help="cuda (the check); cpu only to smoke-test this script")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-counter-refresh", action="store_true", help="skip measuring NVML's refresh period")
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
        fwd = dict(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        with s.warmup():  # every shape the timed steps use
            s.generate(model, **kw)
            s.forward(model, **fwd)
        ev = _Events(a.device.startswith("cuda"))
        for _ in range(a.steps):
            ev(lambda: s.generate(model, **kw))
        for _ in range(a.forward_steps):
            ev(lambda: s.forward(model, **fwd))
        with s.stage("idle_1s"):  # nothing runs: the stage shows the GPU's idle power
            time.sleep(1.0)
    r = s.result
    timed = [st for st in s.steps if not st.warmup and not st.instrumented]
    events = _clock_check(timed, ev.seconds(), model, fwd, a.forward_steps) if ev.on else None
    refresh = _counter_refresh() if a.device.startswith("cuda") and not a.no_counter_refresh else None
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
            "j_per_output_token_per_phase": e.get("j_per_output_token_per_phase"),
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
        "clock_check": events,
        "nvml_refresh": refresh,
        "validity": r.validity.model_dump(mode="json") if getattr(r, "validity", None) is not None else None,
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

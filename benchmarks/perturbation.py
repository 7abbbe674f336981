"""Do the instrumenting collectors disturb the latency figures? On against off, alternating.

The same workload runs in two arms: *off* with the default collectors, *on* with ``flops``,
``layers`` and ``torch_profiler`` added. Those three instrument steps (dispatch-mode counting,
forward hooks, the profiler); the session gives them instrumented copies of timed steps, run
after the timed ones and left out of every statistic, so the *on* arm's TTFT and TPOT should be
the *off* arm's. The arms alternate round by round (and which goes first alternates too), so
both see the same machine. Per-request TTFT and TPOT samples are pooled over rounds per arm,
and the ratio on/off of p50 and p99 is compared with the targets: p50 within 1.03, p99 within
1.10. The median over rounds of the per-round ratios is printed beside them.

    PYTHONPATH=src python benchmarks/perturbation.py                       # defaults below
    PYTHONPATH=src python benchmarks/perturbation.py --rounds 2 --prompts 4 --iterations 1 --new-tokens 4  # smoke

Run it on an otherwise idle machine: other processes on the cores move p99 far more than the
collectors do. Exit status 0 when every ratio meets its target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import perfsdk  # noqa: E402
from perfsdk.config import ModelConfig  # noqa: E402
from perfsdk.models.loader import load_model  # noqa: E402
from perfsdk.models.runner import run_workload  # noqa: E402
from perfsdk.stats import percentile  # noqa: E402

INSTRUMENTING = {"flops": {}, "layers": {}, "torch_profiler": {"save_traces": False}}
TARGETS = {"p50": 1.03, "p99": 1.10}
METRICS = ("ttft_s", "tpot_s")


def config(args: argparse.Namespace, on: bool) -> dict[str, Any]:
    collectors: dict[str, Any] = {"energy": {"codecarbon": {"enabled": False}}}
    if on:
        collectors.update(INSTRUMENTING)
    return {
        "name": f"perturbation-{'on' if on else 'off'}",
        "model": {"id": args.model, "device": args.device},
        "workload": {"prompts": "builtin:mixed", "num_prompts": args.prompts, "batching": {"batch_size": args.batch},
                     "generate": {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens},
                     "warmup_runs": args.warmup, "min_iterations": args.iterations},
        "collectors": collectors,
        "exporters": [],
    }


def run_arm(model: Any, tok: Any, args: argparse.Namespace, on: bool) -> dict[str, Any]:
    """One session of one arm: per-request samples, instrumented steps, the verdict."""
    with perfsdk.session(config(args, on), store=None) as s:
        s.load(model=model, tokenizer=tok)
        run_workload(s)
    assert s.result is not None
    rows = list(s.series.get("requests", []))
    lat = s.result.collectors["latency"]
    return {
        "ttft_s": [float(r["ttft_s"]) for r in rows],
        "tpot_s": [float(r["tpot_s"]) for r in rows if r.get("tpot_s") is not None],
        "instrumented_steps": lat.get("instrumented_steps", 0),
        "timed_steps": lat.get("steps", 0),
        "verdict": s.result.validity.verdict if s.result.validity else None,
        "errors": [f"{e.source}/{e.hook}: {e.message}" for e in s.result.errors],
    }


def pct(values: list[float], q: float) -> float:
    return percentile(sorted(values), q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-llama")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=10, help="sessions per arm, alternating")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=5, help="timed passes over the prompts per session")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else \
        ("cpu" if args.device == "auto" else args.device)
    model, tok = load_model(ModelConfig(id=args.model, device=device))
    pooled: dict[bool, dict[str, list[float]]] = {True: {m: [] for m in METRICS}, False: {m: [] for m in METRICS}}
    per_round: dict[str, list[float]] = {f"{m}.{q}": [] for m in METRICS for q in TARGETS}
    arms_info: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for k in range(args.rounds):
        got: dict[bool, dict[str, Any]] = {}
        for on in ((True, False) if k % 2 else (False, True)):
            got[on] = run_arm(model, tok, args, on)
            arms_info[on].append({x: got[on][x] for x in ("instrumented_steps", "timed_steps", "verdict", "errors")})
            for m in METRICS:
                pooled[on][m].extend(got[on][m])
        for m in METRICS:
            if got[True][m] and got[False][m]:
                for q in TARGETS:
                    per_round[f"{m}.{q}"].append(pct(got[True][m], float(q[1:])) / pct(got[False][m], float(q[1:])))
    rows = []
    ok = True
    for m in METRICS:
        for q, limit in TARGETS.items():
            on_v, off_v = pct(pooled[True][m], float(q[1:])), pct(pooled[False][m], float(q[1:]))
            ratio = on_v / off_v
            ok = ok and ratio <= limit
            rounds = per_round[f"{m}.{q}"]
            rows.append({"metric": f"{m} {q}", "off_s": off_v, "on_s": on_v, "ratio": ratio, "limit": limit,
                         "round_ratio_median": statistics.median(rounds) if rounds else None,
                         "samples_off": len(pooled[False][m]), "samples_on": len(pooled[True][m]),
                         "meets": ratio <= limit})
    meta = {"model": args.model, "device": device, "rounds": args.rounds, "prompts": args.prompts,
            "batch": args.batch, "new_tokens": args.new_tokens, "iterations": args.iterations,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "instrumented_steps_per_on_session": sorted({a["instrumented_steps"] for a in arms_info[True]}),
            "verdicts": {"on": [a["verdict"] for a in arms_info[True]], "off": [a["verdict"] for a in arms_info[False]]},
            "errors": sorted({e for arm in arms_info.values() for a in arm for e in a["errors"]})}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows, "ok": ok}, indent=2))
    else:
        for k, v in meta.items():
            print(f"{k:<36} {v}")
        print(f"{'metric':<12} {'off':>10} {'on':>10} {'ratio':>7} {'limit':>6} {'per-round median':>17}  samples")
        for r in rows:
            med = f"{r['round_ratio_median']:.3f}" if r["round_ratio_median"] is not None else "-"
            print(f"{r['metric']:<12} {r['off_s'] * 1e3:>8.3f}ms {r['on_s'] * 1e3:>8.3f}ms {r['ratio']:>7.3f} "
                  f"{r['limit']:>6.2f} {med:>17}  {r['samples_off']}/{r['samples_on']}"
                  + ("" if r["meets"] else "  OVER"))
        print("ok" if ok else "FAIL: a ratio is over its target")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

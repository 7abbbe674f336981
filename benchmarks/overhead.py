"""Overhead of measuring: the same generate workload bare and inside a session.

Rounds alternate bare / session (and which goes first) so that drift on a shared machine
affects both equally. Each round generates ``--steps`` batches; tokens/s is output tokens over
the wall time of the loop (the same for both arms). Per-call figures compare the median and the
fastest single ``generate`` call of each arm, which are less sensitive to machine noise. Reported: the median of the per-round ratios (session / bare), the
sampler thread's CPU time (total and per second of run), and the fixed cost of starting and
finalizing a session, which is paid once per run and is reported separately.

    python benchmarks/overhead.py [--rounds 7] [--steps 6] [--batch-size 4] [--max-new-tokens 32]
    python benchmarks/overhead.py --collectors latency,memory      # a chosen set
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import perfsdk
from perfsdk.config import ModelConfig
from perfsdk.models.loader import load_model
from perfsdk.models.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--collectors", default=None, help="comma-separated set instead of the defaults")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="config override for the session arm, e.g. collectors.utilization.interval_s=0.5")
    ap.add_argument("--interleaved-calls", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tok = load_model(ModelConfig())
    prompts = load_prompts("builtin:mixed", args.batch_size, seed=0)
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True)
    # a fixed number of tokens per step, so both arms do exactly the same work
    gen = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False,
               pad_token_id=tok.pad_token_id)
    out_tokens_per_step = args.batch_size * args.max_new_tokens

    from perfsdk.config import apply_overrides

    cfg: dict = {"name": "overhead"}
    if args.collectors:
        from perfsdk.plugins import collect_registry, get_plugin_manager

        names = set(args.collectors.split(","))
        reg = collect_registry(get_plugin_manager())
        cfg["collectors"] = {n: ({} if n in names else False) for n in reg.collectors if reg.collectors[n].default_enabled or n in names}

    cfg = apply_overrides(cfg, args.overrides)
    with torch.inference_mode():  # warm both paths
        model.generate(**batch, **gen)

    ratios, bare_tps, sess_tps, sampler_cpu, fixed = [], [], [], [], []
    bare_calls: list[float] = []
    sess_calls: list[float] = []

    def bare_arm() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(args.steps):
                c0 = time.perf_counter()
                model.generate(**batch, **gen)
                bare_calls.append(time.perf_counter() - c0)
        return out_tokens_per_step * args.steps / (time.perf_counter() - t0)

    def session_arm() -> float:
        f0 = time.perf_counter()
        s = perfsdk.session(cfg, store=None)
        s.start()
        f1 = time.perf_counter()
        for _ in range(args.steps):
            c0 = time.perf_counter()
            s.generate(model, **batch, **gen)
            sess_calls.append(time.perf_counter() - c0)
        f2 = time.perf_counter()
        s.finalize()
        f3 = time.perf_counter()
        assert s.result is not None and s.result.collectors["latency"]["output_tokens"] == out_tokens_per_step * args.steps
        sampler_cpu.append((s.sampler.cpu_time_s, (s.end_ns - s.start_ns) / 1e9))
        fixed.append((f1 - f0) + (f3 - f2))
        session_arm.collectors = sorted(s.collectors)  # type: ignore[attr-defined]
        return out_tokens_per_step * args.steps / (f2 - f1)

    for i in range(args.rounds):
        # alternate which arm goes first, so drift and ordering effects cancel
        if i % 2 == 0:
            bare, sess = bare_arm(), session_arm()
        else:
            sess, bare = session_arm(), bare_arm()
        ratios.append(sess / bare)
        bare_tps.append(bare)
        sess_tps.append(sess)

    # Interleaved: one open session, bare and instrumented calls alternating call by call. The
    # sampler runs for both arms, so this isolates the per-call cost of the instrumentation.
    inter_bare: list[float] = []
    inter_sess: list[float] = []
    s_int = perfsdk.session(cfg, store=None)
    s_int.start()
    for _ in range(args.interleaved_calls):
        c0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(**batch, **gen)
        inter_bare.append(time.perf_counter() - c0)
        c0 = time.perf_counter()
        s_int.generate(model, **batch, **gen)
        inter_sess.append(time.perf_counter() - c0)
    s_int.finalize()

    cpu_total = sum(c for c, _ in sampler_cpu)
    run_total = sum(d for _, d in sampler_cpu)
    report = {
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "collectors": session_arm.collectors,  # type: ignore[attr-defined]
        "bare_tokens_per_s_median": statistics.median(bare_tps),
        "session_tokens_per_s_median": statistics.median(sess_tps),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "per_call_median_ratio": statistics.median(bare_calls) / statistics.median(sess_calls),
        "per_call_fastest_ratio": min(bare_calls) / min(sess_calls),
        "sampler_cpu_s_total": cpu_total,
        "sampler_cpu_s_per_s": cpu_total / run_total if run_total else None,
        "session_start_plus_finalize_s_median": statistics.median(fixed),
        "interleaved_calls": args.interleaved_calls,
        "interleaved_median_ratio": statistics.median(inter_bare) / statistics.median(inter_sess),
        "torch_threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for k, v in report.items():
        print(f"{k:40s} {v:.4f}" if isinstance(v, float) else f"{k:40s} {v}")


if __name__ == "__main__":
    main()

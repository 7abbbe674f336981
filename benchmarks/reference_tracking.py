"""How closely work follows the calibration's reference workload over minutes.

Times, in one process and one thread, cycle after cycle for ``SECONDS``: the reference workload
(``REFERENCE_MODEL`` at ``REFERENCE_SHAPE``, twice a cycle: at its start and its end), and six
phases of other work — a 1024-token prefill and a batch-1 decode of ``tiny-llama-medium``, TTFT and
decode of the accuracy benchmark's GPT-2 (batch 1) and Qwen2 (batch 4) at a 32-token prompt —
each the median of three calls. Then, for each phase: its scatter over the cycles (rms of the log
time), its slope on the reference's log time (the exponent ``b`` that
:func:`perfsdk.simulation.calibration.reference_tracking` estimates), and its scatter once
divided by the reference's level and by the level to the power ``b``; for the reference, the
scatter between its two timings of a cycle (its own noise).

With ``--narrow``, three phases of the calibration's narrow models are added (the 64-wide Llama
at 8 layers, TTFT and decode at batch 4 and a 32-token prompt; the 256-wide at 4 layers, decode at
batch 4), and a second reference of the narrow kind is timed beside the first (``NARROW_REFERENCE``
at ``REFERENCE_SHAPE``): every phase is then also regressed on that second reference's level alone,
and on both levels at once (least squares on the logs), with the scatter each leaves.

With ``--cache`` instead, the second reference is one whose weights lie in cache
(``CACHE_REFERENCE`` at ``REFERENCE_SHAPE``), and the phases added are the batch-1 decodes of the
accuracy benchmark's small unseen families (``CACHE_PHASES``: OPT, Falcon, BLOOM, GPT-J; their
weights lie in cache too), regressed the same way. A shift of the cache that the process gets lasts
minutes, longer than one cycle: ``--block N`` (default 6) gives each phase's scatter also over the
medians of N consecutive cycles, divided by either reference's level over the same cycles.

Usage: ``PYTHONPATH=src python benchmarks/reference_tracking.py [SECONDS] [--narrow | --cache]
[--block N] [--json OUT]``; run it with nothing else busy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PHASES = ["prefill1024", "medium_decode", "gpt2_ttft", "gpt2_decode", "qwen2_ttft", "qwen2_decode"]
NARROW_PHASES = ["narrow64_ttft", "narrow64_decode", "narrow256_decode"]
#: the second reference of ``--narrow``: the calibration's narrowest model, call-bound
NARROW_REFERENCE = "builtin:tiny-llama-medium@hidden=64@layers=2"
#: the second reference of ``--cache``: one of the calibration's models whose weights (about 8 MB)
#: lie in cache
CACHE_REFERENCE = "builtin:tiny-llama-medium@hidden=256@layers=4"
CACHE_PHASES = ["opt_decode", "falcon_decode", "bloom_decode", "gptj_decode"]


def _rms(values: list[float]) -> float:
    m = statistics.fmean(values)
    return math.sqrt(statistics.fmean((v - m) ** 2 for v in values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seconds", type=float, nargs="?", default=300.0)
    ap.add_argument("--narrow", action="store_true",
                    help="add the narrow models' phases and a second, narrow reference (see above)")
    ap.add_argument("--cache", action="store_true",
                    help="add the small families' decodes and a second reference whose weights lie in cache")
    ap.add_argument("--block", type=int, default=6, help="cycles per block for the scatter over minutes")
    ap.add_argument("--json", help="write every cycle's timings and the summary here")
    args = ap.parse_args(argv)
    if args.narrow and args.cache:
        ap.error("--narrow and --cache each add a second reference: give one of them")
    if args.block < 1:
        ap.error("--block must be at least 1")

    import torch

    from perfsdk.simulation.calibration import REFERENCE_MODEL, REFERENCE_SHAPE, build_random_model
    from perfsdk.simulation.calibration.measure import measure_generate
    from simulation_accuracy import build_model

    torch.set_num_threads(1)
    ref = build_random_model(REFERENCE_MODEL)
    medium = build_random_model("builtin:tiny-llama-medium")
    gpt2, qwen2 = build_model("family:gpt2"), build_model("family:qwen2-tied")

    def gen(model: object, b: int, i: int, o: int, reps: int = 3) -> tuple[float, float]:
        m = measure_generate(model, b, i, o, repeats=reps, warmup=False, label="x")
        return m.ttft_s, m.decode_s

    def reference() -> float:
        return sum(gen(ref, *REFERENCE_SHAPE))

    extra: dict = {}  # the second reference ("ref") and the models of the added phases
    if args.narrow:
        extra = {"ref": build_random_model(NARROW_REFERENCE),
                  "w64": build_random_model("builtin:tiny-llama-medium@hidden=64@layers=8"),
                  "w256": build_random_model("builtin:tiny-llama-medium@hidden=256@layers=4")}
    elif args.cache:
        extra = {"ref": build_random_model(CACHE_REFERENCE),
                  **{ph: build_model("family:" + ph.removesuffix("_decode")) for ph in CACHE_PHASES}}
    second = bool(extra)
    phases = PHASES + (NARROW_PHASES if args.narrow else CACHE_PHASES if args.cache else [])
    for model, shape in ((ref, REFERENCE_SHAPE), (medium, (1, 1024, 2)), (gpt2, (1, 32, 8)), (qwen2, (4, 32, 8)),
                         *((extra[k], REFERENCE_SHAPE if k == "ref" else (4, 32, 8) if args.narrow else (1, 32, 8))
                           for k in extra)):
        gen(model, *shape, reps=1)  # warm-up
    rows = []
    t0 = time.time()
    while time.time() - t0 < args.seconds:
        row = {"t": time.time() - t0, "reference_start": reference()}
        if second:
            row["second_reference_start"] = sum(gen(extra["ref"], *REFERENCE_SHAPE))
        if args.narrow:
            row["narrow64_ttft"], row["narrow64_decode"] = gen(extra["w64"], 4, 32, 8)
            row["narrow256_decode"] = gen(extra["w256"], 4, 32, 8)[1]
        for ph in CACHE_PHASES if args.cache else []:
            row[ph] = gen(extra[ph], 1, 32, 8)[1]
        row["prefill1024"] = gen(medium, 1, 1024, 2, 1)[0]
        row["medium_decode"] = gen(medium, 1, 16, 8)[1]
        row["gpt2_ttft"], row["gpt2_decode"] = gen(gpt2, 1, 32, 8)
        row["qwen2_ttft"], row["qwen2_decode"] = gen(qwen2, 4, 32, 8)
        row["reference_end"] = reference()
        if second:
            row["second_reference_end"] = sum(gen(extra["ref"], *REFERENCE_SHAPE))
        rows.append(row)
    if len(rows) < 3:
        print("too few cycles: give more seconds", file=sys.stderr)
        return 2
    level = [math.log(r["reference_start"] * r["reference_end"]) / 2 for r in rows]
    mx = statistics.fmean(level)
    summary: dict = {"cycles": len(rows), "seconds": args.seconds,
                     "reference_own_noise_pct": 100 * _rms([math.log(r["reference_start"] / r["reference_end"])
                                                            for r in rows]),
                     "reference_scatter_pct": 100 * _rms(level), "phases": {},
                     "second_reference": (NARROW_REFERENCE if args.narrow else CACHE_REFERENCE if args.cache
                                          else None), "block": args.block}
    second_level = ([math.log(r["second_reference_start"] * r["second_reference_end"]) / 2 for r in rows]
                    if second else [])
    for ph in phases:
        y = [math.log(r[ph]) for r in rows]
        my = statistics.fmean(y)
        b = (sum((x - mx) * (v - my) for x, v in zip(level, y)) / sum((x - mx) ** 2 for x in level))
        summary["phases"][ph] = {
            "scatter_pct": 100 * _rms(y), "slope": b,
            "scatter_divided_by_level_pct": 100 * _rms([v - x for v, x in zip(y, level)]),
            "scatter_divided_by_level_to_slope_pct": 100 * _rms([v - b * x for v, x in zip(y, level)])}
        if second:
            summary["phases"][ph].update(_on_two_levels(y, level, second_level))
        summary["phases"][ph].update(_over_blocks(y, level, second_level, args.block))
    print(f"{len(rows)} cycles in {time.time() - t0:.0f} s; reference: scatter {summary['reference_scatter_pct']:.1f} %, "
          f"its two timings of a cycle apart by {summary['reference_own_noise_pct']:.1f} % (rms)")
    if second:
        print(f"second reference: {summary['second_reference']} at {REFERENCE_SHAPE}")
    print("phase             scatter  slope  /level  /level^slope" + (
        "  second: slope  /level^slope   both: slopes  /levels^slopes" if second else "")
        + f"   over blocks of {args.block}: scatter  /level" + ("  /second level" if second else ""))
    for ph, d in summary["phases"].items():
        line = (f"{ph:17s} {d['scatter_pct']:6.1f} % {d['slope']:6.2f} {d['scatter_divided_by_level_pct']:6.1f} % "
                f"{d['scatter_divided_by_level_to_slope_pct']:6.1f} %")
        if second:
            line += (f"  {d['second_slope']:13.2f} {d['second_scatter_pct']:8.1f} %   {d['both_slopes'][0]:5.2f}, "
                     f"{d['both_slopes'][1]:5.2f} {d['both_scatter_pct']:8.1f} %")
        if d.get("blocks"):
            line += f"   {d['block_scatter_pct']:20.1f} % {d['block_divided_by_level_pct']:6.1f} %"
            if second:
                line += f" {d['block_divided_by_second_level_pct']:12.1f} %"
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "summary": summary}, fh, indent=2)
    return 0


def _on_two_levels(y: list[float], a: list[float], b: list[float]) -> dict:
    """``y`` (log times) regressed on the second reference's log level ``b`` alone and on both
    ``a`` and ``b`` (least squares with an intercept): the slopes and the rms residual, percent."""
    import numpy as np

    yy = np.asarray(y) - np.mean(y)
    aa, bb = np.asarray(a) - np.mean(a), np.asarray(b) - np.mean(b)
    s1 = float(bb @ yy / (bb @ bb))
    coef, *_ = np.linalg.lstsq(np.column_stack([aa, bb]), yy, rcond=None)
    return {"second_slope": s1, "second_scatter_pct": 100 * float(np.sqrt(np.mean((yy - s1 * bb) ** 2))),
            "both_slopes": [float(coef[0]), float(coef[1])],
            "both_scatter_pct": 100 * float(np.sqrt(np.mean((yy - np.column_stack([aa, bb]) @ coef) ** 2)))}


def _over_blocks(y: list[float], a: list[float], b: list[float], n: int) -> dict:
    """The scatter (rms, percent) of the medians of ``n`` consecutive cycles of ``y`` (log times),
    as they are and divided by the medians of the reference's level ``a`` over the same cycles
    (and of the second reference's ``b`` when given): how far a shift lasting minutes moves the
    phase, and how much of it either reference sees. Empty with fewer than three blocks."""
    k = len(y) // n
    if k < 3:
        return {}

    def med(v: list[float]) -> list[float]:
        return [statistics.median(v[i * n:(i + 1) * n]) for i in range(k)]

    yb, ab = med(y), med(a)
    out = {"blocks": k, "block_scatter_pct": 100 * _rms(yb),
           "block_divided_by_level_pct": 100 * _rms([v - x for v, x in zip(yb, ab)])}
    if b:
        out["block_divided_by_second_level_pct"] = 100 * _rms([v - x for v, x in zip(yb, med(b))])
    return out


if __name__ == "__main__":
    sys.exit(main())

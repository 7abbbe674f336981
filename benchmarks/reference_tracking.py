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

Usage: ``PYTHONPATH=src python benchmarks/reference_tracking.py [SECONDS] [--json OUT]``; run it
with nothing else busy.
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


def _rms(values: list[float]) -> float:
    m = statistics.fmean(values)
    return math.sqrt(statistics.fmean((v - m) ** 2 for v in values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seconds", type=float, nargs="?", default=300.0)
    ap.add_argument("--json", help="write every cycle's timings and the summary here")
    args = ap.parse_args(argv)

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

    for model, shape in ((ref, REFERENCE_SHAPE), (medium, (1, 1024, 2)), (gpt2, (1, 32, 8)), (qwen2, (4, 32, 8))):
        gen(model, *shape, reps=1)  # warm-up
    rows = []
    t0 = time.time()
    while time.time() - t0 < args.seconds:
        row = {"t": time.time() - t0, "reference_start": reference()}
        row["prefill1024"] = gen(medium, 1, 1024, 2, 1)[0]
        row["medium_decode"] = gen(medium, 1, 16, 8)[1]
        row["gpt2_ttft"], row["gpt2_decode"] = gen(gpt2, 1, 32, 8)
        row["qwen2_ttft"], row["qwen2_decode"] = gen(qwen2, 4, 32, 8)
        row["reference_end"] = reference()
        rows.append(row)
    if len(rows) < 3:
        print("too few cycles: give more seconds", file=sys.stderr)
        return 2
    level = [math.log(r["reference_start"] * r["reference_end"]) / 2 for r in rows]
    mx = statistics.fmean(level)
    summary: dict = {"cycles": len(rows), "seconds": args.seconds,
                     "reference_own_noise_pct": 100 * _rms([math.log(r["reference_start"] / r["reference_end"])
                                                            for r in rows]),
                     "reference_scatter_pct": 100 * _rms(level), "phases": {}}
    for ph in PHASES:
        y = [math.log(r[ph]) for r in rows]
        my = statistics.fmean(y)
        b = (sum((x - mx) * (v - my) for x, v in zip(level, y)) / sum((x - mx) ** 2 for x in level))
        summary["phases"][ph] = {
            "scatter_pct": 100 * _rms(y), "slope": b,
            "scatter_divided_by_level_pct": 100 * _rms([v - x for v, x in zip(y, level)]),
            "scatter_divided_by_level_to_slope_pct": 100 * _rms([v - b * x for v, x in zip(y, level)])}
    print(f"{len(rows)} cycles in {time.time() - t0:.0f} s; reference: scatter {summary['reference_scatter_pct']:.1f} %, "
          f"its two timings of a cycle apart by {summary['reference_own_noise_pct']:.1f} % (rms)")
    print("phase          scatter  slope  /level  /level^slope")
    for ph, d in summary["phases"].items():
        print(f"{ph:14s} {d['scatter_pct']:6.1f} % {d['slope']:6.2f} {d['scatter_divided_by_level_pct']:6.1f} % "
              f"{d['scatter_divided_by_level_to_slope_pct']:6.1f} %")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "summary": summary}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

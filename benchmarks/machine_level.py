"""How far this machine's own speed moves over minutes: the floor under any two calibrations.

Times the calibration's reference workload (``REFERENCE_MODEL`` at ``REFERENCE_SHAPE``, each
timing the median of five calls, as a calibration times it) back to back for ``SECONDS``, in one
process and one thread, and records beside each timing the process's CPU time and the machine's
steal time (``/proc/stat`` through psutil). Then, over consecutive windows of ``--window``
seconds (a calibration lasts two to six minutes): each window's median, 10th and 25th
percentile, how far the windows' medians and percentiles stand apart (largest over smallest),
the share of the wall time the process spent on the CPU, and the steal time's share.

A calibration's seconds are the reference's median over the calibration: two calibrations cannot
agree in seconds more closely than the windows' medians here do. CPU time equal to the wall time
with no steal means the machine itself ran slower (memory, caches, clock), not that the process
was descheduled.

Usage: ``PYTHONPATH=src python benchmarks/machine_level.py [SECONDS] [--window S] [--json OUT]``;
run it with nothing else busy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def window_stats(rows: list[dict], window_s: float) -> list[dict]:
    """Per window of ``window_s`` seconds (``at`` of each row): timings, median, 10th and 25th
    percentile (ms), the share of the wall time on the process's CPU and the steal time's share of
    the machine's CPU time (the two cores' wall time). Windows with fewer than ten timings are left out."""
    from perfsdk.stats import percentile

    cores = os.cpu_count() or 1
    out = []
    n = int(max((r["at"] for r in rows), default=0.0) // window_s) + 1
    for k in range(n):
        w = [r for r in rows if k * window_s <= r["at"] < (k + 1) * window_s]
        if len(w) < 10:
            continue
        ref = sorted(r["ref_s"] for r in w)
        wall = sum(r["wall_s"] for r in w)
        out.append({"window": k, "start_s": k * window_s, "timings": len(w),
                    "median_ms": percentile(ref, 50) * 1e3, "p10_ms": percentile(ref, 10) * 1e3,
                    "p25_ms": percentile(ref, 25) * 1e3,
                    "cpu_share": sum(r["cpu_s"] for r in w) / wall,
                    "steal_share": sum(r["steal_s"] for r in w) / (wall * cores)})
    return out


def apart_pct(windows: list[dict], key: str) -> float:
    """Largest over smallest of ``key`` across the windows, in percent above 1."""
    vals = [w[key] for w in windows]
    return 100 * (max(vals) / min(vals) - 1) if vals else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seconds", nargs="?", type=float, default=480.0, help="how long to time (default 480)")
    ap.add_argument("--window", type=float, default=120.0, help="window length, seconds (default 120)")
    ap.add_argument("--json", help="write every timing and the windows here")
    args = ap.parse_args(argv)

    import psutil
    import torch

    from perfsdk.simulation.calibration import ReferenceTimer

    torch.set_num_threads(1)
    ref = ReferenceTimer()
    rows = []
    t0 = time.time()
    while time.time() - t0 < args.seconds:
        s0, w0, c0 = psutil.cpu_times(), time.perf_counter(), time.process_time()
        t = ref.tick()
        s1, w1, c1 = psutil.cpu_times(), time.perf_counter(), time.process_time()
        rows.append({"at": time.time() - t0, "ref_s": t, "wall_s": w1 - w0, "cpu_s": c1 - c0,
                     "steal_s": float(getattr(s1, "steal", 0.0) - getattr(s0, "steal", 0.0))})
    windows = window_stats(rows, args.window)
    print(f"{len(rows)} timings of the reference in {time.time() - t0:.0f} s, windows of {args.window:g} s")
    print("window  timings  median ms  p10 ms  p25 ms  on CPU  steal")
    for w in windows:
        print(f"{w['window']:6d}  {w['timings']:7d}  {w['median_ms']:9.2f}  {w['p10_ms']:6.2f}  {w['p25_ms']:6.2f}  "
              f"{100 * w['cpu_share']:5.1f} %  {100 * w['steal_share']:4.1f} %")
    print(f"windows apart (largest over smallest): median {apart_pct(windows, 'median_ms'):.1f} %, "
          f"p10 {apart_pct(windows, 'p10_ms'):.1f} %, p25 {apart_pct(windows, 'p25_ms'):.1f} %")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"timings": rows, "windows": windows, "window_s": args.window}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

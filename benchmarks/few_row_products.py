"""What a matrix product with a few rows costs against one row, by the weight's shape.

For each weight shape ``[N, K]`` (stored as ``nn.Linear`` stores it), ``F.linear`` of 1, 2, 4
and 8 rows, each weight cycled over enough copies (at least ``--cycle-mb``) that it streams from
memory rather than cache, in ``--threads`` threads (default one); each time the median of
``--repeats`` cycles, per product. ``--shapes 4096x512,8192x256`` times those shapes instead; the
last line gives the geometric mean of the 2-, 4- and 8-row ratios over the shapes timed (what the
calibration keeps over its staircases' shapes, ``few_row_shapes``).
Prints the times, the ratio of 4 rows to 1, and what the rows beyond the first cost per MB of
weights and per stored row: the decode of a batch of 4 is made of such products, and what the
cost model prices for them (``matmul_pack_rows``, ``matmul_pack_gbs``, ``matmul_half_rows``,
``matmul_ns_per_weight_row``) is fitted on the calibration's models, whose weights have 64-1408
columns.

Usage: ``python benchmarks/few_row_products.py [--threads 2] [--shapes NxK,...] [--json OUT]``; run it
with nothing else busy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPES = [(1024, 256), (256, 1024), (8192, 256), (4096, 512), (1408, 512), (512, 1408), (2048, 768),
          (768, 2048), (4096, 256), (16384, 384)]
ROWS = (1, 2, 4, 8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycle-mb", type=float, default=96.0, help="bytes of weight copies cycled over, MB")
    ap.add_argument("--repeats", type=int, default=5, help="cycles per timing (their median is kept)")
    ap.add_argument("--json", help="write the timings here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--shapes", help="weights to time, NxK comma-separated (default: a fixed set of ten)")
    args = ap.parse_args(argv)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    out = []
    print("weight [N, K]      MB   1 row µs  2 rows  4 rows  8 rows  4/1   beyond the first: µs/MB  ns/row")
    with torch.inference_mode():
        for n, k in shapes:
            mb = n * k * 4 / 1e6
            copies = [torch.randn(n, k) for _ in range(max(1, int(args.cycle_mb // mb)))]
            times = {}
            for r in ROWS:
                x = torch.randn(r, k)
                cycles = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    for w in copies:
                        F.linear(x, w)
                    cycles.append((time.perf_counter() - t0) / len(copies))
                times[r] = statistics.median(cycles)
            extra = times[4] - times[1]
            row = {"n": n, "k": k, "mb": mb, "seconds": {str(r): t for r, t in times.items()},
                   "ratio_4_to_1": times[4] / times[1], "extra_us_per_mb": extra * 1e6 / mb,
                   "extra_ns_per_row": extra * 1e9 / n}
            out.append(row)
            print(f"[{n:5d}, {k:4d}] {mb:7.2f} {times[1] * 1e6:9.1f} {times[2] * 1e6:7.1f} {times[4] * 1e6:7.1f} "
                  f"{times[8] * 1e6:7.1f} {row['ratio_4_to_1']:5.2f} {row['extra_us_per_mb']:12.1f} "
                  f"{row['extra_ns_per_row']:12.1f}", flush=True)
            del copies
    mean = {r: statistics.geometric_mean(o["seconds"][str(r)] / o["seconds"]["1"] for o in out) for r in ROWS[1:]}
    print("geometric mean of the ratios over the shapes: "
          + ", ".join(f"{r} rows {m:.2f}" for r, m in mean.items()), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": out, "cycle_mb": args.cycle_mb, "repeats": args.repeats, "threads": args.threads,
                       "geometric_mean": {str(r): m for r, m in mean.items()}}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

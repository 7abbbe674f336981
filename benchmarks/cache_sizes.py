"""Memory rate against working-set size: does this machine have a cache a calibration could see?

One thread (``--threads``) cycles matrix-vector products over N matrices of 1 MB each (512 x 512,
float32), for working sets of 1 to 128 MB (``--sizes``, in MB), and prints the bytes streamed per
second (median of seven timings, the slowest and fastest beside). A working set that fits a cache
runs at the cache's rate; the step down is its size. The calibration's fit prices a cache only
where its models show it (see docs/simulation.md, "Calibration"); its own check times working
sets of 4 to 96 MiB, so a step beyond that shows only here, with ``--sizes`` reaching past it
(on one 2-core Xeon host the rate stepped down between 32 and 128 MB while ``lscpu`` reported a
480 MiB L3).

Usage: ``python benchmarks/cache_sizes.py [--threads N] [--sizes 32,96,256,512,1024]``; run it with
nothing else busy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SIZES_MB = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES_MB)), help="working sets, MB, comma-separated")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    v = torch.randn(512, 1)
    for mb in (int(x) for x in args.sizes.split(",") if x.strip()):
        mats = [torch.randn(512, 512) for _ in range(mb)]
        for w in mats:
            w @ v
        per_byte = []
        for _ in range(7):
            reps = max(1, 64 // mb)
            t = time.perf_counter()
            for _ in range(reps):
                for w in mats:
                    w @ v
            per_byte.append((time.perf_counter() - t) / (reps * mb * 2**20))
        print(f"{mb:4d} MB: {1 / statistics.median(per_byte) / 1e9:6.2f} GB/s "
              f"(slowest {1 / max(per_byte) / 1e9:.2f}, fastest {1 / min(per_byte) / 1e9:.2f})")


if __name__ == "__main__":
    main()

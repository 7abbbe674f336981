"""Memory rate against working-set size: does this machine have a cache a calibration could see?

One thread (``--threads``) cycles matrix-vector products over N matrices of 1 MB each (512 x 512,
float32), for working sets of 1 to 128 MB (``--sizes``, in MB), and prints the bytes streamed per
second (median of seven timings, the slowest and fastest beside). A working set that fits a cache
runs at the cache's rate; the step down is its size. The calibration's fit prices a cache only
where its models show it (see docs/simulation.md, "Calibration"); its own check times working
sets of 4 to 96 MiB, so a step beyond that shows only here, with ``--sizes`` reaching past it
(on one 2-core Xeon host the rate stepped down between 32 and 128 MB while ``lscpu`` reported a
480 MiB L3).

``--weights 1024x1024,256x256`` cycles weights of those shapes (out x in, float32) instead, one
shape after another, and prints beside each working set the share of its bytes the cache serves,
its time per byte placed between the smallest set's and the largest's (what the calibration's
``cache_shares`` reads off its own working sets of 4 MiB weights): on a 2-core AMD host, two threads,
working sets of 16 MB kept nothing cached over weights of 0.25-1 MiB and 0.10-0.39 over 4 MiB ones.

Usage: ``python benchmarks/cache_sizes.py [--threads N] [--sizes 32,96,256,512,1024] [--weights
1024x1024,256x256]``; run it with nothing else busy.
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
    ap.add_argument("--weights", default="512x512",
                    help="weight shapes cycled, OUTxIN (float32), comma-separated (default 512x512, 1 MiB)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [float(x) for x in args.sizes.split(",") if x.strip()]
    shapes = []
    for shape in (s for s in args.weights.split(",") if s.strip()):
        try:
            out, inner = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            ap.error(f"--weights: {shape!r} is not OUTxIN (two whole numbers, say 1024x256)")
        shapes.append((out, inner))
    for out, inner in shapes:
        timings = working_sets(out, inner, sizes)
        per_byte = [statistics.median(ts) for ts in timings]
        print(f"[{out}, {inner}] float32 weights, {out * inner * 4 / 2**20:.2f} MiB each:")
        for mb, t, ts in zip(sizes, per_byte, timings):
            share = ""
            if len(sizes) > 2 and per_byte[-1] > per_byte[0]:
                share = f"; share from the cache {(per_byte[-1] - t) / (per_byte[-1] - per_byte[0]):5.2f}"
            print(f"  {mb:6g} MB: {1 / t / 1e9:6.2f} GB/s (slowest {1 / max(ts) / 1e9:.2f}, "
                  f"fastest {1 / min(ts) / 1e9:.2f}){share}")


def working_sets(out: int, inner: int, sizes: list[float]) -> list[list[float]]:
    """Seconds per byte of one-row products cycled over copies of an ``[out, inner]`` float32
    weight filling each working set of ``sizes`` MB (2**20 bytes): seven timings each."""
    nbytes = out * inner * 4
    x = torch.randn(1, inner)
    mats = [torch.randn(out, inner) for _ in range(max(1, round(max(sizes) * 2**20 / nbytes)))]
    result = []
    for mb in sizes:
        count = max(1, round(mb * 2**20 / nbytes))
        for w in mats[:count]:
            torch.nn.functional.linear(x, w)
        times = []
        for _ in range(7):
            reps = max(1, round(64 * 2**20 / (count * nbytes)))
            t = time.perf_counter()
            for _ in range(reps):
                for w in mats[:count]:
                    torch.nn.functional.linear(x, w)
            times.append((time.perf_counter() - t) / (reps * count * nbytes))
        result.append(times)
    return result


if __name__ == "__main__":
    main()

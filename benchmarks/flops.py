"""FLOPs benchmark: meta-device counting cost, and the slowdown the counter adds to a real forward.

Usage::

    PYTHONPATH=src python benchmarks/flops.py [--models llama-2-7b,llama-3-70b] [--input-tokens 512]
                                              [--output-tokens 128] [--reps 5] [--json]

Each meta-device count runs in a fresh child process so that its peak RSS (``ru_maxrss``) is its
own; the time excludes importing torch/transformers (reported separately) but includes the lazy
import of the architecture's modeling module on first use; a second count in the same process
shows the cost without it. The forward slowdown
compares the median wall time of a real forward of the embedded tiny model (random weights)
plain, under perfsdk's counter, and under ``torch.utils.flop_counter.FlopCounterMode``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401
from perfsdk.flops.meta import resolve_config, count_config
from perfsdk.flops.analytic import analytic_generate
t1 = time.perf_counter()
name, b, t, g, full = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
cfg, _ = resolve_config(name)
c = count_config(cfg, b, t, g, full_depth=full)
t2 = time.perf_counter()
count_config(cfg, b, t, g, full_depth=full)  # again, with transformers' model modules already imported
t3 = time.perf_counter()
a = analytic_generate(cfg, b, t, g)
print(json.dumps({"model": name, "full_depth": full, "import_s": t1 - t0, "count_s": t2 - t1, "second_count_s": t3 - t2, "flops_total": c.flops_total,
                  "analytic_flops_total": a.flops_total, "method": c.method,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def meta_cost(model: str, b: int, t: int, g: int, full_depth: bool) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(b), str(t), str(g), "1" if full_depth else "0"],
                         capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def forward_slowdown(reps: int, tokens: int) -> dict[str, Any]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    from perfsdk.capture import OperationCapture
    from perfsdk.models.tiny import tiny_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))

    def timed(ctx_factory: Any) -> float:
        times = []
        for _ in range(reps):
            with torch.inference_mode(), ctx_factory():
                t0 = time.perf_counter()
                model(input_ids=ids)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    import contextlib

    timed(contextlib.nullcontext)  # warm-up
    plain = timed(contextlib.nullcontext)
    ours = timed(lambda: OperationCapture(model))
    theirs = timed(lambda: FlopCounterMode(display=False))
    return {"model": "builtin:tiny-llama (random weights)", "tokens": tokens, "plain_s": plain,
            "perfsdk_capture_s": ours, "flop_counter_mode_s": theirs,
            "perfsdk_slowdown_x": ours / plain, "flop_counter_mode_slowdown_x": theirs / plain}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-2-7b,llama-3-70b")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--forward-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [meta_cost(m, args.batch_size, args.input_tokens, args.output_tokens, full)
            for m in args.models.split(",") for full in (False, True)]
    fwd = forward_slowdown(args.reps, args.forward_tokens)
    if args.json:
        print(json.dumps({"meta": rows, "forward": fwd}, indent=2))
        return
    print(f"meta-device count, batch {args.batch_size}, {args.input_tokens} input + {args.output_tokens} output tokens")
    print(f"{'model':<14} {'depth':<12} {'count s':>8} {'again s':>8} {'import s':>9} {'peak RSS MiB':>13} {'FLOPs':>22}  exact vs analytic")
    for r in rows:
        depth = "all layers" if r["full_depth"] else "replicated"
        print(f"{r['model']:<14} {depth:<12} {r['count_s']:>8.2f} {r['second_count_s']:>8.2f} {r['import_s']:>9.2f} {r['peak_rss_bytes'] / 2**20:>13.0f} "
              f"{r['flops_total']:>22,}  {r['flops_total'] == r['analytic_flops_total']}")
    print(f"real forward of {fwd['model']}, {fwd['tokens']} tokens, median of {args.reps}:")
    print(f"  plain {fwd['plain_s'] * 1e3:.1f} ms | perfsdk counter {fwd['perfsdk_capture_s'] * 1e3:.1f} ms "
          f"({fwd['perfsdk_slowdown_x']:.2f}x) | FlopCounterMode {fwd['flop_counter_mode_s'] * 1e3:.1f} ms "
          f"({fwd['flop_counter_mode_slowdown_x']:.2f}x)")


if __name__ == "__main__":
    main()

"""Is ``load_s`` the model's? First load in a fresh process against a second load in it.

A fresh Python process opens a session and ``s.load()``s the model (``import_s`` is the
one-time imports and set-up, timed apart), then a second session in the same process loads it
again. Every one-time cost left inside ``load_s`` shows as a first load slower than the second;
the check passes when the first ``load_s`` is within ``--max-ratio`` (2) times the second. Each
round runs in a new process; the medians over rounds are compared.

    PYTHONPATH=src python benchmarks/load_time.py                      # embedded tiny-llama
    PYTHONPATH=src python benchmarks/load_time.py --model builtin:tiny-llama-small --rounds 5

Exit status 0 when the check passes, 1 when it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys
import perfsdk
cfg = {"model": {"id": sys.argv[1], "device": "cpu"}, "collectors": {"energy": False, "utilization": False}}
out = []
for _ in range(2):
    with perfsdk.session(cfg, store=None) as s:
        s.load()
    out.append({"load_s": s.model_info.load_s, "import_s": s.model_info.import_s})
print(json.dumps(out))
"""


def one_round(model: str) -> tuple[dict[str, float], dict[str, float]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, model], capture_output=True, text=True, env=env, check=True)
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    return first, second


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-llama")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes")
    ap.add_argument("--max-ratio", type=float, default=2.0)
    args = ap.parse_args()
    rounds = [one_round(args.model) for _ in range(args.rounds)]
    first = statistics.median(r[0]["load_s"] for r in rounds)
    second = statistics.median(r[1]["load_s"] for r in rounds)
    imports = statistics.median(r[0]["import_s"] for r in rounds)
    ratio = first / second if second > 0 else float("inf")
    print(f"model={args.model} rounds={args.rounds}")
    print(f"first load_s (fresh process)  {first:.4f}")
    print(f"first import_s                {imports:.4f}")
    print(f"second load_s (same process)  {second:.4f}")
    ok = ratio <= args.max_ratio
    print(f"ratio {ratio:.2f} (limit {args.max_ratio:g}): {'ok' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

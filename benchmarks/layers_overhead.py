"""How much the ``layers`` collector slows a generate step down.

For each hook configuration, one session runs warm-up steps and then alternates instrumented
and plain steps of the same shape (``steps: {every: 2}``), so both see the same machine load.
It prints the median step time of each kind, the collector's own ``overhead_pct`` (medians per
shape, see docs/profiling.md), the share of step time spent inside the hook functions, and the
coverage.

    PYTHONPATH=src python benchmarks/layers_overhead.py                 # embedded tiny-llama
    PYTHONPATH=src python benchmarks/layers_overhead.py --batch 1 --tokens 16 --iterations 20

Runs in under a minute on two idle CPU cores with the defaults (a loaded machine stretches it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import perfsdk  # noqa: E402
from perfsdk.config import ModelConfig  # noqa: E402
from perfsdk.models.loader import load_model  # noqa: E402

#: (label, layers settings): everything, down to the decoder layers' children, top level only.
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("all modules", {}),
    ("max_depth=4", {"max_depth": 4}),
    ("max_depth=1", {"max_depth": 1}),
    ("all + log_events", {"log_events": True}),
]


def run_config(model: Any, settings: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One session: warm-up, then instrumented and plain steps alternating."""
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.tokens))
    mask = torch.ones_like(ids)
    # replay: false hooks every other timed step itself, so hooked and plain steps alternate under
    # the same machine load (by default the session would hook copies run after the timed steps)
    cfg = {"collectors": {"latency": False, "memory": False,
                          "layers": {"steps": {"every": 2}, **settings}},
           "instrumentation": {"replay": False}}
    gen = dict(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens,
               min_new_tokens=args.new_tokens, do_sample=False)
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=model, tokenizer=None)
        with s.warmup():
            for _ in range(args.warmup):
                s.generate(model, **gen)
        for _ in range(2 * args.iterations):
            s.generate(model, **gen)
    res = s.result.collectors["layers"] if s.result else {}
    measured = [st for st in s.steps if not st.warmup]
    instrumented = set(res.get("step_indices", []))
    on = [st.duration_s for st in measured if st.index in instrumented]
    off = [st.duration_s for st in measured if st.index not in instrumented]
    return {
        "modules_timed": res.get("modules_timed"),
        "instrumented_ms": statistics.median(on) * 1e3,
        "plain_ms": statistics.median(off) * 1e3,
        "overhead_pct": res.get("overhead_pct"),
        "hook_time_pct": res.get("hook_time_pct"),
        "coverage_pct": res.get("coverage_pct"),
        "steps_each": len(on),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-llama")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=6, help="instrumented (and as many plain) steps")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(ModelConfig(id=args.model, device="cpu"))
    model.eval()
    rows = [{"config": label, **run_config(model, settings, args)} for label, settings in CONFIGS]
    meta = {"model": args.model, "batch": args.batch, "input_tokens": args.tokens,
            "new_tokens": args.new_tokens, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    print(" ".join(f"{k}={v}" for k, v in meta.items()))
    print(f"{'config':<18} {'modules':>7} {'plain ms':>9} {'hooked ms':>9} {'overhead %':>10} "
          f"{'in hooks %':>10} {'coverage %':>10}")
    for r in rows:
        print(f"{r['config']:<18} {r['modules_timed']:>7} {r['plain_ms']:>9.2f} {r['instrumented_ms']:>9.2f} "
              f"{r['overhead_pct']:>10.1f} {r['hook_time_pct']:>10.2f} {r['coverage_pct']:>10.1f}")


if __name__ == "__main__":
    main()

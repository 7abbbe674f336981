"""How a decode step's time follows its ATen calls, family by family (CPU, one thread).

For each model (the accuracy benchmark's configurations, random weights, batch 1, a 32-token
prompt), counts the ATen calls of a decode step under operation capture, how many move no bytes
(views), and how many priced operations and kernel launches the cost model makes of them
(:func:`~perfsdk.simulation.predictor.as_module_calls`); then times the decode step of a bare
``generate`` loop ((9-token generate - 1-token generate) / 8, median of 5) and divides it by the
calls. Also times single view, transpose and small-add calls.

Usage: ``PYTHONPATH=src python benchmarks/simulation_call_counts.py [--models SPEC ...]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from simulation_accuracy import build_model  # noqa: E402

from perfsdk.capture.ops import OpRecord  # noqa: E402
from perfsdk.capture.recorder import OperationCapture  # noqa: E402
from perfsdk.simulation.costmodel import op_bytes  # noqa: E402
from perfsdk.simulation.predictor import as_module_calls  # noqa: E402

MODELS = ["builtin:tiny-llama-medium@hidden=256@layers=4", "family:falcon", "family:mixtral-swa", "family:bloom",
          "family:qwen2-tied"]


def _kw() -> dict[str, Any]:
    ids = torch.randint(5, 4000, (1, 32))
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)


def decode_counts(model: Any) -> dict[str, float]:
    with torch.inference_mode(), OperationCapture(model, auto_phase=True) as cap:
        model.generate(**_kw(), max_new_tokens=3, min_new_tokens=3)
    ops: list[OpRecord] = [r for r in cap.records if r.phase == "decode"]
    steps = len({r.step for r in ops}) or 1
    costed = [r for r in as_module_calls(ops) if r.flops or op_bytes(r)]
    return {"calls": len(ops) / steps, "views": sum(1 for r in ops if not (r.flops or op_bytes(r))) / steps,
            "priced_ops": sum(1 for r in costed if r.launches >= 1) / steps,
            "launches": sum(r.launches for r in costed) / steps}


def decode_step_s(model: Any, repeats: int = 5) -> float:
    kw = _kw()
    out = []
    with torch.inference_mode():
        model.generate(**kw, max_new_tokens=4, min_new_tokens=4)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.generate(**kw, max_new_tokens=9, min_new_tokens=9)
            t1 = time.perf_counter()
            model.generate(**kw, max_new_tokens=1, min_new_tokens=1)
            t2 = time.perf_counter()
            out.append(((t1 - t0) - (t2 - t1)) / 8)
    return statistics.median(out)


def per_call_us(fn: Any, n: int = 20000) -> float:
    with torch.inference_mode():
        for _ in range(1000):
            fn()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=MODELS)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    x = torch.randn(1, 4, 32, 64)
    print(f"view {per_call_us(lambda: x.view(1, 4, 2048)):.2f} us, transpose {per_call_us(lambda: x.transpose(1, 2)):.2f}"
          f" us, small add {per_call_us(lambda: x + 1.0):.2f} us")
    for spec in a.models:
        model = build_model(spec)
        c = decode_counts(model)
        t = decode_step_s(model)
        print(f"{spec}: {c['calls']:.0f} ATen calls a decode step, {c['views']:.0f} moving no bytes, "
              f"{c['priced_ops']:.0f} priced ops, {c['launches']:.0f} launches; decode step {t * 1e3:.2f} ms, "
              f"{t / c['calls'] * 1e6:.1f} us a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())

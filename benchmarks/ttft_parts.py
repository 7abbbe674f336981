"""Where a TTFT goes, measured and predicted, part by part.

For each model and batch, ``generate`` runs in a perfsdk session (default collectors, no store,
a warm-up call, then ``--calls`` calls; the medians printed) with a hook before and after the
model's forward, which splits the time to the first token into what ``generate`` and the session
do before the prefill's forward, the forward itself, and what follows it until the first token is
stamped. Beside it, the prediction of the same configuration from a calibrated profile: the
prefill's fixed costs (``step_overhead_s + prefill_overhead_s``), its kernel calls
(``prefill_call_overhead_s`` each) and the rest of its operations, as the central fit prices
them (the predicted TTFT is their sum times the bootstrap refits' median factor).

    PYTHONPATH=src python benchmarks/ttft_parts.py host.yaml family:gpt2 builtin:tiny-llama-small
    PYTHONPATH=src python benchmarks/ttft_parts.py host.yaml family:mixtral-swa --threads 1 --batches 1

Model specs as in ``simulation_accuracy.py`` (``family:NAME`` or a calibration model spec). A
few seconds per model on two idle CPU cores; time it with nothing else running.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import perfsdk  # noqa: E402
from perfsdk.hardware.profile import load_profile_file  # noqa: E402
from perfsdk.simulation.predictor import simulate_config  # noqa: E402
from simulation_accuracy import build_model  # noqa: E402


def measure(model: object, spec: str, batch: int, tokens: int, output: int, calls: int) -> dict[str, float]:
    """Median TTFT of ``calls`` session calls, and its three parts, in ms."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (batch, tokens), generator=g)  # type: ignore[attr-defined]
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=output, min_new_tokens=output,
              do_sample=False, pad_token_id=0)
    spans: list[list[int]] = []
    hooks = [model.register_forward_pre_hook(lambda *_: spans.append([time.perf_counter_ns()])),  # type: ignore[attr-defined]
             model.register_forward_hook(lambda *_: spans[-1].append(time.perf_counter_ns()))]  # type: ignore[attr-defined]
    cfg = perfsdk.Config.model_validate({"name": "ttft-parts", "model": {"id": spec}, "store": None,
                                         "workload": {"threads": torch.get_num_threads()}})
    parts: dict[str, list[float]] = {"ttft": [], "before": [], "forward": [], "after": []}
    try:
        with perfsdk.session(cfg) as s:
            s.load(model=model)
            with s.warmup():
                s.generate(model, **kw)
            for _ in range(calls):
                spans.clear()
                s.generate(model, **kw)
                step = s.steps[-1]
                first = step.token_times_ns[0]
                fwd = spans[0]
                parts["ttft"].append((first - step.start_ns) / 1e6)
                parts["before"].append((fwd[0] - step.start_ns) / 1e6)
                parts["forward"].append((fwd[1] - fwd[0]) / 1e6)
                parts["after"].append((first - fwd[1]) / 1e6)
    finally:
        for h in hooks:
            h.remove()
    return {k: statistics.median(v) for k, v in parts.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a calibrated hardware file (perfsdk calibrate -o FILE)")
    ap.add_argument("models", nargs="+", help="model specs: family:NAME or a calibration model spec")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,4", help="comma-separated batch sizes")
    ap.add_argument("--input-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=8)
    ap.add_argument("--calls", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    prof = load_profile_file(args.profile)[0]
    if prof.call_overhead_s is None:
        print(f"{args.profile}: not a calibrated profile (no call_overhead_s)", file=sys.stderr)
        return 2
    fixed = prof.step_overhead_s + prof.prefill_overhead_s
    print(f"profile {prof.name}: prefill fixed costs {fixed * 1e3:.3f} ms (step {prof.step_overhead_s * 1e3:.3f}, "
          f"prefill {prof.prefill_overhead_s * 1e3:.3f}), {prof.call_overhead_s * 1e6:.2f} us per kernel call of a "
          f"decode step, {(prof.prefill_call_overhead_s or prof.call_overhead_s) * 1e6:.2f} us of a prompt's; "
          f"{args.threads} torch threads")
    print("model | batch | TTFT measured | predicted (error) | before forward | forward | after forward | "
          "predicted: fixed | calls | other ops   (ms)")
    for spec in args.models:
        model = build_model(spec)
        for b in (int(x) for x in args.batches.split(",")):
            m = measure(model, spec, b, args.input_tokens, args.output_tokens, args.calls)
            kw = dict(batch_size=b, input_tokens=args.input_tokens, output_tokens=args.output_tokens, dtype="float32")
            r = simulate_config(model.config, prof, **kw)  # type: ignore[attr-defined, arg-type]
            # the parts from the central fit (without the calibration record: no bootstrap median
            # scaling every part), the TTFT as predicted
            central = simulate_config(model.config, prof.model_copy(update={"calibration": None}),  # type: ignore[attr-defined]
                                      **kw)  # type: ignore[arg-type]
            pf = central.phases["prefill"]
            calls = pf.overhead_s - fixed
            ttft = (r.ttft_s or 0.0) * 1e3
            print(f"{spec} | {b} | {m['ttft']:.2f} | {ttft:.2f} ({100 * (ttft / m['ttft'] - 1):+.1f} %) | "
                  f"{m['before']:.2f} | {m['forward']:.2f} | {m['after']:.2f} | {fixed * 1e3:.2f} | "
                  f"{calls * 1e3:.2f} | {(pf.time_s - pf.overhead_s) * 1e3:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

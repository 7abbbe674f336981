"""Where a decode step's time goes, call by call, against what a profile prices.

Every ATen call of ``generate`` is timed on the wall clock (a ``TorchDispatchMode`` around each
call; the timer adds a few microseconds a call, alike at every batch size). A decode step's cost is
taken as the difference between ``generate`` of ``--steps + 1`` new tokens and of one, over
``--steps``, the median of ``--repeats`` such pairs after a warm-up, at each batch size. Matrix
products are told apart by their weight's shape ``(inner, out)``. With ``--profile`` (a calibrated
profile, say the YAML ``perfsdk calibrate -o`` writes), each product is priced by the cost model
as the simulator prices it (the model's own ATen calls captured on the meta device, one decode
step, the step's resident bytes) and printed beside: what a product of a few rows costs against
its one-row time, measured and priced.

With ``--step`` (and ``--profile``) it also prints, per batch size, the whole step: the profile's
predicted TPOT (``simulate_config``, ``--steps + 1`` new tokens), the TPOT a perfsdk session measures
in each of ``--repeats`` rounds (``measure_in_session``, the median of five calls), and the matrix
products' time a step, timed call by call, against their price: what of a miss lies in the
products and what in the calls around them.

With ``--vocab A,B`` it also times the whole decode step without the per-call timer, as a perfsdk
session measures it (``measure_in_session``, the median of ``--repeats`` rounds, the two
vocabularies alternating), with the model's vocabulary at A and at B: the difference is what the
output layer's extra rows cost inside ``generate`` at each batch size, beside its price.

Usage: ``PYTHONPATH=src python benchmarks/decode_ops.py --model family:falcon [--profile host.yaml]
[--threads 1] [--batches 1,4] [--prompt 32] [--steps 32] [--repeats 5] [--top 20] [--vocab 8192,2048]
[--step]``; ``--model``
takes what ``benchmarks/simulation_accuracy.py`` builds (``builtin:NAME[@...]``, ``type:TYPE``,
``family:NAME``). Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _key(func: Any, args: tuple) -> str:
    name = func.__name__
    if name in ("mm.default", "addmm.default") and len(args) > 1:
        weight = args[2] if name == "addmm.default" else args[1]
        return f"{name.split('.')[0]} {tuple(weight.shape)}"
    return name


def measured_steps(model: Any, batch: int, prompt: int, steps: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Seconds a decode step spends in each kind of call and the calls it makes, by key."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    acc: dict[str, float] = defaultdict(float)
    cnt: dict[str, int] = defaultdict(int)

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            key = _key(func, args)
            acc[key] += time.perf_counter() - t0
            cnt[key] += 1
            return out

    ids = torch.randint(0, 1000, (batch, prompt))

    def gen(n: int) -> None:
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False)

    gen(steps + 1)  # warm-up
    pairs = []
    for _ in range(repeats):
        one: dict[int, tuple[dict[str, float], dict[str, int]]] = {}
        for n in (1, steps + 1):
            acc.clear()
            cnt.clear()
            with Timer():
                gen(n)
            one[n] = (dict(acc), dict(cnt))
        long, short = one[steps + 1], one[1]
        pairs.append({k: ((long[0][k] - short[0].get(k, 0.0)) / steps, (long[1][k] - short[1].get(k, 0)) / steps)
                      for k in long[0]})
    keys = set().union(*pairs)
    return {k: (statistics.median(p.get(k, (0.0, 0.0))[0] for p in pairs), pairs[0].get(k, (0.0, 0.0))[1])
            for k in keys}


def priced_products(config: Any, profile: Any, batch: int, prompt: int) -> dict[str, list[float]]:
    """Seconds the cost model gives each matrix product of one decode step, by weight shape."""
    from perfsdk.flops.meta import capture_generation_ops
    from perfsdk.simulation.costmodel import cost_op, inner_size, resident_bytes
    from perfsdk.simulation.predictor import as_module_calls, rescale_ops

    cap = capture_generation_ops(config, batch, prompt, 3, [1, 2])
    ops = as_module_calls(rescale_ops(cap.ops, "float32"))
    resident: dict[tuple[str, int], float] = defaultdict(float)
    for op in ops:
        resident[(op.phase, op.step)] += resident_bytes(op)
    out: dict[str, list[float]] = defaultdict(list)
    for op in ops:
        if op.phase != "decode" or op.step != 2 or op.category != "matmul" or not op.weight_bytes:
            continue
        shape = (int(round(inner_size(op))), int(op.output_shape[-1]) if op.output_shape else 0)
        out[f"mm {shape}"].append(cost_op(op, profile, "float32", resident[(op.phase, op.step)]).time_s)
    return out


def config_with_vocab(model: Any, vocab: int) -> Any:
    """``model``'s configuration with ``vocab`` tokens."""
    import copy

    cfg = copy.deepcopy(model.config)
    cfg.vocab_size = vocab
    return cfg


def with_vocab(model: Any, vocab: int) -> Any:
    """A model of ``model``'s configuration with ``vocab`` tokens (random weights, seed 0)."""
    from simulation_accuracy import model_from_config

    return model_from_config(config_with_vocab(model, vocab))


def head_rows_cost(model: Any, vocabs: tuple[int, int], batches: list[int], prompt: int, steps: int,
                   repeats: int) -> dict[int, tuple[float, float]]:
    """Per batch size, the median decode step (seconds, as a session measures it) at each of the
    two vocabularies, over ``repeats`` rounds in which the two alternate."""
    from perfsdk.simulation.calibration.measure import measure_in_session

    models = [with_vocab(model, v) for v in vocabs]
    times: dict[tuple[int, int], list[float]] = defaultdict(list)
    for _ in range(repeats):
        for i, m in enumerate(models):
            for b in batches:
                r = measure_in_session(m, b, prompt, steps + 1, calls=3, label="vocab")
                times[(i, b)].append(r.decode_s / steps)
    return {b: (statistics.median(times[(0, b)]), statistics.median(times[(1, b)])) for b in batches}


def print_step(model: Any, profile: Any, measured: dict[int, dict[str, tuple[float, float]]],
               priced: dict[int, dict[str, list[float]]], batches: list[int], prompt: int, steps: int,
               repeats: int) -> None:
    """Per batch size: the predicted TPOT, a session's TPOT in each round, and the matrix products'
    time a step, timed call by call (the timer's own time included) against their price."""
    from perfsdk.simulation.calibration.measure import measure_in_session
    from perfsdk.simulation.predictor import simulate_config

    print("The whole step, µs: predicted TPOT; a session's TPOT per round; the products a step, timed / priced")
    for b in batches:
        sim = simulate_config(model.config, profile, batch_size=b, input_tokens=prompt, output_tokens=steps + 1,
                              dtype="float32")
        rounds = [measure_in_session(model, b, prompt, steps + 1, calls=5, label="step").decode_s / steps
                  for _ in range(repeats)]
        # the products priced, found under the key the table above matches them by
        timed = sum(t for k, (t, _) in measured[b].items() if k.replace("addmm", "mm") in priced[b])
        price = sum(sum(v) for v in priced[b].values())
        predicted = f"{sim.tpot_s * 1e6:.0f}" if sim.tpot_s else "-"
        print(f"  batch {b}: predicted {predicted}; session {', '.join(f'{r * 1e6:.0f}' for r in rounds)}; "
              f"products {timed * 1e6:.0f} / {price * 1e6:.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", help="a calibrated profile (YAML) whose prices are printed beside")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=20, help="kinds of call printed, by time at the last batch size")
    ap.add_argument("--vocab", help="two vocabulary sizes A,B: the output layer's extra rows timed in the whole step")
    ap.add_argument("--step", action="store_true",
                    help="with --profile: the predicted TPOT, the session's TPOT per round and the products' sum, "
                         "timed against priced")
    args = ap.parse_args(argv)
    if args.step and not args.profile:
        ap.error("--step needs --profile")
    import torch

    from simulation_accuracy import build_model

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    model = build_model(args.model)
    profile = None
    if args.profile:
        from perfsdk.hardware.profile import load_profile_file

        profile = load_profile_file(args.profile)[0]
    measured = {b: measured_steps(model, b, args.prompt, args.steps, args.repeats) for b in batches}
    priced = {b: priced_products(model.config, profile, b, args.prompt) for b in batches} if profile else {}
    last = batches[-1]
    print(f"{args.model}, {args.threads} thread(s), {args.prompt}-token prompt: a decode step, µs")
    for b in batches:
        total = sum(t for t, _ in measured[b].values())
        calls = sum(c for _, c in measured[b].values())
        print(f"  batch {b}: {total * 1e6:.0f} µs in {calls:.0f} calls (the timer's own time included)")
    head = "call".ljust(44) + "".join(f"{'b' + str(b) + ' µs/call':>14}" for b in batches)
    if profile:
        head += "".join(f"{'b' + str(b) + ' priced':>12}" for b in batches)
    print(head + f"{'calls/step':>12}")
    keys = sorted(measured[last], key=lambda k: -measured[last][k][0])[:args.top]
    for k in keys:
        row = k.ljust(44)
        for b in batches:
            t, c = measured[b].get(k, (0.0, 0.0))
            row += f"{t / c * 1e6 if c else 0.0:14.1f}"
        if profile:
            for b in batches:
                p = priced[b].get(k.replace("addmm", "mm"))
                row += f"{statistics.mean(p) * 1e6:12.1f}" if p else f"{'':12}"
        print(row + f"{measured[last][k][1]:12.1f}")
    if args.step:
        print_step(model, profile, measured, priced, batches, args.prompt, args.steps, args.repeats)
    if args.vocab:
        a, b_ = (int(v) for v in args.vocab.split(","))
        steps = head_rows_cost(model, (a, b_), batches, args.prompt, args.steps, args.repeats)
        print(f"The whole decode step without the timer (a session's measurement, median of {args.repeats}), "
              f"vocabulary {a} against {b_}, µs:")
        base = None
        for b in batches:
            ta, tb = steps[b]
            extra = ta - tb
            base = extra if base is None else base
            row = (f"  batch {b}: {ta * 1e6:.0f} against {tb * 1e6:.0f}, the {abs(a - b_)} extra rows {extra * 1e6:.0f}"
                   f" ({extra / base:.2f} times batch {batches[0]}'s)")
            if profile:
                pa, pb = (sum(sum(v) for v in priced_products(config_with_vocab(model, n), profile, b,
                                                              args.prompt).values()) for n in (a, b_))
                row += f", priced {(pa - pb) * 1e6:.0f}"
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

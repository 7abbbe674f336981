"""How many passes do two calibrations of this machine need to agree, and where do they differ?

Runs ``--calibrations`` calibrations one after another, each as ``perfsdk calibrate`` and
``benchmarks/simulation_accuracy.py`` run them (``calibrate_here``: the default models and grid,
``--threads`` torch threads (default one), three calls of at least 0.2 s, drift-normalised,
shuffled passes) but with
``--passes`` round-robin passes, and keeps every pass's measurement, every reference timing and
every micro-kernel timing. Nothing is measured after that: each calibration is refitted from its
first ``k`` passes (``k`` = 3 .. ``--passes``) by replaying those timings through
``calibrate_here``, so that the same measurements answer for every number of passes.

For each ``k`` it predicts the families none of the calibrations measured (``FAMILY_MODELS`` and
``ANY_FAMILY_MODELS`` of ``simulation_accuracy.py``: batch 1 and 4, 8 and 32 new tokens, a
32-token prompt) from every calibration, brings each prediction to one reference level (the first
calibration's median reference time, with ``CalibrationRecord.speed_factor``) and prints the median
and the largest difference of each later calibration against the first (the target of "within 5 %"),
and, for the most passes, that difference by batch and phase with the coefficients beside.

It also prints how the passes scatter: each configuration's normalised time in each pass against
its median over the passes (rms), and, per pass, each model's mean over its configurations against
the part of it the configurations' own scatter accounts for (a slow stretch the reference missed
that fell on one model's configurations shows as the excess), and, for every pair of calibrations,
whether their inputs differ by more than that scatter explains: each configuration's median over
its passes compared at one reference level against the difference two such medians would show by
the passes' noise alone (a bootstrap over each calibration's passes). Near 1, the inputs differ by
that noise, which more passes narrow in the inputs (not necessarily in the predictions: the fit
carries what is left into its coefficients); well above 1, the machine was in a different state
for each, one that lasted longer than a calibration and that the reference workload did not follow.

Usage: ``PYTHONPATH=src python benchmarks/calibration_passes.py [--passes 6] [--calibrations 2]
[--threads N] [--refits 3,6] [--save REC] [--json OUT]``, and later ``--load REC`` to refit and
compare the kept timings again without measuring; about eight minutes a calibration at six passes (the default grid) on two cores. Run it with nothing
else busy. ``--models`` and ``--families`` (comma-separated) narrow it for a quick check;
``--grid 1:16:16,4:32:16,...`` (batch:prompt:new-token triples) tries another calibration grid.

``--against RUN.json`` (saved ``simulation_accuracy.py --json`` runs, comma-separated) scores every
calibration, refitted from all its passes, against those runs' measurements at their own reference
level: the unseen families' median and worst |error| and each Llama size's range. ``--cache-mb
64,...`` refits every calibration again with the cache held at each size (0: none) instead of the
one its working sets chose (the memory's rate fitted with the others), and prints how far apart
the calibrations then stand and, with ``--against``, how they score: whether another cache size
would predict better, from timings already taken (``--load REC --refits P`` with P the passes
kept skips the refits by passes). ``--share-step 8,...`` refits them with a cache of each size
whose share of a pass is a step (all of a pass inside it, none of one a quarter larger) in place of
the shares the working sets read. Every variant prints the fits' own errors, the median by
calibration model and phase: how well the cost model describes the configurations it was fitted
on. A run measured with another thread count is not scored.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pickle
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from simulation_accuracy import (ANY_FAMILY_MODELS, BATCHES, FAMILY_MODELS, INPUT_TOKENS,  # noqa: E402
                                 OUTPUTS, build_model)


@contextlib.contextmanager
def _patched(module: Any, **attrs: Any) -> Any:
    old = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def _grid(text: str) -> list[tuple[int, int, int]]:
    try:
        out = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part.strip()]
    except ValueError:
        out = []
    if not out or any(len(t) != 3 or min(t) < 1 for t in out):
        raise argparse.ArgumentTypeError(f"expected batch:input:output triples of positive integers, got {text!r}")
    return out  # type: ignore[return-value]


def record(models: list[str], passes: int, seed: int, grid: list[tuple[int, int, int]] | None = None,
           threads: int = 1) -> dict[str, Any]:
    """One calibration at ``passes`` passes, every timing it made kept in order."""
    import perfsdk.simulation.calibration.measure as m

    runs: dict[tuple[tuple[Any, ...], int], Any] = {}
    ticks: list[float] = []
    micro: list[Any] = []
    order: list[tuple[str, Any]] = []
    measure, tick, micro_obs = m.measure_in_session, m.ReferenceTimer.tick, m.micro_observations

    def measured(model: Any, b: int, i: int, o: int, **kw: Any) -> Any:
        out = measure(model, b, i, o, **kw)
        key = (kw["label"], b, i, o)
        runs[(key, kw["seed"])] = out
        order.append(("config", key))
        return out

    def ticked(self: Any) -> float:
        out = tick(self)
        ticks.append(out)
        order.append(("reference", len(ticks) - 1))
        return out

    def timed_micro(**kw: Any) -> Any:
        out = micro_obs(**kw)
        micro.append(out)
        return out

    with _patched(m, measure_in_session=measured, micro_observations=timed_micro), \
            _patched(m.ReferenceTimer, tick=ticked):
        fit, _ = m.calibrate_here(models, threads=threads, passes=passes, max_passes=passes, seed=seed, grid=grid)
    return {"runs": runs, "ticks": ticks, "micro": micro, "order": order, "seed": seed, "fit": fit, "grid": grid,
            "threads": threads}


def replay(rec: dict[str, Any], models: list[str], passes: int, built: dict[str, Any],
           cache_bytes: float | None = None, share_step: float | None = None) -> Any:
    """The calibration ``rec`` refitted from its first ``passes`` passes (nothing measured); with
    ``cache_bytes``, the cache held at that size (0: none) instead of the one the working sets chose,
    the memory's rate fitted with the others; with ``share_step``, a cache of that many bytes whose
    share of a pass is a step (:func:`step_shares`) in place of the working sets' shares."""
    import perfsdk.simulation.calibration.measure as m

    ticks, micro = iter(rec["ticks"]), iter(rec["micro"])
    build = m.build_random_model

    def ticked(self: Any) -> float:
        out = next(ticks)
        self.times.append(out)
        return out

    def model_of(spec: str) -> Any:
        if spec not in built:
            built[spec] = build(spec)
        return built[spec]

    held = {} if cache_bytes is None else {"measured_cache": lambda micro: cache_bytes,
                                           "cache_levels": lambda micro: (cache_bytes,) if cache_bytes else (),
                                           "memory_past_cache": lambda micro: None}
    if share_step:
        held = {"measured_cache": lambda micro: share_step,
                "cache_shares": lambda micro, cache: step_shares(share_step)}
    with _patched(m, measure_in_session=lambda model, b, i, o, **kw: rec["runs"][((kw["label"], b, i, o), kw["seed"])],
                  micro_observations=lambda **kw: next(micro), build_random_model=model_of, **held), \
            _patched(m.ReferenceTimer, tick=ticked):
        fit, _ = m.calibrate_here(models, threads=rec["threads"], passes=passes, max_passes=passes, seed=rec["seed"],
                                  grid=rec["grid"])
    return fit


def step_shares(cache_bytes: float) -> Any:
    """A cache's share of a pass as a step: all of a pass of up to ``cache_bytes``, none of one
    from a quarter more on (linear in log bytes between), where the working sets read a slope."""
    from perfsdk.hardware.profile import CacheShares

    return CacheShares(resident_bytes=[cache_bytes, 1.25 * cache_bytes], share=[1.0, 0.0])


def fit_residuals(fits: list[Any]) -> dict[str, float]:
    """The median of each calibration model's phase's own error in ``fits`` (the configurations
    the fit was made on, every fit pooled), signed %, by ``MODEL phase``."""
    pooled: dict[str, list[float]] = defaultdict(list)
    for fit in fits:
        for label, err in fit.errors_pct.items():
            if label.startswith("micro"):
                continue
            phase = "decode" if " decode" in label else "prefill"
            pooled[f"{label.split(' ')[0]} {phase}"].append(err)
    return {k: statistics.median(v) for k, v in sorted(pooled.items())}


def normalised_logs(rec: dict[str, Any]) -> dict[tuple[Any, ...], tuple[list[float], list[float]]]:
    """Each configuration's log TTFT and log decode time in every pass, as the fit takes them:
    divided by the reference level around it and brought to the calibration's reference median,
    both to the power of its tracking exponent."""
    from perfsdk.simulation.calibration import ReferenceTimer

    fit = rec["fit"]
    timer = ReferenceTimer(model=object())  # nothing timed: the recorded reference times, for level_at
    timer.times = list(rec["ticks"])
    level_of: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    last = -1
    for kind, what in rec["order"]:
        if kind == "reference":
            last = what
        else:
            level_of[what].append(timer.level_at(last))
    tracking = fit.reference_tracking if fit.reference_tracking is not None else 1.0
    out: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}
    for key, levels in level_of.items():
        times = [rec["runs"][(key, p)] for p in range(len(levels))]
        scale = [(fit.reference_s / lv) ** tracking for lv in levels]
        out[key] = ([math.log(t.ttft_s * s) for t, s in zip(times, scale)],
                    [math.log(t.decode_s * s) for t, s in zip(times, scale)])
    return out


def scatter(rec: dict[str, Any]) -> dict[str, float]:
    """How the passes of one calibration scatter once normalised (see the module docstring), in %."""
    from perfsdk.stats import rms

    logs_of = normalised_logs(rec)
    out: dict[str, float] = {}
    for j, phase in enumerate(("ttft", "decode")):
        dev: dict[tuple[Any, ...], list[float]] = {}
        for key, both in logs_of.items():
            mid = statistics.median(both[j])
            dev[key] = [x - mid for x in both[j]]
        passes = min(len(v) for v in dev.values())
        blocks, within, sizes = [], [], []
        for model in sorted({k[0] for k in dev}):
            keys = [k for k in dev if k[0] == model]
            for p in range(passes):
                mean = sum(dev[k][p] for k in keys) / len(keys)
                blocks.append(mean)
                within += [dev[k][p] - mean for k in keys]
                sizes.append(len(keys))
        n = statistics.median(sizes)
        every = [x for v in dev.values() for x in v[:passes]]
        w = rms(within) * math.sqrt(n / max(n - 1, 1))
        out[f"{phase}_pass_rms_pct"] = 100 * rms(every)
        out[f"{phase}_model_mean_rms_pct"] = 100 * rms(blocks)
        out[f"{phase}_model_mean_from_configs_pct"] = 100 * w / math.sqrt(n)
    return out


def between_within(a: dict[str, Any], b: dict[str, Any], draws: int = 2000) -> dict[str, float]:
    """Do two calibrations' inputs differ by more than their passes' scatter explains?

    Each configuration's input is the median of its normalised passes; compared at one level
    (each in units of its own calibration's reference median), two calibrations' inputs differ by
    ``between``. Had the machine's state been the same in both, that difference would be the
    noise of two medians of so many passes, whose size a bootstrap over each calibration's passes
    gives (``expected``). A ratio near 1 is that noise, which more passes narrow; well above 1, a
    state of the machine that lasts longer than a calibration and that the reference does not
    capture, which more passes inside one calibration cannot remove. In %, rms over the
    configurations and both phases (log ratios)."""
    import numpy as np

    from perfsdk.stats import rms

    la, lb = normalised_logs(a), normalised_logs(b)
    unit_a, unit_b = math.log(a["fit"].reference_s), math.log(b["fit"].reference_s)
    rng = np.random.default_rng(0)

    def boot_sd(xs: list[float]) -> float:
        x = np.asarray(xs)
        picks = rng.integers(0, len(x), size=(draws, len(x)))
        return float(np.std(np.median(x[picks], axis=1)))

    between, expected, z = [], [], []
    for key in sorted(set(la) & set(lb), key=str):
        for j in (0, 1):
            d = (statistics.median(la[key][j]) - unit_a) - (statistics.median(lb[key][j]) - unit_b)
            se = math.hypot(boot_sd(la[key][j]), boot_sd(lb[key][j]))
            between.append(d)
            expected.append(se)
            z.append(abs(d) / se if se > 0 else float("inf"))
    shift = statistics.median(between)
    apart, centred, noise = rms(between), rms(d - shift for d in between), rms(expected)
    return {"between_rms_pct": 100 * apart, "shift_pct": 100 * shift, "between_centred_rms_pct": 100 * centred,
            "expected_rms_pct": 100 * noise,
            "ratio": apart / noise if noise > 0 else float("inf"),
            "ratio_centred": centred / noise if noise > 0 else float("inf"),
            "beyond_2se_share": sum(v > 2 for v in z) / len(z), "figures": len(z)}


def predictions(fits: list[Any], families: list[str], configs: dict[str, Any]) -> dict[tuple[str, int, int], list[tuple[float, float]]]:
    """Each family's (TTFT, TPOT) from every fit, at the first fit's reference level."""
    from perfsdk.simulation.calibration import profile_from_fit
    from perfsdk.simulation.predictor import simulate_config

    profiles = [profile_from_fit(f, name="host-calibrated") for f in fits]
    level = fits[0].reference_s
    out: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for spec in families:
        for b in BATCHES:
            for o in OUTPUTS:
                row = []
                for prof in profiles:
                    res = simulate_config(configs[spec], prof, batch_size=b, input_tokens=INPUT_TOKENS, output_tokens=o,
                                          dtype="float32", name=spec)
                    f = prof.calibration.speed_factor(level) if level and prof.calibration is not None else 1.0
                    row.append(((res.ttft_s or 0.0) * f, (res.tpot_s or 0.0) * f))
                out[(spec, b, o)] = row
    return out


def scored(fits: list[Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each fit's predictions against a saved ``simulation_accuracy.py --json`` run's measurements,
    brought to that run's reference level (``CalibrationRecord.speed_factor``): median and worst
    |error| and the signed range over the unseen families' TTFT and TPOT, and each Llama size's
    signed range, in %."""
    from perfsdk.simulation.calibration import profile_from_fit
    from perfsdk.simulation.predictor import simulate_config

    level = run["summary"]["reference_s"]["measurement"]
    configs: dict[str, Any] = {}
    out = []
    for fit in fits:
        prof = profile_from_fit(fit, name="host-calibrated")
        f = prof.calibration.speed_factor(level) if prof.calibration is not None else 1.0
        fam: list[float] = []
        llama: dict[str, list[float]] = defaultdict(list)
        for row in run["rows"]:
            spec = ("family:" if row["family"] else "builtin:") + row["model"]
            if spec not in configs:
                model: Any = build_model(spec)
                configs[spec] = model.config
            res = simulate_config(configs[spec], prof, batch_size=row["batch"], input_tokens=row["input_tokens"],
                                  output_tokens=row["output_tokens"], dtype="float32", name=spec)
            errs = [100 * ((res.ttft_s or 0.0) * f * 1e3 / row["ttft_measured_ms"] - 1),
                    100 * ((res.tpot_s or 0.0) * f * 1e3 / row["tpot_measured_ms"] - 1)]
            if row["family"]:
                fam.extend(errs)
            else:
                llama[row["model"]].extend(errs)
        out.append({"median_pct": statistics.median(abs(e) for e in fam), "worst_pct": max(abs(e) for e in fam),
                    "range_pct": [min(fam), max(fam)], "llama_range_pct": {k: [min(v), max(v)] for k, v in llama.items()},
                    "cache_mb": fit.cache_bytes / 1e6, "memory_gbs": 1e-9 / fit.coefficients["s_per_byte"]})
    return out


def _print_scored(what: str, run_path: str, figures: list[dict[str, Any]]) -> None:
    for k, s in enumerate(figures, start=1):
        llama = ", ".join(f"{m} {lo:+.1f}..{hi:+.1f}" for m, (lo, hi) in s["llama_range_pct"].items())
        print(f"{what}, calibration {k} against {run_path}: unseen families median |error| {s['median_pct']:.1f} %, "
              f"worst {s['worst_pct']:.1f} % ({s['range_pct'][0]:+.1f}..{s['range_pct'][1]:+.1f}); {llama} "
              f"(cache {s['cache_mb']:.1f} MB, memory {s['memory_gbs']:.1f} GB/s)", flush=True)


def apart(preds: dict[tuple[str, int, int], list[tuple[float, float]]], k: int) -> list[float]:
    """Calibration ``k``'s predictions against the first's, signed %, TTFT and TPOT of every row."""
    return [100 * (row[k][j] / row[0][j] - 1) for row in preds.values() for j in (0, 1) if row[0][j] > 0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=6, help="passes of each calibration (at least 3)")
    ap.add_argument("--calibrations", type=int, default=2, help="calibrations one after another (at least 2)")
    ap.add_argument("--models", help="calibration models, comma-separated (default: perfsdk calibrate's)")
    ap.add_argument("--families", help="families to predict, comma-separated (default: the accuracy benchmark's unseen ones)")
    ap.add_argument("--grid", type=_grid, help="calibration grid, batch:input:output triples, comma-separated "
                                                "(default: perfsdk calibrate's, DEFAULT_CALIBRATION_GRID)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the calibrations (default 1)")
    ap.add_argument("--refits", type=lambda s: [int(x) for x in s.split(",") if x],
                    help="the numbers of passes to refit and compare, comma-separated (default: 3 up to --passes)")
    ap.add_argument("--save", help="keep every timing of the calibrations in this file (pickle)")
    ap.add_argument("--load", help="measure nothing: refit the calibrations kept by --save in this file")
    ap.add_argument("--cache-mb", type=lambda s: [float(x) for x in s.split(",") if x],
                    help="also refit every calibration (all its passes) with the cache held at each of these sizes "
                         "in MB (0: none) instead of the one its working sets chose, comma-separated")
    ap.add_argument("--share-step", type=lambda s: [float(x) for x in s.split(",") if x],
                    help="also refit every calibration with a cache of each of these sizes in MB whose share of a "
                         "pass is a step (all inside, none from a quarter more on) instead of the working sets' "
                         "shares, comma-separated")
    ap.add_argument("--against", type=lambda s: [x for x in s.split(",") if x],
                    help="saved simulation_accuracy.py --json runs (comma-separated) to score the fits against: "
                         "their measurements, each at its own reference level")
    ap.add_argument("--json", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.passes < 3 or args.calibrations < 2:
        ap.error("--passes must be at least 3 and --calibrations at least 2")
    if any(c <= 0 for c in args.share_step or []):
        ap.error("--share-step: each cache size must be above 0 MB (for none, --cache-mb 0)")

    import torch

    from perfsdk.simulation.calibration import DEFAULT_CALIBRATION_MODELS

    torch.set_num_threads(args.threads)
    models = args.models.split(",") if args.models else list(DEFAULT_CALIBRATION_MODELS)
    families = args.families.split(",") if args.families else FAMILY_MODELS + ANY_FAMILY_MODELS
    t0 = time.time()
    recs = []
    if args.load:
        with open(args.load, "rb") as fh:
            recs = pickle.load(fh)
        args.calibrations, args.passes = len(recs), min(r["fit"].passes for r in recs)
    for k in range(len(recs), args.calibrations):
        tc = time.time()
        recs.append(record(models, args.passes, seed=k, grid=args.grid, threads=args.threads))
        fit = recs[-1]["fit"]
        print(f"calibration {k + 1}: {time.time() - tc:.0f} s, {fit.passes} passes, drift {fit.drift_pct or 0:.1f} % raw / "
              f"{fit.normalised_drift_pct or 0:.1f} % normalised, tracking {fit.reference_tracking:.2f}, reference median "
              f"{fit.reference_s * 1e3:.2f} ms", flush=True)
    if args.save:
        with open(args.save, "wb") as fh:
            pickle.dump(recs, fh)
    summary: dict[str, Any] = {"passes": args.passes, "calibrations": args.calibrations, "models": models, "grid": args.grid,
                               "families": families, "scatter": [scatter(r) for r in recs], "by_passes": {}}
    for k, s in enumerate(summary["scatter"], start=1):
        print(f"calibration {k}, passes normalised: TTFT {s['ttft_pass_rms_pct']:.1f} % per configuration and pass, a "
              f"model's mean {s['ttft_model_mean_rms_pct']:.1f} % (its configurations' own scatter accounts for "
              f"{s['ttft_model_mean_from_configs_pct']:.1f} %); decode {s['decode_pass_rms_pct']:.1f} %, "
              f"{s['decode_model_mean_rms_pct']:.1f} % ({s['decode_model_mean_from_configs_pct']:.1f} %)")
    summary["between_within"] = []
    for k in range(len(recs)):
        for j in range(k + 1, len(recs)):
            bw = between_within(recs[k], recs[j])
            summary["between_within"].append({"calibrations": [k + 1, j + 1]} | bw)
            print(f"calibrations {k + 1} and {j + 1}, inputs at one level: {bw['between_rms_pct']:.1f} % apart (rms over "
                  f"{bw['figures']} configurations and phases; {bw['between_centred_rms_pct']:.1f} % about their median "
                  f"shift of {bw['shift_pct']:+.1f} %) where two medians of their passes would stand "
                  f"{bw['expected_rms_pct']:.1f} % apart by the passes' scatter alone (x {bw['ratio']:.1f}; about the shift x {bw['ratio_centred']:.1f}); "
                  f"{100 * bw['beyond_2se_share']:.0f} % of them beyond twice that", flush=True)
    configs = {spec: build_model(spec).config for spec in families}
    built: dict[str, Any] = {}
    preds: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    fits: list[Any] = []
    refits = [p for p in args.refits or range(3, args.passes + 1) if 1 <= p <= args.passes]
    if not refits:
        ap.error(f"--refits: no number of passes between 1 and {args.passes}")
    for p in refits:
        fits = [r["fit"] if p == args.passes else replay(r, models, p, built) for r in recs]
        preds = predictions(fits, families, configs)
        figures = []
        for k in range(1, len(fits)):
            d = [abs(x) for x in apart(preds, k)]
            figures.append({"median_pct": statistics.median(d), "max_pct": max(d)})
        summary["by_passes"][p] = figures
        print(f"{p} passes: calibrations against the first at one reference level, unseen families: "
              + "; ".join(f"calibration {k + 2} median {f['median_pct']:.1f} %, largest {f['max_pct']:.1f} %"
                          for k, f in enumerate(figures)), flush=True)
    # where the most passes still differ: by batch and phase
    where: dict[str, list[float]] = defaultdict(list)
    for (spec, b, o), row in preds.items():
        for j, phase in enumerate(("TTFT", "TPOT")):
            if row[0][j] > 0:
                where[f"batch {b} {phase}"].append(100 * (row[1][j] / row[0][j] - 1))
    summary["second_against_first_by_batch_phase"] = {k: [min(v), statistics.median(v), max(v)] for k, v in where.items()}
    print(f"at {refits[-1]} passes, calibration 2 against 1 by batch and phase (smallest / median / largest, %):")
    for k, v in where.items():
        print(f"  {k}: {min(v):+.1f} / {statistics.median(v):+.1f} / {max(v):+.1f}")
    names = list(fits[0].coefficients)
    summary["coefficients"] = [{n: f.coefficients[n] for n in names} | {"matmul_half_rows": f.matmul_half_rows}
                               for f in fits]
    print("coefficients: " + "; ".join(f"{n} " + " / ".join(f"{f.coefficients[n]:.4g}" for f in fits)
                                       for n in names if any(f.coefficients[n] for f in fits))
          + "; matmul_half_rows " + " / ".join(f"{f.matmul_half_rows:.1f}" for f in fits))
    runs = {}
    for path in args.against or []:
        with open(path, encoding="utf-8") as fh:
            run = json.load(fh)
        if run["summary"].get("threads") != recs[0]["threads"]:
            # a calibration predicts the thread count it measured with
            print(f"{path}: measured with {run['summary'].get('threads')} thread(s), the calibrations with "
                  f"{recs[0]['threads']}: not scored", flush=True)
            continue
        runs[path] = run
    variants: list[tuple[str, dict[str, float]]] = [("as calibrated", {})]
    variants += [(f"cache held at {c:g} MB", {"cache_bytes": c * 1e6}) for c in args.cache_mb or []]
    variants += [(f"a step share at {c:g} MB", {"share_step": c * 1e6}) for c in args.share_step or []]
    summary["variants"] = {}
    for what, held in variants:
        vfits = [replay(r, models, args.passes, built, **held) for r in recs]
        entry: dict[str, Any] = {"fit_residuals_pct": fit_residuals(vfits)}
        print(f"{what}: the fits' own errors, median by model and phase (signed %): "
              + "; ".join(f"{k} {v:+.0f}" for k, v in entry["fit_residuals_pct"].items()), flush=True)
        if held:
            vpreds = predictions(vfits, families, configs)
            d = [abs(x) for k in range(1, len(vfits)) for x in apart(vpreds, k)]
            entry["apart"] = {"median_pct": statistics.median(d), "max_pct": max(d)}
            print(f"{what}: calibrations against the first at one reference level, unseen families: median "
                  f"{entry['apart']['median_pct']:.1f} %, largest {entry['apart']['max_pct']:.1f} %", flush=True)
        for path, run in runs.items():
            entry[path] = scored(vfits, run)
            _print_scored(what, path, entry[path])
        summary["variants"][what] = entry
    print(f"done in {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

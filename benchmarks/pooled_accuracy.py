"""How wrong are the predictions once the measurement's own noise is taken out?

Reads the JSON of several runs of ``benchmarks/simulation_accuracy.py`` (``--json``; nothing is
measured or fitted here) and puts every figure of every run in reference units: each measurement
at its own level over its run's reference median (``ttft_measured_own_level_ms`` over
``reference_s.measurement``), each calibration's prediction over that calibration's reference
median (``reference_s.calibrations``; what a calibration's seconds mean). The **pooled
measurement** of a figure (model, batch, new tokens, TTFT or TPOT) is the median over the runs of
its measurements (the judged run's own among them): with N runs its noise is about 1.25 / sqrt(N)
of one run's.

Printed, for the unseen families (and, with ``--llama``, the Llama sizes):

- each run's measurement against the pooled one (median and largest |difference|): the
  measurement's own noise, which a single run's errors carry;
- each calibration's predictions against the pooled measurement: median and largest |error|
  and the signed median by batch and phase (a steady bias shows there), and the share inside
  the 90 % interval (the interval in reference units too; runs written before the benchmark kept
  every calibration's bounds give the first calibration's only);
- each calibration against the median of all calibrations' predictions (its own scatter: what
  two calibrations differ by, without the level of the machine between them);
- every pair of calibrations over the runs, within one run and across runs, compared at one
  level (each prediction in units of its own calibration's reference median): the largest and the
  median |difference|, and how many pairs stand within 5 % (the reproducibility target, over
  calibrations minutes or hours apart), counted apart for the pairs whose reference medians (the
  machine's speed while each calibrated) stood within ``--near`` % of each other (default 10) and
  for the others; ``--pairs`` prints only this, from one run or more;
- how much of its 90 % interval each measurement used, as its run judged it (the run's own
  measurement at the calibration's reference level, not the pooled one): ``log(measured /
  predicted)`` over the log of the bound on the same side, 0 at the prediction and 1 at the bound.
  The 90th percentile of that use, per calibration and over all of them, is the share of the
  interval's log half-widths that would still have held 90 % of the measurements: well under 1,
  the intervals were wider than these runs needed; over 1, narrower. Then the same use of every
  single measurement pass on the raw clock (runs that kept their passes), against the prediction
  in seconds: what one user's run, with the machine's drift in it, reads.

The exponent the work follows the reference with (``reference_tracking``) is taken as 1 here:
runs at reference levels a few percent apart differ by that exponent's effect, well under 1 %.

Usage: ``python benchmarks/pooled_accuracy.py run1.json run2.json run3.json ... [--pool-only
older.json ...] [--llama] [--near PCT] [--json OUT]``: ``--pool-only`` runs (of other code, say)
add their measurement to the pooled one without their calibrations being judged.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from typing import Any

from perfsdk.stats import percentile

PHASES = ("ttft", "tpot")


def _runs(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        try:
            with open(path) as fh:
                data = json.load(fh)
            ref = data["summary"]["reference_s"]
            if not ref or not ref.get("measurement") or not ref.get("calibrations"):
                raise KeyError("summary.reference_s")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}: not a simulation_accuracy.py --json run with reference levels ({exc})")
        data["path"] = path
        out.append(data)
    return out


def _key(row: dict[str, Any], x: str) -> tuple[Any, ...]:
    return (row["model"], row["batch"], row["output_tokens"], x)


def _name(row: dict[str, Any], x: str) -> str:
    return f"{row['model']} batch {row['batch']} {row['output_tokens']} new {x.upper()}"


def _measured(run: dict[str, Any], row: dict[str, Any], x: str) -> float:
    """A measurement at its own level, in units of its run's reference median."""
    return row[f"{x}_measured_own_level_ms"] / 1e3 / run["summary"]["reference_s"]["measurement"]


def _bounds(row: dict[str, Any], x: str, k: int) -> tuple[float, float] | None:
    """Calibration ``k``'s 90 % interval, ms (runs written before the JSON kept every
    calibration's bounds: the first calibration's only)."""
    lows, highs = row.get(f"{x}_low_ms_each"), row.get(f"{x}_high_ms_each")
    if lows is None or highs is None:
        lows, highs = [row.get(f"{x}_low_ms")], [row.get(f"{x}_high_ms")]
    if k >= len(lows) or lows[k] is None or highs[k] is None:
        return None
    return lows[k], highs[k]


def _use(pred: float, measured: float, low: float, high: float) -> float | None:
    """How far ``measured`` lies from ``pred`` in units of the interval's log half-width on its
    side: 0 at the prediction, 1 at the bound (``None`` for a bound that does not enclose
    the prediction)."""
    bound = high if measured >= pred else low
    if pred <= 0 or bound <= 0 or measured <= 0 or bound == pred:
        return None
    use = math.log(measured / pred) / math.log(bound / pred)
    return use if use >= 0 else None


def _predictions(run: dict[str, Any], k: int, family: bool) -> dict[tuple[Any, ...], tuple[float, dict, str]]:
    """Calibration ``k``'s predictions of ``run`` in units of its reference median (what its
    seconds mean), with the row and phase each came from."""
    cal_ref = run["summary"]["reference_s"]["calibrations"][k]
    return {_key(row, x): (row[f"{x}_predicted_ms_each"][k] / 1e3 / cal_ref, row, x)
            for row in run["rows"] if bool(row["family"]) == family for x in PHASES}


def calibration_pairs(runs: list[dict[str, Any]], family: bool) -> dict[str, Any]:
    """Every pair of calibrations over ``runs`` (within one run and across runs) compared at one
    level: each prediction in units of its calibration's reference median, the largest and the
    median |difference| over the figures both predicted. Needs no measurement: it is the
    reproducibility of two calibrations, whenever they ran."""
    cals = [(run["path"], k + 1, _predictions(run, k, family), ref)
            for run in runs for k, ref in enumerate(run["summary"]["reference_s"]["calibrations"])]
    pairs = []
    for i, (path_a, ka, pa, ref_a) in enumerate(cals):
        for path_b, kb, pb, ref_b in cals[i + 1:]:
            common = [key for key in pa if key in pb]
            if not common:
                continue
            diffs = [(100 * (max(pa[key][0], pb[key][0]) / min(pa[key][0], pb[key][0]) - 1), key) for key in common]
            far = max(diffs)
            pairs.append({"a": f"{path_a} cal. {ka}", "b": f"{path_b} cal. {kb}", "same_run": path_a == path_b,
                          "figures": len(common), "max_pct": far[0],
                          "median_pct": statistics.median(d for d, _ in diffs),
                          "largest": _name(pa[far[1]][1], pa[far[1]][2]),
                          # how far apart the machine's speed stood while they calibrated
                          "reference_apart_pct": 100 * (max(ref_a, ref_b) / min(ref_a, ref_b) - 1)})
    return {"pairs": pairs}


def interval_use(runs: list[dict[str, Any]], family: bool, single_passes: bool = False) -> dict[str, Any]:
    """Per calibration and over all, how much of its interval each of its run's own measurements
    (the ones the run judged inside or outside) used; see the module docstring. ``single_passes``:
    each measurement pass on the raw clock instead (``{x}_passes_raw_ms``, neither normalised nor
    brought to the calibration's level; runs written before the benchmark kept them have none),
    what one user's run reads against the prediction in seconds."""
    per_cal, every = [], []
    for run in runs:
        for k in range(len(run["summary"]["reference_s"]["calibrations"])):
            uses = []
            for row in run["rows"]:
                if bool(row["family"]) != family:
                    continue
                for x in PHASES:
                    bounds = _bounds(row, x, k)
                    errors = row.get(f"{x}_error_pct_each")
                    if bounds is None or not errors or k >= len(errors):
                        continue
                    pred = row[f"{x}_predicted_ms_each"][k]
                    seen = (row.get(f"{x}_passes_raw_ms") or []) if single_passes else [pred / (1 + errors[k] / 100)]
                    uses.extend(u for u in (_use(pred, m, *bounds) for m in seen) if u is not None)
            if uses:
                every.extend(uses)
                per_cal.append({"run": run["path"], "calibration": k + 1, "figures": len(uses),
                                "inside_share": sum(u <= 1 for u in uses) / len(uses),
                                "use_p90": percentile(sorted(uses), 90), "use_max": max(uses)})
    if not every:
        return {"calibrations": [], "figures": 0}
    return {"calibrations": per_cal, "figures": len(every), "use_p90": percentile(sorted(every), 90),
            "use_median": statistics.median(every), "use_max": max(every),
            "inside_share": sum(u <= 1 for u in every) / len(every)}


def pooled(runs: list[dict[str, Any]], family: bool, pool_only: tuple[str, ...] = ()) -> dict[str, Any]:
    """The figures of ``runs`` in reference units, the pooled measurement and every comparison
    the module docstring lists, for the unseen families (``family``) or the Llama sizes. Runs in
    ``pool_only`` add their measurement to the pooled one; their calibrations are not judged."""
    measured: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for run in runs:
        for row in run["rows"]:
            if bool(row["family"]) != family:
                continue
            for x in PHASES:
                measured[_key(row, x)].append(_measured(run, row, x))
    truth = {k: statistics.median(v) for k, v in measured.items()}

    noise = []  # each run's measurement against the pooled one
    for run in runs:
        devs = [(100 * (_measured(run, row, x) / truth[_key(row, x)] - 1), _name(row, x))
                for row in run["rows"] if bool(row["family"]) == family for x in PHASES]
        if not devs:
            continue
        far = max(devs, key=lambda d: abs(d[0]))
        noise.append({"run": run["path"], "median_abs_pct": statistics.median(abs(d) for d, _ in devs),
                      "max_abs_pct": abs(far[0]), "largest": f"{far[1]} {far[0]:+.1f} %"})

    preds: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    calibrations = []
    for run in runs:
        if run["path"] in pool_only:
            continue
        refs = run["summary"]["reference_s"]["calibrations"]
        for k, cal_ref in enumerate(refs):
            errors, names, inside, by_class = [], [], [], defaultdict(list)
            own: dict[tuple[Any, ...], float] = {}
            for key, (p, row, x) in _predictions(run, k, family).items():
                own[key] = p
                preds[key].append(p)
                e = 100 * (p / truth[key] - 1)
                errors.append(e)
                names.append(_name(row, x))
                by_class[f"batch {row['batch']} {x.upper()}"].append(e)
                bounds = _bounds(row, x, k)
                if bounds is not None:
                    inside.append(bounds[0] / 1e3 / cal_ref <= truth[key] <= bounds[1] / 1e3 / cal_ref)
            if not errors:
                continue
            calibrations.append({
                "run": run["path"], "calibration": k + 1, "figures": len(errors),
                "median_abs_error_pct": statistics.median(abs(e) for e in errors),
                "max_abs_error_pct": max(abs(e) for e in errors),
                "largest": "{} {:+.1f} %".format(*max(zip(names, errors), key=lambda t: abs(t[1]))),
                "signed_median_pct": {c: statistics.median(v) for c, v in sorted(by_class.items())},
                "inside_share": (sum(inside) / len(inside)) if inside else None, "_own": own})
    consensus = {k: statistics.median(v) for k, v in preds.items()}
    for cal in calibrations:
        apart = [100 * (p / consensus[key] - 1) for key, p in cal.pop("_own").items()]
        cal["against_all_calibrations_median_pct"] = statistics.median(abs(a) for a in apart)
        cal["against_all_calibrations_max_pct"] = max(abs(a) for a in apart)
    return {"figures": len(truth), "runs": len(runs), "measurement_noise": noise, "calibrations": calibrations}


def pairs_report(name: str, res: dict[str, Any], within: float = 5.0, near: float = 10.0) -> list[str]:
    """The pairs of :func:`calibration_pairs`, and how many stand within ``within`` % among those
    calibrated at reference medians within ``near`` % of each other and among the others: one
    level is one ratio of the reference's times, which describes a machine whose parts slow
    unevenly only so far."""
    pairs = res["pairs"]
    if not pairs:
        return [f"{name}: no two calibrations predicted the same figures."]
    lines = [f"{name}: every pair of calibrations at one level (each prediction over its calibration's reference "
             f"median): {len(pairs)} pairs, {sum(p['max_pct'] <= within for p in pairs)} within {within:g} % "
             f"at their largest difference."]
    close = [p for p in pairs if p["reference_apart_pct"] <= near]
    far = [p for p in pairs if p["reference_apart_pct"] > near]
    for label, group in ((f"within {near:g} %", close), (f"more than {near:g} % apart", far)):
        if group:
            lines.append(f"  calibrated with the reference medians {label}: {sum(p['max_pct'] <= within for p in group)} "
                         f"of {len(group)} pairs within {within:g} % (largest differences "
                         f"{min(p['max_pct'] for p in group):.1f}-{max(p['max_pct'] for p in group):.1f} %)")
    for p in pairs:
        lines.append(f"    {p['a']} / {p['b']}{' (same run)' if p['same_run'] else ''}: largest {p['max_pct']:.1f} % "
                     f"({p['largest']}), median {p['median_pct']:.1f} % over {p['figures']} figures; reference "
                     f"medians {p['reference_apart_pct']:.1f} % apart")
    return lines


def report(name: str, res: dict[str, Any]) -> list[str]:
    if not res["calibrations"]:
        return [f"{name}: no figures in these runs."]
    lines = [f"{name}: {res['figures']} figures, pooled over {res['runs']} runs (reference units)."]
    lines.append("  Each run's measurement against the pooled one (median / largest |difference|):")
    for n in res["measurement_noise"]:
        lines.append(f"    {n['run']}: {n['median_abs_pct']:.1f} / {n['max_abs_pct']:.1f} % ({n['largest']})")
    lines.append("  Each calibration against the pooled measurement: median / largest |error|, inside the 90 % "
                 "interval; signed median by batch and phase; against all calibrations' median (median / largest):")
    for c in res["calibrations"]:
        inside = "n/a" if c["inside_share"] is None else f"{100 * c['inside_share']:.0f} %"
        signed = ", ".join(f"{k} {v:+.1f}" for k, v in c["signed_median_pct"].items())
        lines.append(f"    {c['run']} cal. {c['calibration']}: {c['median_abs_error_pct']:.1f} / "
                     f"{c['max_abs_error_pct']:.1f} % ({c['largest']}), inside {inside}; {signed}; "
                     f"{c['against_all_calibrations_median_pct']:.1f} / {c['against_all_calibrations_max_pct']:.1f} %")
    worst = max(c["max_abs_error_pct"] for c in res["calibrations"])
    med = [c["median_abs_error_pct"] for c in res["calibrations"]]
    lines.append(f"  Over the {len(med)} calibrations: median |error| {min(med):.1f}–{max(med):.1f} %, "
                 f"largest {worst:.1f} %.")
    lines += use_lines(res.get("interval_use"), "each run's own measurement")
    lines += use_lines(res.get("interval_use_single_passes"), "each single measurement pass on the raw clock")
    return lines


def use_lines(use: dict[str, Any] | None, what: str) -> list[str]:
    """:func:`interval_use`'s result as printed: per calibration, then over all (nothing where no
    figure was judged)."""
    if not use or not use["figures"]:
        return []
    lines = [f"  How much of its 90 % interval {what} used (log distance from the prediction over the "
             "bound's; 90th percentile / largest, inside):"]
    for c in use["calibrations"]:
        lines.append(f"    {c['run']} cal. {c['calibration']}: {c['use_p90']:.2f} / {c['use_max']:.2f}, "
                     f"inside {100 * c['inside_share']:.0f} %")
    lines.append(f"  Over all {use['figures']} judged figures: median {use['use_median']:.2f}, 90th percentile "
                 f"{use['use_p90']:.2f}, largest {use['use_max']:.2f}, inside {100 * use['inside_share']:.0f} %: "
                 f"intervals {use['use_p90']:.2f} times as wide (in log terms, about each prediction) would "
                 f"have held 90 % of them.")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="simulation_accuracy.py --json files, at least three (one with --pairs)")
    ap.add_argument("--pool-only", nargs="+", default=[], metavar="RUN",
                    help="more runs whose measurement joins the pooled one, their calibrations not judged "
                         "(runs of other code)")
    ap.add_argument("--llama", action="store_true", help="also the Llama sizes")
    ap.add_argument("--json", help="write the comparisons here")
    ap.add_argument("--pairs", action="store_true",
                    help="only every pair of calibrations compared at one level (reproducibility; one run or more)")
    ap.add_argument("--near", type=float, default=10.0, metavar="PCT",
                    help="count the pairs within 5 %% separately for those calibrated at reference medians within "
                         "PCT %% of each other and for the others")
    args = ap.parse_args(argv)
    if args.pairs:
        if args.pool_only:
            ap.error("--pool-only adds measurements to the pooled one; --pairs compares calibrations only")
        runs = _runs(args.runs)
        pairs = {"families": calibration_pairs(runs, True)}
        if args.llama:
            pairs["llama"] = calibration_pairs(runs, False)
        for name, res in pairs.items():
            print("\n".join(pairs_report("Unseen families" if name == "families" else "Llama sizes", res,
                                          near=args.near)))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(pairs, fh, indent=1)
        return 0
    if len(args.runs) + len(args.pool_only) < 3:
        ap.error("give at least three runs: the pooled measurement is their median")
    runs = _runs(args.runs + args.pool_only)
    judged = [r for r in runs if r["path"] not in args.pool_only]
    out = {"families": pooled(runs, True, tuple(args.pool_only))}
    out["families"]["interval_use"] = interval_use(judged, True)
    out["families"]["interval_use_single_passes"] = interval_use(judged, True, single_passes=True)
    out["families"].update(calibration_pairs(judged, True))
    if args.llama:
        out["llama"] = pooled(runs, False, tuple(args.pool_only))
        out["llama"]["interval_use"] = interval_use(judged, False)
        out["llama"]["interval_use_single_passes"] = interval_use(judged, False, single_passes=True)
        out["llama"].update(calibration_pairs(judged, False))
    for name, res in out.items():
        label = "Unseen families" if name == "families" else "Llama sizes"
        print("\n".join(report(label, res) + pairs_report(label, res, near=args.near)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which held-out errors should the interval of a family the fit never saw draw on?

Re-scores a saved run of ``benchmarks/simulation_accuracy.py`` (its ``--json``, and the profiles
its ``--profile-out`` wrote: ``NAME.yaml``, ``NAME-2.yaml`` ...; nothing is measured or fitted
here) with the intervals of the unseen families drawn on the calibration's held-out errors
(``CalibrationRecord.held_out``) by each of four rules:

- ``whole``: the configurations whose whole family was left out of the fit, each error as it was;
- ``every``: every held-out configuration, each error as it was;
- ``both-ways``: the families left out whole, each error taken both ways (the error and its
  mirror, a measurement as far on the other side: what :func:`perfsdk.simulation.uncertainty.model_errors`
  does for a family the calibration did not measure);
- ``every-both-ways``: every held-out configuration, each both ways.

Each prediction is re-made from the saved profile (``simulate_config``, as the run made it; the
point predictions must match the run's, and the script stops if one does not) and judged against
the run's measurement at that calibration's reference level (``prediction / (1 + error)``).
Printed per rule: the share of measurements inside the 90 % interval (over all, per calibration,
TTFT and TPOT apart) and the intervals' median width (over all, per calibration), in percent of
the prediction.

With ``--terms`` it asks instead what each source of the interval adds
(:data:`perfsdk.simulation.uncertainty.INTERVAL_TERMS`: the bootstrap refits' coefficients, the
model error, one run's stray): the interval as the product draws it, without the refits, and each
source alone (``SimulationResult.interval_terms``, the others held at the prediction), each judged
against the run's measurement (the median of its passes, at the calibration's reference level) and
against every single measurement pass on the raw clock (one user's run): the share inside, how
much of its interval the 90th percentile of them used (0 at the prediction, 1 at the bound, in log
distance), and the median width. ``--group llama`` judges the Llama sizes (the calibration's own
family) instead of the unseen families.

Usage: ``PYTHONPATH=src python benchmarks/interval_rules.py run.json run.yaml run-2.yaml [--json OUT]
[--terms [--group families|llama]]``. About a minute per calibration on two cores (every prediction
is re-made four times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np

from perfsdk.hardware.profile import CalibrationRecord

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rules() -> dict[str, Callable[[CalibrationRecord, str | None], np.ndarray]]:
    from perfsdk.simulation import uncertainty as u

    def every(cal: CalibrationRecord, family: str | None) -> np.ndarray:
        return np.array(cal.held_out, dtype=float)

    def whole(cal: CalibrationRecord, family: str | None) -> np.ndarray:
        # the families left out whole, each error as it was (the rule before they were taken both ways)
        held = every(cal, family)
        if u._whole_families_only(cal, family):
            return held[np.array(cal.held_out_whole_family, dtype=np.bool_)]
        return held

    def every_both_ways(cal: CalibrationRecord, family: str | None) -> np.ndarray:
        return u.mirrored(every(cal, family)) if u._foreign(cal, family) else every(cal, family)

    return {"whole": whole, "every": every, "both-ways": u.model_errors, "every-both-ways": every_both_ways}


def _as_saved(q: object, row: dict, k: int, x: str) -> tuple[float, float]:
    """Calibration ``k``'s prediction of ``x`` (``ttft``, ``tpot``) re-made from its profile, ms, and
    the run's measurement at that calibration's reference level; stops where the prediction is not
    the run's (another profile or other code)."""
    p = getattr(q, f"{x}_s") * 1e3
    saved = row[f"{x}_predicted_ms_each"][k]
    if abs(p / saved - 1.0) > 1e-6:
        raise SystemExit(f"{row['model']} batch {row['batch']}: {x} predicted {p:.4f} ms from the profile, "
                         f"{saved:.4f} ms in the run: the profile or the code is not the run's")
    return p, saved / (1.0 + row[f"{x}_error_pct_each"][k] / 100.0)


def rescore(run: dict, profiles: list) -> dict[str, dict]:
    """Per rule: inside share (all, per calibration, per metric) and median width, unseen families."""
    import simulation_accuracy as sa

    from perfsdk.simulation import uncertainty as u
    from perfsdk.simulation.predictor import simulate_config

    rules = _rules()
    tally: dict[str, dict] = {name: {"inside": [], "by_cal": [[] for _ in profiles], "ttft": [], "tpot": [],
                                     "width": [], "width_by_cal": [[] for _ in profiles]} for name in rules}
    configs: dict[str, object] = {}
    for row in run["rows"]:
        if not row["family"]:
            continue
        name = row["model"]
        cfg = configs.setdefault(name, sa.family_config(name))
        for k, prof in enumerate(profiles):
            for rule, fn in rules.items():
                with mock.patch.object(u, "model_errors", fn):
                    q = simulate_config(cfg, prof, batch_size=row["batch"], input_tokens=row["input_tokens"],
                                        output_tokens=row["output_tokens"], dtype="float32", name=f"family:{name}")
                for x in ("ttft", "tpot"):
                    p, measured = _as_saved(q, row, k, x)
                    lo, hi = getattr(q, f"{x}_s_low") * 1e3, getattr(q, f"{x}_s_high") * 1e3
                    ok = lo <= measured <= hi
                    t = tally[rule]
                    t["inside"].append(ok)
                    t["by_cal"][k].append(ok)
                    t[x].append(ok)
                    t["width"].append(100.0 * (hi - lo) / p)
                    t["width_by_cal"][k].append(100.0 * (hi - lo) / p)

    def share(flags: list[bool]) -> float:
        return 100.0 * sum(flags) / len(flags) if flags else float("nan")

    return {rule: {"inside_pct": share(t["inside"]), "inside_pct_by_calibration": [share(c) for c in t["by_cal"]],
                   "ttft_inside_pct": share(t["ttft"]), "tpot_inside_pct": share(t["tpot"]),
                   "median_width_pct": statistics.median(t["width"]) if t["width"] else float("nan"),
                   "median_width_pct_by_calibration": [statistics.median(w) if w else float("nan")
                                                       for w in t["width_by_cal"]],
                   "figures": len(t["inside"])}
            for rule, t in tally.items()}


def _use(pred: float, measured: float, low: float, high: float) -> float:
    """:func:`pooled_accuracy._use <pooled_accuracy._use>`, with a measurement beside a bound that
    sits at the prediction (a source that alone gives no spread on that side) outside: inf."""
    from pooled_accuracy import _use as use

    if measured == pred:
        return 0.0
    u = use(pred, measured, low, high)
    return float("inf") if u is None else u


def rescore_terms(run: dict, profiles: list, family: bool = True) -> dict[str, dict]:
    """Per way of drawing the interval (every source, without the refits, each source alone): the
    share inside, the 90th percentile of the interval used and the median width, against the
    measurement and against single passes, for the unseen families (``family``) or the Llama sizes."""
    import simulation_accuracy as sa

    from perfsdk.simulation.predictor import simulate_config
    from perfsdk.simulation.uncertainty import INTERVAL_TERMS

    ways = ["every source", "without the refits", *(f"{t} alone" for t in INTERVAL_TERMS)]
    uses: dict[str, dict[str, list[float]]] = {w: {"judged": [], "single": [], "width": []} for w in ways}
    configs: dict[str, object] = {}
    for row in run["rows"]:
        if bool(row["family"]) != family:
            continue
        name = row["model"]
        spec = f"family:{name}" if family else f"builtin:{name}"
        if spec not in configs:
            configs[spec] = sa.family_config(name) if family else sa.build_model(spec).config
        for k, prof in enumerate(profiles):
            q = simulate_config(configs[spec], prof, batch_size=row["batch"], input_tokens=row["input_tokens"],
                                output_tokens=row["output_tokens"], dtype="float32", name=spec)
            # without the refits: the model error and one run drawn together, the refits' ratio at 1
            plain = _without_refits(configs[spec], prof, row, spec)
            for x in ("ttft", "tpot"):
                p, measured = _as_saved(q, row, k, x)
                bounds = {"every source": (getattr(q, f"{x}_s_low") * 1e3, getattr(q, f"{x}_s_high") * 1e3),
                          "without the refits": plain[x]}
                for t in INTERVAL_TERMS:
                    term = q.interval_terms[f"{x}_s"][t]
                    bounds[f"{t} alone"] = (p * term.low, p * term.high)
                for way, (lo, hi) in bounds.items():
                    u = uses[way]
                    u["judged"].append(_use(p, measured, lo, hi))
                    u["single"] += [_use(p, m, lo, hi) for m in row.get(f"{x}_passes_raw_ms") or []]
                    u["width"].append(100.0 * (hi - lo) / p)

    def judged(values: list[float]) -> dict[str, float]:
        a = np.array(values, dtype=float)
        return {"inside_pct": float(100.0 * np.mean(a <= 1.0)), "use_p90": float(np.quantile(a, 0.9)),
                "figures": int(a.size)} if a.size else {"figures": 0}

    return {way: {"measurement": judged(u["judged"]), "single_passes": judged(u["single"]),
                  "median_width_pct": statistics.median(u["width"]) if u["width"] else float("nan")}
            for way, u in uses.items()}


def _without_refits(cfg: object, prof: object, row: dict, spec: str) -> dict[str, tuple[float, float]]:
    """The TTFT and TPOT interval (ms) drawn on the model error and one run only."""
    from perfsdk.simulation import uncertainty as u
    from perfsdk.simulation.predictor import simulate_config

    both = tuple(t for t in u.INTERVAL_TERMS if t != "coefficients")
    full = u.time_interval_samples

    def drawn(*args: object, **kw: object) -> object:
        kw["terms"] = both
        return full(*args, **kw)  # type: ignore[arg-type]

    with mock.patch.object(u, "time_interval_samples", drawn):
        q = simulate_config(cfg, prof, batch_size=row["batch"], input_tokens=row["input_tokens"],
                            output_tokens=row["output_tokens"], dtype="float32", name=spec)
    return {x: (getattr(q, f"{x}_s_low") * 1e3, getattr(q, f"{x}_s_high") * 1e3) for x in ("ttft", "tpot")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the --json of a simulation_accuracy.py run")
    ap.add_argument("profiles", nargs="+", help="its calibrated profiles (--profile-out), in order")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--terms", action="store_true", help="what each source of the interval adds (see above)")
    ap.add_argument("--group", choices=("families", "llama"), default="families",
                    help="with --terms: the unseen families or the Llama sizes")
    args = ap.parse_args(argv)

    from perfsdk.hardware.profile import load_profile_file

    run = json.loads(Path(args.run).read_text(encoding="utf-8"))
    profiles = [load_profile_file(p)[0] for p in args.profiles]
    if args.terms:
        terms = rescore_terms(run, profiles, family=args.group == "families")
        for way, s in terms.items():
            m, one = s["measurement"], s["single_passes"]
            line = (f"{way:22s} measurement: inside {m['inside_pct']:5.1f} %, 90th percentile used {m['use_p90']:.2f} "
                    f"({m['figures']}); ")
            line += (f"single passes: inside {one['inside_pct']:5.1f} %, 90th percentile used {one['use_p90']:.2f} "
                     f"({one['figures']}); " if one["figures"] else "single passes: none kept; ")
            print(line + f"median width {s['median_width_pct']:.0f} %")
        if args.json:
            Path(args.json).write_text(json.dumps(terms, indent=2), encoding="utf-8")
        return 0
    out = rescore(run, profiles)
    for rule, s in out.items():
        per_cal = ", ".join(f"{v:.0f}" for v in s["inside_pct_by_calibration"])
        widths = ", ".join(f"{v:.0f}" for v in s["median_width_pct_by_calibration"])
        print(f"{rule:16s} inside {s['inside_pct']:5.1f} % (per calibration {per_cal}; "
              f"TTFT {s['ttft_inside_pct']:.0f}, TPOT {s['tpot_inside_pct']:.0f}), "
              f"median width {s['median_width_pct']:.1f} % (per calibration {widths}), {s['figures']} figures")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

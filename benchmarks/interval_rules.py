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

Usage: ``PYTHONPATH=src python benchmarks/interval_rules.py run.json run.yaml run-2.yaml [--json OUT]``.
About a minute per calibration on two cores (every prediction is re-made four times).
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
                    p = getattr(q, f"{x}_s") * 1e3
                    saved = row[f"{x}_predicted_ms_each"][k]
                    if abs(p / saved - 1.0) > 1e-6:
                        raise SystemExit(f"{name} batch {row['batch']}: {x} predicted {p:.4f} ms from the profile, "
                                         f"{saved:.4f} ms in the run: the profile or the code is not the run's")
                    measured = saved / (1.0 + row[f"{x}_error_pct_each"][k] / 100.0)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the --json of a simulation_accuracy.py run")
    ap.add_argument("profiles", nargs="+", help="its calibrated profiles (--profile-out), in order")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    from perfsdk.hardware.profile import load_profile_file

    run = json.loads(Path(args.run).read_text(encoding="utf-8"))
    profiles = [load_profile_file(p)[0] for p in args.profiles]
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

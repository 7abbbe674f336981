"""What every overview of a sweep says besides its objectives: each point's validity and a
sweep-level line, how many points each constraint removed from the Pareto front, and the
figures users recorded or asked the quality collector for. The terminal summary
(``perfsdk sweep``) and the HTML report both read them from here."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from perfsdk.experiments.sweep.manifest import FINISHED


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def point_figures(row: dict[str, Any]) -> dict[str, float | None]:
    """A point run's records (``records.<name>``, numbers only) and the quality metrics its
    quality collector was asked for (``collectors.quality.<metric>``), from its flattened row."""
    out: dict[str, float | None] = {}
    for k, v in row.items():
        if k.startswith("records.") and _num(v) is not None:
            out[k] = _num(v)
    asked = row.get("collectors.quality.metrics")
    try:
        metrics = json.loads(asked) if isinstance(asked, str) else []
    except ValueError:
        metrics = []
    for m in metrics:
        out[f"collectors.quality.{m}"] = _num(row.get(f"collectors.quality.{m}"))
    return out


def figure_fields(points: Sequence[dict[str, Any]], exclude: Sequence[str] = ()) -> list[str]:
    """The figure columns any point has, in first-seen order, less those in ``exclude``."""
    cols: dict[str, None] = {}
    for p in points:
        cols.update(dict.fromkeys(p.get("figures") or {}))
    return [c for c in cols if c not in exclude]


def validity_line(points: Sequence[dict[str, Any]]) -> str:
    """``validity: of 8 finished points, 8 noisy (contention 8, few-samples 2)`` (points per
    kind of reason), or ``validity: all 8 finished points valid``; points stored without a
    verdict are counted as such."""
    done = [p for p in points if p.get("status") in FINISHED]
    if not done:
        return "validity: no finished point"
    verdicts = Counter(p.get("validity") or "no verdict" for p in done)
    if set(verdicts) == {"valid"}:
        return f"validity: all {len(done)} finished points valid"
    parts = []
    for verdict in ("invalid", "noisy", "no verdict", "valid"):
        n = verdicts.get(verdict)
        if not n:
            continue
        # points per kind of reason ("contention", "few-samples"), each point counted once per kind
        reasons = Counter(kind for p in done if (p.get("validity") or "no verdict") == verdict
                          for kind in dict.fromkeys(r.split(":", 1)[0] for r in p.get("validity_reasons") or []))
        why = ", ".join(f"{k} {v}" for k, v in reasons.most_common())
        parts.append(f"{n} {verdict}" + (f" ({why})" if why else ""))
    return f"validity: of {len(done)} finished points, " + "; ".join(parts)


def constraint_lines(manifest: dict[str, Any]) -> list[str]:
    """One line per constraint: how many finished points it removed from the Pareto front (it
    failed or its field was missing), then the front's size."""
    from perfsdk.experiments.sweep.spec import Constraint

    done = [p for p in manifest.get("points") or [] if p.get("status") in FINISHED]
    out = []
    for text in manifest.get("constraints") or []:
        c = Constraint.parse(text)
        checks = [c.check(p.get("objectives") or {})[0] for p in done]
        failed, missing = checks.count(False), checks.count(None)
        line = f"constraint {c}: removed {failed} of {len(done)} finished points"
        if missing:
            line += f"; {missing} without a value for {c.field}, not judged"
        out.append(line)
    if manifest.get("objectives"):
        kept = sum(1 for p in done if p.get("feasible") is not False)
        front = len(manifest.get("pareto") or [])
        out.append(f"Pareto front: {front} point(s) of the {kept} meeting every constraint" if manifest.get("constraints")
                   else f"Pareto front: {front} point(s) of {len(done)} finished")
    return out

"""Drawing helpers and the figures of one run (latency CDF, per-token latency, utilization over
time, bar charts), plus the names every part of a report shares.

Figures are drawn with matplotlib's Agg canvas (no display, no global pyplot state). Collectors
draw their report sections with these functions.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Any

import structlog

from perfsdk.collector import ReportFigure, ReportSection, html_table
from perfsdk.schemas import RunResult
from perfsdk.store import Store, StoreError

log = structlog.get_logger("perfsdk.experiments.report")

PHASE_COLORS = {"encode": "#6a4c93", "prefill": "#f4a261", "decode": "#2a9d8f", "load": "#8d99ae", "forward": "#e9c46a",
                "idle": "#ffffff", "session": "#ffffff"}
PALETTE = ["#264653", "#e76f51", "#2a9d8f", "#e9c46a", "#6a4c93", "#f4a261", "#1982c4", "#8ac926",
           "#ff595e", "#6d6875", "#118ab2", "#ef476f"]


class ReportError(ValueError):
    """The run or sweep to report on was not found."""


Figure = ReportFigure
Section = ReportSection


# -- drawing helpers ----------------------------------------------------------------------------

def _figure(nrows: int = 1, ncols: int = 1, width: float = 8.0, height: float = 4.0) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


_table = html_table


def _series(store: Store, run: RunResult, name: str) -> list[dict[str, Any]]:
    if name not in run.series:
        return []
    try:
        return store.read_series(run.run_id, name)
    except (StoreError, OSError, ValueError) as exc:
        log.warning("series unreadable", run_id=run.run_id, series=name, error=repr(exc))
        return []


# -- run figures ---------------------------------------------------------------------------------

def request_samples(store: Store, run: RunResult) -> dict[str, list[float]]:
    """Per-request TTFT/TPOT/e2e (seconds), from the ``requests`` series or ``token_times``."""
    from perfsdk.experiments.compare import sampled_metrics, samples_for

    out = {}
    for m in [k for k in sampled_metrics() if k.endswith("_s") and not k.endswith("per_s")]:
        vals = samples_for(store, run, m)
        if vals:
            out[m] = vals
    return out


def latency_cdf(samples: dict[str, list[float]], title: str = "Latency CDF") -> bytes | None:
    """Empirical CDFs of TTFT, TPOT and e2e latency (ms, log scale)."""
    if not samples:
        return None
    fig, axes = _figure(1, len(samples), width=4.0 * len(samples), height=3.4)
    for ax, (name, vals) in zip(axes[0], samples.items()):
        xs = sorted(v * 1e3 for v in vals)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", color=PALETTE[0])
        ax.set_xlabel(f"{name.removesuffix('_s').upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        for q, ls in ((0.5, ":"), (0.95, "--")):
            k = min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))
            ax.axvline(xs[k], color="grey", ls=ls, lw=0.8)
        ax.set_title(f"{name.removesuffix('_s').upper()}  (n={len(xs)}, p50 {_ms(xs, 0.5)}, p95 {_ms(xs, 0.95)})",
                     fontsize=9)
    fig.suptitle(title)
    return _png(fig)


def _ms(xs: list[float], q: float) -> str:
    k = min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))
    return f"{xs[k]:.3g} ms"


def per_token_latency(rows: list[dict[str, Any]]) -> bytes | None:
    """Latency of each generated position: position 0 is the TTFT, later ones the gap to the
    previous token; median over steps with a 10-90 % band."""
    by_step: dict[Any, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        by_step[r["step"]].append((int(r["position"]), float(r["t_s"])))
    per_pos: dict[int, list[float]] = defaultdict(list)
    for pts in by_step.values():
        pts.sort()
        prev = 0.0
        for position, t in pts:
            per_pos[position].append((t - prev) * 1e3)
            prev = t
    if not per_pos:
        return None
    import numpy as np

    pos = sorted(per_pos)
    med = [float(np.median(per_pos[p])) for p in pos]
    lo = [float(np.percentile(per_pos[p], 10)) for p in pos]
    hi = [float(np.percentile(per_pos[p], 90)) for p in pos]
    fig, axes = _figure(1, 1, width=8, height=3.6)
    ax = axes[0][0]
    ax.fill_between(pos, lo, hi, color=PALETTE[2], alpha=0.25, label="p10-p90 over steps")
    ax.plot(pos, med, marker="o", ms=3, color=PALETTE[0], label="median")
    ax.set_yscale("log")
    ax.set_xlabel("generated token position (0 = first token: TTFT)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"Per-token latency over the sequence ({len(by_step)} steps)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _png(fig)


def _phase_spans(rows: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    spans: list[tuple[float, float, str]] = []
    for r in rows:
        ph, t = str(r.get("phase") or "idle"), float(r["t_s"])
        if spans and spans[-1][2] == ph:
            spans[-1] = (spans[-1][0], t, ph)
        else:
            if spans:
                spans[-1] = (spans[-1][0], t, spans[-1][2])
            spans.append((t, t, ph))
    return spans


def utilization_over_time(rows: list[dict[str, Any]]) -> bytes | None:
    """CPU, memory, and GPU utilization/power/memory over time, phases shaded."""
    rows = [r for r in rows if _num(r.get("t_s")) is not None]
    if len(rows) < 2:
        return None
    rows.sort(key=lambda r: r["t_s"])
    t = [r["t_s"] for r in rows]
    panels: list[tuple[str, list[tuple[str, list[float | None]]]]] = []
    # two scales: this process's CPU is % of one core (up to 100 x cores), the system's % of all
    # CPUs (up to 100): each on its own axis
    for key, label in (("cpu_process_pct", "process CPU (% of one core)"), ("cpu_system_pct", "system CPU (% of all)")):
        if any(key in r for r in rows):
            panels.append((label, [(key, [_num(r.get(key)) for r in rows])]))
    if any("rss_bytes" in r for r in rows):
        panels.append(("RSS (MiB)", [("rss", [(_num(r.get("rss_bytes")) or 0) / 2**20 if r.get("rss_bytes") is not None else None for r in rows])]))
    keys = sorted({k for r in rows for k in r if k.startswith("gpu")})
    for suffix, label, scale in (("utilization_pct", "GPU utilization (%)", 1.0), ("power_w", "GPU power (W)", 1.0),
                                 ("memory_used_bytes", "GPU memory (MiB)", 1 / 2**20)):
        lines = [(k, [(_num(r.get(k)) * scale if _num(r.get(k)) is not None else None) for r in rows])  # type: ignore[operator]
                 for k in keys if k.endswith(suffix)]
        lines = [(k, v) for k, v in lines if any(x is not None for x in v)]
        if lines:
            panels.append((label, lines))
    if not panels:
        return None
    fig, axes = _figure(len(panels), 1, width=9.5, height=1.9 * len(panels) + 0.6)
    spans = _phase_spans(rows)
    seen_phases: set[str] = set()
    for (label, lines), ax in zip(panels, axes[:, 0]):
        for a, b, ph in spans:
            if ph in ("idle", "session") or b <= a:
                continue
            color = PHASE_COLORS.get(ph.split(":")[0], "#cdb4db")
            ax.axvspan(a, b, color=color, alpha=0.35, lw=0, label=ph if ph not in seen_phases else None)
            seen_phases.add(ph)
        for i, (name, vals) in enumerate(lines):
            ax.plot(t, [v if v is not None else float("nan") for v in vals], lw=1.2, color=PALETTE[i % len(PALETTE)],
                    label=name)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a line
    axes[-1][0].set_xlabel("time since session start (s)")
    fig.suptitle("Utilization over time (shaded: phases)")
    return _png(fig)


def bar_figure(title: str, panels: dict[str, dict[str, float]], max_bars: int = 20) -> bytes | None:
    """Horizontal bar charts, one panel per named breakdown (at most four panels)."""
    items = list(panels.items())[:4]
    if not items:
        return None
    fig, axes = _figure(1, len(items), width=min(16, 4.2 * len(items)), height=3.4)
    for ax, (label, vals) in zip(axes[0], items):
        bars = list(vals.items())[:max_bars]
        ax.barh([k for k, _ in bars][::-1], [v for _, v in bars][::-1], color=PALETTE[0])
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title)
    return _png(fig)


"""The report of a load sweep (:mod:`perfsdk.experiments.load_sweep`): latency percentiles and
goodput against offered and achieved load, the knee and the SLO limit marked, the server's own
view per point when ``server_metrics`` ran, and the table of points."""

from __future__ import annotations

from typing import Any

from perfsdk.experiments.report.figures import PALETTE, Figure, Section, _figure, _png, _table
from perfsdk.store import Store, StoreError


def _marks(ax: Any, manifest: dict[str, Any]) -> None:
    knee = manifest.get("knee")
    limit = (manifest.get("slo_limit") or {}).get("level")
    if knee is not None:
        ax.axvline(knee, color="#6d6875", linestyle=":", linewidth=1.2, label=f"knee ({knee:.3g})")
    if limit is not None:
        ax.axvline(limit, color="#2a9d8f", linestyle="--", linewidth=1.2, label=f"SLO limit ({limit:.3g})")


def latency_curves(manifest: dict[str, Any]) -> bytes | None:
    """TTFT and e2e p50/p99 (from the scheduled send) against offered and achieved load."""
    pts = [p for p in manifest["points"] if p.get("ttft_p50_s") is not None]
    if len(pts) < 2:
        return None
    unit = "offered requests/s" if manifest["sweep"] == "rate" else "users"
    fig, axes = _figure(1, 2, width=11, height=4.2)
    slo = manifest.get("slo") or {}
    for ax, xkey, xlabel in ((axes[0][0], "level", unit), (axes[0][1], "achieved_rate_per_s", "achieved requests/s")):
        xs = [p[xkey] for p in pts]
        for i, (key, label) in enumerate((("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99"),
                                          ("e2e_p50_s", "e2e p50"), ("e2e_p99_s", "e2e p99"))):
            ys = [p[key] * 1e3 if p.get(key) is not None else None for p in pts]
            ax.plot(xs, ys, marker="o", color=PALETTE[i], linestyle="-" if "p50" in key else "--", label=label)
        if slo.get("ttft_s"):
            ax.axhline(slo["ttft_s"] * 1e3, color="#e76f51", linewidth=0.8, label="TTFT SLO")
        if xkey == "level":
            _marks(ax, manifest)
        for p in pts:
            if p.get("diverged"):
                ax.annotate("diverged", (p[xkey], (p.get("e2e_p99_s") or 0) * 1e3), fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms (from the scheduled send)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Latency against load")
    return _png(fig)


def goodput_curve(manifest: dict[str, Any]) -> bytes | None:
    """Achieved requests/s and goodput against the offered load."""
    pts = manifest["points"]
    if len(pts) < 2:
        return None
    fig, axes = _figure(1, 1, width=7, height=4)
    ax = axes[0][0]
    xs = [p["level"] for p in pts]
    ax.plot(xs, [p.get("achieved_rate_per_s") for p in pts], marker="o", color=PALETTE[0], label="achieved")
    if any(p.get("goodput") is not None for p in pts):
        ax.plot(xs, [p.get("goodput") for p in pts], marker="s", color=PALETTE[2], label="goodput (met every SLO)")
    if manifest["sweep"] == "rate":
        ax.plot(xs, xs, color="#aaaaaa", linewidth=0.8, linestyle=":", label="offered")
    _marks(ax, manifest)
    ax.set_xlabel("offered requests/s" if manifest["sweep"] == "rate" else "users")
    ax.set_ylabel("requests/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Throughput and goodput against load")
    return _png(fig)


def server_curves(manifest: dict[str, Any], runs: dict[str, Any]) -> bytes | None:
    """The server's own view per point (``server_metrics``): queue and KV-cache usage peaks."""
    from perfsdk.collectors.server_metrics import ServerMetricsCollector

    rows = []
    for p in manifest["points"]:
        run = runs.get(p["run_id"])
        sm = ServerMetricsCollector.result_of(run) if run is not None else None
        if sm is not None and sm.status == "ok":
            rows.append((p["level"], sm.peaks, sm.deltas))
    keys = sorted({k for _, peaks, _ in rows for k in peaks} | {k for _, _, d in rows for k in d if k == "preemptions"})
    if len(rows) < 2 or not keys:
        return None
    fig, axes = _figure(1, 1, width=7, height=4)
    ax = axes[0][0]
    for i, k in enumerate(keys):
        ax.plot([r[0] for r in rows], [r[1].get(k, r[2].get(k)) for r in rows], marker="o", color=PALETTE[i % len(PALETTE)],
                label=k)
    _marks(ax, manifest)
    ax.set_xlabel("offered requests/s" if manifest["sweep"] == "rate" else "users")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("The server's view (peaks per point; preemptions: count)")
    return _png(fig)


def load_sweep_sections(store: Store, manifest: dict[str, Any]) -> tuple[str, list[Section]]:
    """Title and sections of a load sweep's report."""
    runs: dict[str, Any] = {}
    for p in manifest["points"]:
        try:
            runs[p["run_id"]] = store.get(p["run_id"])
        except StoreError:
            continue
    sec = Section("Load sweep")
    lim = manifest.get("slo_limit")
    facts = [["sweep", manifest["sweep"]], ["saturation requests/s", manifest.get("saturation_rate_per_s")],
             ["knee", manifest.get("knee")], ["SLO-limited level", lim.get("level") if lim else None],
             ["SLO met in", f"{lim['met']} of {lim['measurements']} measurements" if lim else None],
             ["stopped", manifest.get("stopped")], ["objectives", manifest.get("slo")]]
    sec.html.append(_table(["", ""], facts, "kv"))
    rows = [[p["level"], p.get("achieved_rate_per_s"), *(p.get(k) * 1e3 if p.get(k) is not None else None
                                                          for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s")),
             p.get("goodput"), p.get("errors"), p.get("verdict"), p.get("diverged") or "", p["run_id"]]
            for p in manifest["points"]]
    sec.html.append(_table(["level", "achieved/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "e2e p99 ms",
                            "goodput/s", "errors", "validity", "diverged", "run"], rows))
    for slug, title, png in (("load-latency", "Latency against load", latency_curves(manifest)),
                             ("load-goodput", "Throughput and goodput", goodput_curve(manifest)),
                             ("load-server", "The server's view", server_curves(manifest, runs))):
        if png:
            sec.figures.append(Figure(slug, title, png))
    if manifest.get("repeats"):
        sec.notes.append(f"the SLO-limited level was measured {len(manifest['repeats'])} more time(s): "
                         + ", ".join(p["run_id"] for p in manifest["repeats"]))
    return manifest.get("name") or manifest["sweep_id"], [sec]

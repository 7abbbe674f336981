"""The sections of a sweep report: the points table, batch-size and vision-token panels, the
Pareto front, the search strategies' sample efficiency, heat maps over two axes and the latency
CDF of every point."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from perfsdk.exporters.flatten import run_row
from perfsdk.experiments.report.figures import (
    PALETTE,
    Figure,
    ReportError,
    Section,
    _figure,
    _num,
    _png,
    _table,
    request_samples,
)
from perfsdk.experiments.sweep.overview import constraint_lines, figure_fields, point_figures, validity_line
from perfsdk.schemas import RunResult
from perfsdk.store import Store


#: At most this many panels per sweep figure, and this many per collector.
MAX_PANELS = 8
PANELS_PER_COLLECTOR = 3


def metric_panels(rows: list[dict[str, Any]], registry: Any = None) -> list[tuple[str, list[str], float]]:
    """(title, columns, scale) of the panels a sweep plots: each collector's declared key columns
    (``Collector.key_columns``), percentiles of one statistic sharing a panel, its first few
    statistics with data in ``rows``; seconds shown in ms, bytes in MiB."""
    from perfsdk.exporters.flatten import key_columns

    present = {k for r in rows for k, v in r.items() if _num(v) is not None}
    panels: dict[str, list[str]] = {}
    per_collector: dict[str, int] = defaultdict(int)
    for col in key_columns(registry):
        if not col.startswith("collectors.") or not any(p == col or p.startswith(col + ".") for p in present):
            continue
        cname, path = col.split(".", 2)[1:]
        base, _, last = path.rpartition(".")
        stat_base = base if last.startswith("p") and last[1:].isdigit() else path
        key = f"{cname}.{stat_base}"
        if key not in panels:
            if per_collector[cname] >= PANELS_PER_COLLECTOR or len(panels) >= MAX_PANELS:
                continue
            per_collector[cname] += 1
            panels[key] = []
        panels[key].append(col)
    out = []
    for key, cols in panels.items():
        cname, stat = key.split(".", 1)
        scale, unit = (1e3, " (ms)") if stat.endswith("_s") and not stat.endswith("per_s") else \
            ((1 / 2**20, " (MiB)") if stat.endswith("_bytes") else (1.0, ""))
        quants = [c.rsplit(".", 1)[1] for c in cols if c != f"collectors.{key}"]
        label = stat.removesuffix("_s").removesuffix("_bytes").replace("_", " ")
        out.append((f"{cname}: {label}{' ' + ' / '.join(quants) if quants else ''}{unit}", cols, scale))
    return out


#: Characters a panel title of a 4-inch panel holds on one line at font size 10.
PANEL_TITLE_CHARS = 34


def panel_title(text: str, width: int = PANEL_TITLE_CHARS) -> str:
    """``text`` wrapped between words to fit a panel (a long title is never cut off)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False)) or text


def _lookup(row: dict[str, Any], key: str) -> float | None:
    v = _num(row.get(key))
    if v is not None:
        return v
    for k in sorted(row):  # a mapping under the key column: its first numeric value
        if k.startswith(key + "."):
            v = _num(row[k])
            if v is not None:
                return v
    return None


def batch_size_panels(rows: list[dict[str, Any]], group_keys: list[str]) -> bytes | None:
    """Each collector's key figures (:func:`metric_panels`) against batch size, one line per
    other-axis combination."""
    pts = [r for r in rows if _num(r.get("workload.batch_size")) is not None]
    if len({r["workload.batch_size"] for r in pts}) < 2:
        return None
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in pts:
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={r.get('tags.' + k)}" for k in group_keys) or "all"
        groups[label].append(r)
    panels = metric_panels(pts)
    if not panels:
        return None
    fig, axes = _figure(1, len(panels), width=4.0 * len(panels), height=3.6)
    for ax, (title, keys, scale) in zip(axes[0], panels):
        drawn = False
        for gi, (label, grows) in enumerate(sorted(groups.items())):
            grows = sorted(grows, key=lambda r: r["workload.batch_size"])
            for ki, key in enumerate(keys):
                xy = [(r["workload.batch_size"], _lookup(r, key)) for r in grows]
                xy = [(x, y * scale) for x, y in xy if y is not None]
                if not xy:
                    continue
                drawn = True
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", ms=4, color=PALETTE[gi % len(PALETTE)],
                        ls="-" if ki == 0 else "--", label=label if ki == 0 else None)
        ax.set_title(panel_title(title), fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="grey")
    _shared_legend(fig, axes, min_labels=1)
    fig.suptitle("Batch size (dashed: p95)")
    return _png(fig)


def _shared_legend(fig: Any, axes: Any, min_labels: int = 1) -> None:
    """One legend below the panels, from the first panel that has labelled lines."""
    handles, labels = [], []
    for ax in axes[0]:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            break
    if handles and len(labels) >= min_labels:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(6, len(labels)), fontsize=8)


def vision_panels() -> list[tuple[str, str]]:
    """Per-phase latency panels against vision tokens, (title, column): the latency collector
    names its columns."""
    from perfsdk.collectors.latency import LatencyCollector

    return LatencyCollector.phase_columns()


def vision_x_columns() -> tuple[str, ...]:
    """Where a point's vision tokens per request are read: the workload's, then the collector's."""
    from perfsdk.collectors.latency import LatencyCollector

    return ("workload.vision_tokens_mean", *LatencyCollector.vision_token_columns())


def _vision_x(row: dict[str, Any]) -> float | None:
    for key in vision_x_columns():
        v = _num(row.get(key))
        if v is not None:
            return v
    return None


def vision_token_panels(rows: list[dict[str, Any]], group_keys: list[str]) -> bytes | None:
    """Each phase's latency (p50) against the real vision tokens per request, one line per
    combination of the other axes; ``None`` when fewer than two points have vision tokens."""
    pts = [r for r in rows if _vision_x(r) is not None]
    if len({_vision_x(r) for r in pts}) < 2:
        return None
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in pts:
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={r.get('tags.' + k)}" for k in group_keys) or "all"
        groups[label].append(r)
    fig, axes = _figure(1, len(vision_panels()), width=4.0 * len(vision_panels()), height=3.6)
    for ax, (title, key) in zip(axes[0], vision_panels()):
        drawn = False
        for gi, (label, grows) in enumerate(sorted(groups.items())):
            xy = sorted((_vision_x(r), _lookup(r, key)) for r in grows)
            xy = [(x, y * 1e3) for x, y in xy if x is not None and y is not None]
            if not xy:
                continue
            drawn = True
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", ms=4, color=PALETTE[gi % len(PALETTE)],
                    label=label)
        ax.set_title(panel_title(title), fontsize=10)
        ax.set_xlabel("vision tokens per request")
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="grey")
    _shared_legend(fig, axes, min_labels=2)
    fig.suptitle("Latency by phase against vision tokens")
    return _png(fig)


def pareto_plot(points: list[dict[str, Any]], objectives: list[Any], labels: list[str]) -> bytes | None:
    """The first two objectives of every finished point; the front highlighted and joined."""
    from perfsdk.experiments.pareto import Objective, pareto_indices

    objs = [o if isinstance(o, Objective) else Objective(**o) for o in objectives][:2]
    if len(objs) < 2:
        return None
    vals = [(i, _num(p["values"].get(objs[0].field)), _num(p["values"].get(objs[1].field))) for i, p in enumerate(points)]
    vals = [(i, x, y) for i, x, y in vals if x is not None and y is not None]
    if not vals:
        return None
    feasible = [i for i, _, _ in vals if points[i].get("feasible") is not False]
    front = {feasible[k] for k in pareto_indices([points[i]["values"] for i in feasible], objs)}
    fig, axes = _figure(1, 1, width=7.5, height=4.8)
    ax = axes[0][0]
    for k, (i, x, y) in enumerate(vals):
        on = i in front
        infeasible = points[i].get("feasible") is False
        ax.scatter([x], [y], s=60 if on else 30, marker="x" if infeasible else "o",
                   color=PALETTE[1] if on else ("#999999" if infeasible else PALETTE[0]), zorder=3)
        # alternate label offsets so that points with near-equal values stay readable
        ax.annotate(labels[i], (x, y), textcoords="offset points", xytext=(6, 5 if k % 2 == 0 else -11), fontsize=7)
    fr = sorted((x, y) for i, x, y in vals if i in front)
    if len(fr) > 1:
        ax.plot([x for x, _ in fr], [y for _, y in fr], color=PALETTE[1], lw=1.5, zorder=2, label="Pareto front")
    elif fr:
        ax.scatter([], [], color=PALETTE[1], label="Pareto front")
    ax.scatter([], [], color=PALETTE[0], s=30, label="dominated")
    if any(points[i].get("feasible") is False for i, _, _ in vals):
        ax.scatter([], [], color="#999999", marker="x", label="violates a constraint")
    ax.set_xlabel(f"{objs[0].field.replace('collectors.', '')} ({objs[0].direction})")
    ax.set_ylabel(f"{objs[1].field.replace('collectors.', '')} ({objs[1].direction})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Pareto front: {len(front)} of {len(vals)} points")
    return _png(fig)


def default_objectives() -> list[dict[str, str]]:
    """The Pareto axes of a sweep that names fewer than two objectives: the first two key columns
    of the first installed collector that declares at least two (the latency collector's
    throughput and TTFT p50), each in its better direction."""
    from perfsdk.experiments.compare import _lower_is_better
    from perfsdk.plugins import installed_registry, ordered_collectors

    reg = installed_registry()
    for name in ordered_collectors(reg.collectors, reg):
        cols = reg.collectors[name].key_columns
        if len(cols) >= 2:
            return [{"field": f"collectors.{name}.{c}",
                     "direction": "minimize" if _lower_is_better(c) is not False else "maximize"} for c in cols[:2]]
    return []


def _resolve_axis(name: str, axes: list[str]) -> str:
    """An axis by its full path or by a unique last part (``batch_size``)."""
    if name in axes:
        return name
    hits = [a for a in axes if a.endswith("." + name) or a.rsplit(".", 1)[-1] == name]
    if len(hits) == 1:
        return hits[0]
    why = "is ambiguous" if hits else "is not an axis of this sweep"
    raise ReportError(f"heat map axis {name!r} {why} (axes: {', '.join(axes)})")


def heatmap_figure(points: list[dict[str, Any]], rows: dict[str, dict[str, Any]], axes_values: dict[str, list[Any]],
                   x: str, y: str, metric: str) -> bytes | None:
    """``metric`` over the ``x`` and ``y`` axis values; each cell is the mean over the finished
    points with those two values (the other axes vary inside a cell: the count is shown)."""
    import numpy as np

    xs, ys = axes_values[x], axes_values[y]
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    for p in points:
        if p["status"] not in ("ok", "partial"):
            continue
        v = _num((p.get("objectives") or {}).get(metric))
        if v is None:
            v = _lookup(rows.get(p.get("run_id") or "", {}), metric)
        if v is None:
            continue
        try:
            i, j = ys.index(p["values"][y]), xs.index(p["values"][x])
        except (KeyError, ValueError):
            continue
        cells[(i, j)].append(v)
    if not cells:
        return None
    grid = np.full((len(ys), len(xs)), np.nan)
    for (i, j), vals in cells.items():
        grid[i, j] = sum(vals) / len(vals)
    fig, axes = _figure(1, 1, width=max(5.0, 1.3 * len(xs) + 2.5), height=max(3.2, 0.8 * len(ys) + 1.8))
    ax = axes[0][0]
    masked = np.ma.masked_invalid(grid)
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    im = ax.imshow(masked, cmap=cmap, aspect="auto", origin="lower")
    lo, hi = float(np.nanmin(grid)), float(np.nanmax(grid))
    for (i, j), vals in cells.items():
        v = grid[i, j]
        light = hi > lo and (v - lo) / (hi - lo) < 0.5
        text = f"{v:.3g}" + (f"\n(n={len(vals)})" if len(vals) > 1 else "")
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if light else "black")
    for i in range(len(ys)):
        for j in range(len(xs)):
            if (i, j) not in cells:
                ax.text(j, i, "not measured", ha="center", va="center", fontsize=7, color="#777777")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    fig.colorbar(im, ax=ax, label=metric.replace("collectors.", ""))
    ax.set_title(panel_title(f"{metric.replace('collectors.', '')} over {x.rsplit('.', 1)[-1]} x "
                             f"{y.rsplit('.', 1)[-1]}", 48), fontsize=10)
    return _png(fig)


def efficiency_figure(manifest: dict[str, Any]) -> bytes | None:
    """Best-so-far objective against the number of trials, one line per strategy, with the
    optimum as a dashed line and each strategy's first trial at the optimum marked."""
    eff = manifest.get("efficiency") or {}
    primary = manifest.get("primary")
    if len(eff) < 2 or not primary:
        return None
    fig, axes = _figure(1, 1, width=7.5, height=4.2)
    ax = axes[0][0]
    drawn = False
    for i, (name, e) in enumerate(eff.items()):
        pts = [(k + 1, v) for k, v in enumerate(e["best_so_far"]) if v is not None]
        if not pts:
            continue
        drawn = True
        color = PALETTE[i % len(PALETTE)]
        ax.step([k for k, _ in pts], [v for _, v in pts], where="post", marker="o", ms=4, color=color,
                label=f"{name} (optimum at trial {e['trials_to_optimum']})" if e["trials_to_optimum"] else f"{name} (never)")
        if e["trials_to_optimum"]:
            k = e["trials_to_optimum"]
            ax.scatter([k], [e["best_so_far"][k - 1]], s=120, facecolors="none", edgecolors=color, zorder=4)
    if not drawn:
        return None
    if manifest.get("optimum") is not None:
        src = "grid optimum" if manifest.get("optimum_source") == "grid" else "best point found"
        ax.axhline(manifest["optimum"], color="grey", ls="--", lw=1, label=src)
    label = "weighted score" if primary["field"] == "score" else primary["field"].replace("collectors.", "")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trials (points evaluated by the strategy)")
    ax.set_ylabel(f"best {label} so far ({primary['direction']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Sample efficiency of the search strategies")
    return _png(fig)


def _with_run_details(p: dict[str, Any], run: RunResult | None, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A manifest point with its run's validity and figures (manifests written before they were
    kept, or points rebuilt from tags, get them from the stored run)."""
    if run is None or (p.get("validity") is not None and "figures" in p):
        return p
    q = dict(p)
    if run.validity is not None:
        q["validity"], q["validity_reasons"] = run.validity.verdict, list(run.validity.reasons)
    q["figures"] = point_figures(rows[run.run_id])
    return q


def sweep_sections(store: Store, sweep_id: str, heatmaps: list[Any] | None = None) -> tuple[str, list[Section]]:
    """Title and sections of a sweep report; ``heatmaps`` are drawn besides those the sweep
    file asks for (``report.heatmaps``)."""
    from perfsdk.experiments.sweep import read_manifest

    try:
        manifest: dict[str, Any] | None = read_manifest(store, sweep_id)
    except FileNotFoundError:
        manifest = None
    if manifest is not None and manifest.get("kind") == "load":
        from perfsdk.experiments.report.load import load_sweep_sections

        return load_sweep_sections(store, manifest)
    runs = {r.run_id: r for r in store.list_runs(tags={"sweep_id": sweep_id})} if store.runs_dir.is_dir() else {}
    if manifest is None and not runs:
        raise ReportError(f"{sweep_id}: no run or sweep with this id in {store.root}")
    if manifest is not None:
        axes = list(manifest["axes"])
        objectives = manifest.get("objectives") or []
        constraints = manifest.get("constraints") or []
        plist = manifest["points"]
    else:  # no manifest (e.g. copied runs): rebuild the points from the tags
        axes = sorted({k for r in runs.values() for k in r.tags if k not in ("sweep_id", "sweep_point")})
        objectives, constraints = [], []
        plist = [{"point_id": r.tags.get("sweep_point"), "values": {k: r.tags.get(k) for k in axes}, "status": r.status,
                  "run_id": r.run_id, "error": None, "objectives": {}, "feasible": None, "pareto": False}
                 for r in sorted(runs.values(), key=lambda r: r.run_id)]
    rows: dict[str, dict[str, Any]] = {rid: run_row(r) for rid, r in runs.items()}
    plist = [_with_run_details(p, runs.get(p.get("run_id") or ""), rows) for p in plist]
    secs: list[Section] = []

    s = Section("Sweep")
    info: list[list[Any]]
    info = [["sweep", sweep_id], ["status", manifest.get("status") if manifest else "-"],
            ["strategy", manifest.get("strategy") if manifest else "-"],
            ["points", len(plist)], ["finished", sum(1 for p in plist if p["status"] in ("ok", "partial"))],
            ["failed", sum(1 for p in plist if p["status"] == "failed")],
            ["axes", "; ".join(f"{k}: {v}" for k, v in (manifest["axes"].items() if manifest else []))],
            ["objectives", "; ".join(f"{o['direction']} {o['field']}" for o in objectives) or "-"],
            ["constraints", "; ".join(constraints) or "-"],
            ["validity", validity_line(plist).removeprefix("validity: ")]]
    info += [["Pareto front" if line.startswith("Pareto") else "constraint", line]
             for line in constraint_lines({"points": plist, "objectives": objectives, "constraints": constraints,
                                           "pareto": [p["point_id"] for p in plist if p.get("pareto")]})]
    s.html.append(_table(["field", "value"], info, "kv"))
    obj_fields = [o["field"] for o in objectives] or [o["field"] for o in default_objectives()]
    if manifest is not None and manifest.get("objective"):
        obj_fields = obj_fields + [f for f in manifest["objective"]["weights"] if f not in obj_fields] + ["score"]
    extra = figure_fields(plist, exclude=obj_fields)
    headers = [a.rsplit(".", 1)[-1] for a in axes] + ["status"] + [f.replace("collectors.", "") for f in obj_fields] + \
        [f.replace("collectors.", "") for f in extra] + ["validity", "feasible", "pareto", "run"]
    table_rows = []
    for p in plist:
        row = rows.get(p.get("run_id") or "", {})
        table_rows.append([p["values"].get(a) for a in axes] + [p["status"]] +
                          [p["objectives"].get(f, _lookup(row, f)) if p.get("objectives") else _lookup(row, f)
                           for f in obj_fields] +
                          [(p.get("figures") or {}).get(f) for f in extra] +
                          [p.get("validity") or "-",
                           {True: "yes", False: "no", None: "-"}[p.get("feasible")], "*" if p.get("pareto") else "",
                           p.get("run_id") or p.get("error") or "-"])
    s.html.append(_table(headers, table_rows))
    secs.append(s)

    finished = [p for p in plist if p["status"] in ("ok", "partial") and p.get("run_id") in rows]
    batch_axes = [a for a in axes if a.endswith("batch_size")]
    frows = []
    for p in finished:
        r = dict(rows[p["run_id"]])
        for a in axes:  # make the axis values available under the tag names used for grouping
            r.setdefault("tags." + a, p["values"].get(a))
        if _num(r.get("workload.batch_size")) is None:  # runs without workload info: the axis value
            for a in batch_axes:
                if _num(p["values"].get(a)) is not None:
                    r["workload.batch_size"] = p["values"][a]
        frows.append(r)
    s = Section("Batch-size panels")
    fig = batch_size_panels(frows, [a for a in axes if a not in batch_axes])
    if fig:
        s.figures.append(Figure("batch-size", "Batch-size panels", fig,
                                "One line per combination of the other axes; missing measurements are marked."))
    else:
        s.notes.append("The batch size does not vary in this sweep.")
    secs.append(s)

    vision_knobs = [a for a in axes if a.endswith(("image_size", "num_crops"))]
    fig = vision_token_panels(frows, [a for a in axes if a not in vision_knobs])
    if fig:
        s = Section("Vision tokens")
        s.figures.append(Figure("vision-tokens", "Latency by phase against vision tokens", fig,
                                "x: real vision tokens per request (mean over the run), read from the vision "
                                "features; one line per combination of the other axes."))
        secs.append(s)

    s = Section("Pareto front")
    objs = objectives if len(objectives) >= 2 else default_objectives()
    ppoints = []
    labels = []
    for p in finished:
        row = rows[p["run_id"]]
        ppoints.append({"values": {o["field"]: _lookup(row, o["field"]) for o in objs}, "feasible": p.get("feasible")})
        labels.append(",".join(str(p["values"].get(a)) for a in axes))
    fig = pareto_plot(ppoints, objs, labels)
    if fig:
        s.figures.append(Figure("pareto", "Pareto front", fig,
                                "Non-dominated points among those meeting every constraint." +
                                ("" if len(objectives) >= 2 else " (Default objectives: tokens/s vs TTFT p95.)")))
    else:
        s.notes.append("Not enough finished points with both objective values for a Pareto plot.")
    secs.append(s)

    if manifest is not None:
        s = Section("Search strategies")
        fig = efficiency_figure(manifest)
        if fig:
            eff = manifest["efficiency"]
            s.figures.append(Figure("sample-efficiency", "Sample efficiency", fig,
                                    "Best objective found after each trial; circles: the first trial at the optimum. "
                                    "Configurations measured for one strategy are reused by the others."))
            s.html.append(_table(["strategy", "trials", "best", "trials to reach the optimum"],
                                 [[n, e["trials"], e["best"], e["trials_to_optimum"] or "never"] for n, e in eff.items()]))
            secs.append(s)

    axes_values = manifest["axes"] if manifest is not None else {a: sorted({p["values"].get(a) for p in plist}, key=str)
                                                                 for a in axes}
    wanted = list(heatmaps or [])
    if manifest is not None:
        from perfsdk.experiments.sweep import Heatmap

        wanted += [Heatmap.model_validate(h) for h in (manifest.get("report") or {}).get("heatmaps", [])]
    varied = [a for a in axes if len(axes_values.get(a) or []) > 1]
    if not wanted and len(varied) >= 2:
        from perfsdk.experiments.sweep import Heatmap

        primary = (manifest or {}).get("primary") or (objectives[0] if objectives else (default_objectives() or [{}])[0])
        if primary.get("field"):
            wanted = [Heatmap(x=varied[0], y=varied[1], metric=primary["field"])]
    if wanted:
        s = Section("Heat maps")
        for hm in wanted:
            x, y = _resolve_axis(hm.x, axes), _resolve_axis(hm.y, axes)
            fig = heatmap_figure(plist, rows, axes_values, x, y, hm.metric)
            short = f"{hm.metric.replace('collectors.', '')}-{x.rsplit('.', 1)[-1]}-{y.rsplit('.', 1)[-1]}"
            slug = re.sub(r"[^A-Za-z0-9]+", "-", f"heatmap-{short}").strip("-")[:80]
            if fig:
                s.figures.append(Figure(slug, f"{hm.metric} over {x} and {y}", fig,
                                        "Mean over the finished points sharing each cell; grey: not measured."))
            else:
                s.notes.append(f"No finished point has {hm.metric}: no heat map over {x} and {y}.")
        secs.append(s)

    s = Section("Latency CDF per point")
    cdf_runs = [(",".join(str(p["values"].get(a)) for a in axes), runs[p["run_id"]]) for p in finished][:12]
    fig = _overlay_cdf(store, cdf_runs)
    if fig:
        s.figures.append(Figure("latency-cdf", "End-to-end latency CDF per point", fig))
        secs.append(s)
    return (manifest or {}).get("name", sweep_id), secs


def _overlay_cdf(store: Store, labelled: list[tuple[str, RunResult]]) -> bytes | None:
    curves = []
    for label, run in labelled:
        vals = request_samples(store, run).get("e2e_s")
        if vals:
            curves.append((label, sorted(v * 1e3 for v in vals)))
    if not curves:
        return None
    fig, axes = _figure(1, 1, width=8, height=4)
    ax = axes[0][0]
    for i, (label, xs) in enumerate(curves):
        ax.step(xs, [(k + 1) / len(xs) for k in range(len(xs))], where="post", color=PALETTE[i % len(PALETTE)], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency per request (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncols=2)
    return _png(fig)

"""The report page: one self-contained HTML file (PNG figures inline as base64) plus the same
PNGs in a folder next to it (``<name>_files/``)."""

from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfsdk.experiments.report.figures import ReportError, Section
from perfsdk.experiments.report.run import run_sections
from perfsdk.experiments.report.sweep import sweep_sections
from perfsdk.store import Store, StoreError, atomic_write


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #264653;padding-bottom:.3em}
h2{font-size:1.25em;margin-top:1.8em;color:#264653}
table{border-collapse:collapse;margin:.8em 0;font-size:.85em}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f1f4f5}
td:first-child,th:first-child{text-align:left}
table.kv{display:inline-table;margin-right:2em;vertical-align:top}
figure{margin:1em 0}
figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}
.note{color:#777;font-style:italic}
footer{margin-top:3em;font-size:.8em;color:#888}
"""


def render_html(title: str, sections: list[Section], subtitle: str = "") -> str:
    """The report page with every figure inline (``data:image/png;base64``)."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(f"<p>{html.escape(subtitle)}</p>")
    for sec in sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        parts.extend(sec.html)
        for fig in sec.figures:
            b64 = base64.b64encode(fig.png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(fig.title)}' src='data:image/png;base64,{b64}'>"
                         f"<figcaption>{html.escape(fig.caption or fig.title)}</figcaption></figure>")
        for note in sec.notes:
            parts.append(f"<p class='note'>{html.escape(note)}</p>")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<footer>perfsdk report, generated {stamp}</footer></body></html>")
    return "\n".join(parts)


def build_report(store: Store, ident: str, heatmaps: list[Any] | None = None) -> tuple[str, list[Section]]:
    """(title, sections) for a run id or a sweep id (``heatmaps``: extra sweep heat maps)."""
    try:
        run = store.get(ident)
    except StoreError:
        run = None
    if run is not None:
        return f"Run {run.name} ({run.run_id})", run_sections(store, run)
    name, secs = sweep_sections(store, ident, heatmaps)
    return f"Sweep {name} ({ident})" if name != ident else f"Sweep {ident}", secs


def write_report(store: Store | str, ident: str, output: str | Path = "report.html",
                 heatmaps: list[Any] | None = None) -> tuple[Path, list[Path]]:
    """Write the HTML report and its PNGs (``<output stem>_files/NN-<slug>.png``).

    ``heatmaps`` (:class:`~perfsdk.experiments.sweep.Heatmap` items) add heat maps to a sweep
    report; a run report ignores them."""
    st = store if isinstance(store, Store) else Store(store)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("reports need matplotlib: pip install 'perfsdk[report]'") from None
    title, sections = build_report(st, ident, heatmaps)
    out = Path(output)
    folder = out.parent / f"{out.stem}_files"
    folder.mkdir(parents=True, exist_ok=True)
    pngs: list[Path] = []
    n = 0
    for sec in sections:
        for fig in sec.figures:
            n += 1
            p = folder / f"{n:02d}-{fig.slug}.png"
            atomic_write(p, fig.png)
            pngs.append(p)
    atomic_write(out, render_html(title, sections).encode("utf-8"))
    return out, pngs


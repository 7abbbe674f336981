"""The ``layers`` result as tables: the layer table, the per-function tables and the event log,
for the terminal (rich) and for the HTML report, from the same rows."""

from __future__ import annotations

import html
from typing import Any

from perfsdk.collector import ReportSection
from perfsdk.collectors.layers.functions import CATEGORY_LABELS
from perfsdk.collectors.layers.result import PHASES, LayersResult, ParamValue
from perfsdk.fmt import fmt_ms as _ms
from perfsdk.fmt import fmt_pct as _pct

#: (headers, rows of cells, column is numeric)
TableData = tuple[list[str], list[list[str]], list[bool]]


from perfsdk.fmt import fmt_us as _us  # noqa: E402


def _shapes(shapes: list[list[int]]) -> str:
    return ", ".join("(" + ", ".join(str(d) for d in s) + ")" for s in shapes)


def _value(v: ParamValue) -> str:
    if isinstance(v, list):
        return "(" + ", ".join(str(x) for x in v) + ")"
    return f"{v:g}" if isinstance(v, float) else str(v)


def params_text(params: dict[str, ParamValue]) -> str:
    """``in_features=100, out_features=200, bias=True``."""
    return ", ".join(f"{k}={_value(v)}" for k, v in params.items())


def layer_table_data(result: LayersResult, sort: str = "model") -> TableData:
    """One row per module: type, settings, input shapes, calls and time per phase, share of the
    instrumented step time. ``sort``: ``model`` (the model's order, indented by depth) or ``time``."""
    phases = [p for p in PHASES if any(r.phase == p for r in result.modules)]
    by_path: dict[str, dict[str, Any]] = {}
    for r in result.modules:
        row = by_path.setdefault(r.path, {"row": r, "calls": {}, "time": {}, "share": 0.0, "shapes": r.input_shapes})
        row["calls"][r.phase] = r.calls
        row["time"][r.phase] = r.total_s
        row["share"] += r.share_pct
    items = list(by_path.values())
    if sort == "time":
        items.sort(key=lambda x: -sum(x["time"].values()))
    else:
        items.sort(key=lambda x: (x["row"].order, x["row"].path))
    headers = ["module", "type", "parameters", "input shapes", "calls"] + [f"{p} ms" for p in phases] + ["% step"]
    numeric = [False, False, False, False, True] + [True] * len(phases) + [True]
    rows = []
    for x in items:
        r = x["row"]
        # one space per level: the path itself says where a module sits, the indent only guides the eye
        name = (" " * max(0, r.depth - 1) + r.path) if sort == "model" and r.depth > 0 else r.path
        calls = " / ".join(str(x["calls"].get(p, 0)) for p in phases)
        rows.append([name, r.module_type, params_text(r.params), _shapes(x["shapes"]), calls]
                    + [_ms(x["time"].get(p)) for p in phases] + [_pct(x["share"])])
    return headers, rows, numeric


def function_totals_data(result: LayersResult) -> TableData:
    """Per phase and kind (matmul, attention, softmax, activation, normalization): operations,
    measured time, share of the step, FLOPs."""
    headers = ["phase", "function", "ops", "time ms", "% step", "GFLOP"]
    rows = [[t.phase, CATEGORY_LABELS.get(t.category, t.category), str(t.ops), _ms(t.time_s), _pct(t.share_pct),
             f"{t.flops / 1e9:.4g}"] for t in result.per_function_totals]
    return headers, rows, [False, False, True, True, True, True]


def function_ops_data(result: LayersResult) -> TableData:
    """Per operation: calls, total and mean time, share of the step, shapes of its first call."""
    headers = ["phase", "function", "operation", "calls", "total ms", "mean µs", "% step", "first input shapes"]
    rows = [[o.phase, CATEGORY_LABELS.get(o.category, o.category), o.op, str(o.calls), _ms(o.time_s), _us(o.mean_s),
             _pct(o.share_pct), _shapes(o.input_shapes)] for o in result.per_function_ops]
    return headers, rows, [False, False, False, True, True, True, True, False]


def event_log_data(events: list[dict[str, Any]], limit: int | None = None) -> TableData:
    """The time-ordered module calls (``layers_events``): start within the step, duration, step,
    phase, forward pass, module indented by depth, type, input shapes, context length."""
    headers = ["start ms", "duration ms", "step", "phase", "forward", "module", "type", "input shapes", "context"]
    rows = []
    for e in events[:limit] if limit else events:
        depth = int(e.get("depth") or 0)
        rows.append([_ms(e.get("start_s")), _ms(e.get("duration_s")), str(e.get("step")), str(e.get("phase")),
                     str(e.get("forward")), " " * depth + str(e.get("path")), str(e.get("module_type")),
                     _shapes(e.get("input_shapes") or []),
                     # cached + new positions: meaningful inside generate only
                     "-" if e.get("context_len") is None or e.get("phase") == "forward" else str(e["context_len"])])
    return headers, rows, [True, True, True, False, True, False, False, False, True]


# -- rendering ------------------------------------------------------------------------------


#: Columns the terminal leaves out first when a table does not fit (``--wide`` keeps them).
OPTIONAL_COLUMNS = ("parameters", "first input shapes", "input shapes", "forward", "context", "type", "function",
                    "step")
#: Columns whose values are names or counts that are never wrapped.
_WHOLE = {"module", "type", "operation", "function", "phase", "calls", "step", "forward", "context"}


def rich_table(data: TableData, title: str | None = None, caption: str | None = None) -> Any:
    """A rich table of ``data``: names (module paths, types) whole, long settings and shapes
    wrapped between words, and the columns in :data:`OPTIONAL_COLUMNS` marked as ones the
    terminal may leave out."""
    from rich.table import Table

    from perfsdk.terminal import optional_columns

    headers, rows, numeric = data
    t = Table(title=title, caption=caption, caption_justify="left", show_edge=False)
    for h, num in zip(headers, numeric):
        t.add_column(h, justify="right" if num else "left", no_wrap=h in _WHOLE)
    for row in rows:
        t.add_row(*row)
    return optional_columns(t, *OPTIONAL_COLUMNS)


def html_table(data: TableData, caption: str | None = None) -> str:
    """An HTML table of ``data`` (cells escaped; indentation kept)."""
    headers, rows, numeric = data
    out = ["<table class=\"layers\">"]
    if caption:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr></thead><tbody>")
    for row in rows:
        cells = []
        for cell, num in zip(row, numeric):
            lead = len(cell) - len(cell.lstrip(" "))
            text = "&nbsp;" * lead + html.escape(cell.lstrip(" "))
            cells.append(f"<td style=\"text-align:{'right' if num else 'left'}\">{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def summary_tables(result: LayersResult) -> list[Any]:
    """The run summary's tables: slowest layers per phase, coverage and overhead."""
    return layers_tables(result.model_dump(mode="json"))


def layers_tables(lay: dict[str, Any] | None, max_rows: int = 15) -> list[Any]:
    """Rich tables of a ``layers`` result (its JSON form): per-phase module times, coverage."""
    from rich.table import Table

    tables: list[Any] = []
    if lay and lay.get("status") == "ok":
        for phase in ("encode", "prefill", "decode", "forward"):
            rows = [r for r in lay.get("modules", []) if r["phase"] == phase and r["depth"] > 0]
            if not rows:
                continue
            ph = next((p for p in lay.get("phases", []) if p["phase"] == phase), None)
            title = f"Layers — {phase}"
            if ph:
                title += f" ({ph['forwards']} forwards, {_ms(ph['total_s'])} ms)"
            t = Table(title=title)
            for col, just in (("module", "left"), ("type", "left"), ("calls", "right"), ("total ms", "right"),
                              ("mean ms", "right"), ("% step", "right"), (f"% {phase}", "right")):
                t.add_column(col, justify=just)  # type: ignore[arg-type]
            for r in sorted(rows, key=lambda r: -r["total_s"])[:max_rows]:
                t.add_row(r["path"], r["module_type"], str(r["calls"]), _ms(r["total_s"]), _ms(r["mean_s"]),
                          _pct(r["share_pct"]), _pct(r.get("phase_share_pct")))
            tables.append(t)
        t = Table(title="Layers — coverage and overhead", show_header=False)
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("instrumented steps", f"{lay['steps_instrumented']} ({lay['steps_selection']})")
        t.add_row("coverage of step time", f"{_pct(lay.get('coverage_pct'))} %")
        t.add_row("coverage of model forward time", f"{_pct(lay.get('forward_coverage_pct'))} %")
        ovh = lay.get("overhead_pct")
        t.add_row("overhead vs un-instrumented steps", f"{ovh:.1f} %" if ovh is not None else "n/a")
        t.add_row("time inside hooks", f"{_pct(lay.get('hook_time_pct'))} %")
        tables.append(t)
    return tables






def report_section(result: LayersResult, run: Any = None,
                   series: dict[str, list[dict[str, Any]]] | None = None, log_limit: int = 500) -> Any:
    """The report's ``Layers`` section: what ``perfsdk layers RUN`` prints, in HTML."""
    parts: list[str] = []
    if result.status != "ok":
        parts.append(f"<p>layers: unavailable: {html.escape(result.reason or '')}</p>")
        return ReportSection(title="Layers", html="\n".join(parts))
    parts.append(f"<p>{result.steps_instrumented} instrumented step(s) ({html.escape(result.steps_selection)}), "
                 f"{_ms(result.step_time_s)} ms; coverage {_pct(result.coverage_pct)} % of the step time.</p>")
    parts.append(html_table(layer_table_data(result), "Layers: time per phase and share of the step"))
    if result.per_function_status == "ok":
        parts.append(html_table(function_totals_data(result), "Functions: measured time per kind"))
        parts.append(html_table(function_ops_data(result), "Functions: per operation"))
    elif result.per_function_status == "unavailable":
        parts.append(f"<p>per-function accounting unavailable: {html.escape(result.per_function_reason or '')}</p>")
    events = (series or {}).get(result.events_series or "")
    if events:
        more = f" (first {log_limit} of {len(events)})" if len(events) > log_limit else ""
        parts.append(html_table(event_log_data(events, log_limit), f"Event log{more}"))
    elif result.events_series:
        parts.append(f"<p>Event log: {result.events} module calls in the series "
                     f"<code>{html.escape(result.events_series)}</code> (<code>perfsdk layers RUN --log</code>).</p>")
    return ReportSection(title="Layers", html="\n".join(parts))

"""``perfsdk layers RUN``: the per-layer tables of a stored run (collector ``layers``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from perfsdk.plugins import hookimpl
from perfsdk.collectors.layers.tables import (
    event_log_data,
    function_ops_data,
    function_totals_data,
    layer_table_data,
    rich_table,
)
from perfsdk.terminal import make_console, wide_option

#: Rows a table shows in the terminal without --all or --limit.
SUMMARY_ROWS = 30


def _fail(message: str) -> None:
    click.echo(f"perfsdk: error: {message}", err=True)
    sys.exit(2)


def resolve_run(store: Any, ref: str) -> Any:
    """The stored run ``ref`` names: whatever the store resolves (an id, a unique prefix,
    ``latest``) when it can, else a full run id."""
    return store.get(store.resolve_run_id(ref))


@click.command("layers", help=(
    'Per-layer tables of a stored run (collector "layers"): type, settings, input shapes, calls, '
    "time per phase and share of the step; --functions per-function times; --log the event log. "
    f"In a terminal a table longer than {SUMMARY_ROWS} rows shows its first ones (--all: every row) and "
    "leaves out the columns that do not fit (--wide: keeps them)."))
@click.argument("run_ref", metavar="RUN")
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--functions", "show_functions", is_flag=True,
              help="The per-function tables (matmul, attention, softmax, activation, normalization): counts and time.")
@click.option("--log", "show_log", is_flag=True, help="The time-ordered log of module calls (needs log_events).")
@click.option("--sort", type=click.Choice(["model", "time"]), default="model", show_default=True,
              help="Layer table order: the model's (indented by depth) or slowest first.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many rows per table.")
@click.option("--all", "show_all", is_flag=True,
              help=f"Every row (the terminal shows the first {SUMMARY_ROWS} of a longer table).")
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON instead of tables.")
def layers_command(run_ref: str, store_dir: str, show_functions: bool, show_log: bool, sort: str,
                   limit: int | None, show_all: bool, as_json: bool) -> None:
    from perfsdk.store import Store, StoreError

    if not Path(store_dir).is_dir():
        _fail(f"--store {store_dir}: no such result store")
    store = Store(store_dir)
    try:
        run = resolve_run(store, run_ref)
    except (StoreError, ValueError, KeyError) as err:
        _fail(str(err).strip("'\""))
        return
    from perfsdk.collectors.layers import LayersCollector

    result = LayersCollector.result_of(run)
    if result is None:
        _fail(f"run {run.run_id} has no layers result (enable it: collectors: {{layers: {{}}}})")
        return
    if result.status != "ok":
        _fail(f"run {run.run_id}: layers unavailable: {result.reason}")
        return
    tables: list[tuple[str, Any]] = []
    if show_functions:
        if result.per_function_status != "ok":
            why = (result.per_function_reason if result.per_function_status == "unavailable"
                   else "per-function accounting was off (set collectors.layers.per_function: true)")
            _fail(f"run {run.run_id}: no per-function tables: {why}")
            return
        tables.append(("Functions: measured time per kind", function_totals_data(result)))
        tables.append(("Functions: per operation", function_ops_data(result)))
    if show_log:
        if not result.events_series:
            _fail(f"run {run.run_id}: no event log (set collectors.layers.log_events: true)")
            return
        try:
            events = store.read_series(run.run_id, result.events_series)
        except StoreError as err:
            _fail(str(err))
            return
        tables.append((f"Event log: {len(events)} module calls, time-ordered", event_log_data(events)))
    if not (show_functions or show_log):
        tables.append((f"Layers of run {run.run_id} ({result.steps_instrumented} instrumented step(s), "
                       f"{result.steps_selection})", layer_table_data(result, sort)))
    trimmed = [(title, (h, rows[:limit] if limit else rows, num)) for title, (h, rows, num) in tables]
    if as_json:
        doc = {title: [dict(zip(h, row)) for row in rows] for title, (h, rows, _) in trimmed}
        click.echo(json.dumps(doc, indent=2))
        return
    con = make_console()
    for title, (h, rows, num) in trimmed:
        note = None
        if not (show_all or limit) and len(rows) > SUMMARY_ROWS:
            slowest = " (--sort time: the slowest first)" if title.startswith("Layers") and sort != "time" else ""
            note = f"first {SUMMARY_ROWS} of {len(rows)} rows; --all shows every row{slowest}"
            rows = rows[:SUMMARY_ROWS]
        con.print(rich_table((h, rows, num), title, note))


@hookimpl
def perfsdk_register_commands(cli: click.Group) -> None:
    cli.add_command(layers_command)

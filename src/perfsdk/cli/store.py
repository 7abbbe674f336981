"""Commands over a result store: ``perfsdk runs``, ``perfsdk store check`` and ``store repair``.

``runs`` lists the stored runs (id, name, status, validity, model, start, headline metrics), filtered by
name, status, tag and start time. The headline metrics are the collectors' key export columns
(the ``collectors.*`` columns that lead a CSV export).

The run folders are the source of truth; the SQLite index can always be rebuilt from them.
``check`` lists the differences (exit 1 when there are any), ``repair`` fixes them: indexes
runs missing from the index, drops index rows whose folder is gone, moves damaged runs aside
(``runs/.damaged-<id>``) and removes folders left half-written by a killed process.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click

from perfsdk.plugins import hookimpl
from perfsdk.fmt import metric_column
from perfsdk.terminal import fail, make_console, optional_columns, wide_option

_LABELS = {
    "unindexed": "runs on disk missing from the index",
    "missing": "index rows without a run folder",
    "unreadable": "damaged run folders (result.json unreadable)",
    "temporary": "half-written temporary folders",
}


def _open(store_dir: str) -> Any:
    from perfsdk.store import Store

    if not Path(store_dir).is_dir():
        fail(f"--store {store_dir}: no such result store")
    return Store(store_dir)


def _print(report: dict[str, list[str]], total: int, verb: str) -> None:
    problems = sum(len(v) for v in report.values())
    click.echo(f"{total} run(s); {problems} problem(s){' ' + verb if problems and verb else ''}")
    for key, ids in report.items():
        if ids:
            click.echo(f"  {_LABELS.get(key, key)}: {len(ids)}")
            for rid in ids[:20]:
                click.echo(f"    {rid}")
            if len(ids) > 20:
                click.echo(f"    ... and {len(ids) - 20} more")


@click.group("store")
def store_group() -> None:
    """Check and repair a result store (run folders vs. the SQLite index)."""


@store_group.command("check")
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check_cmd(store_dir: str, as_json: bool) -> None:
    """Report index/folder mismatches, damaged and half-written runs. Exit 1 if any."""
    store = _open(store_dir)
    report = store.check()
    if as_json:
        click.echo(json.dumps({"runs": len(store.run_ids()), **report}, indent=2))
    else:
        _print(report, len(store.run_ids()), "")
    raise SystemExit(1 if any(report.values()) else 0)


@store_group.command("repair")
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--json", "as_json", is_flag=True, help="Print what was repaired as JSON.")
def repair_cmd(store_dir: str, as_json: bool) -> None:
    """Fix what 'store check' reports; damaged runs are moved aside, never deleted."""
    store = _open(store_dir)
    report = store.repair()
    after = store.check()
    if as_json:
        moved = {rid: str(store.runs_dir / f".damaged-{rid}") for rid in report.get("unreadable", [])}
        click.echo(json.dumps({"repaired": report, "moved": moved, "remaining": after, "runs": len(store.run_ids())},
                              indent=2))
    else:
        _print(report, len(store.run_ids()), "repaired")
        for rid in report.get("unreadable", []):
            click.echo(f"moved damaged run {rid} to {store.runs_dir / f'.damaged-{rid}'}")
        if any(after.values()):
            click.echo("still inconsistent after repair:")
            _print(after, len(store.run_ids()), "")
    raise SystemExit(1 if any(after.values()) else 0)


# -- perfsdk runs -------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: Headline metrics shown in the table unless --metric says otherwise (--json has them all).
TABLE_METRICS = 3
#: Runs the table lists without --all (the latest ones).
SUMMARY_RUNS = 20


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: a duration back from now (``30m``, ``2h``, ``7d``, ``1w``) or a date / ISO
    date-time (``2026-11-03``, ``2026-11-03T10:15``; UTC unless it names a zone)."""
    now = now or datetime.now(timezone.utc)
    t = text.strip()
    m = _DURATION.match(t)
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a duration (30m, 2h, 7d, 1w) or a date "
                                 "(2026-11-03, 2026-11-03T10:15)", param_hint="--since") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def parse_tags(items: tuple[str, ...]) -> dict[str, str]:
    """``--tag k=v`` options as a dict."""
    tags: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--tag")
        tags[key] = value
    return tags


def headline_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The collectors' key columns among ``rows`` (flattened runs), in export order."""
    from perfsdk.exporters import flatten

    keys = set(getattr(flatten, "KEY_COLUMNS", ()))
    return [c for c in flatten.ordered_columns(rows) if c in keys and c.startswith("collectors.")]


def _started(run: Any) -> str:
    return run.started_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def list_stored_runs(store: Any, *, name: str | None = None, status: str | None = None,
                     tags: dict[str, str] | None = None, since: datetime | None = None) -> list[dict[str, Any]]:
    """One entry per stored run (oldest first): id, name, status, model, start, tags, and
    ``metrics`` (the headline columns). Damaged runs appear with status ``damaged`` when no
    filter other than ``status="damaged"`` is given."""
    from perfsdk.exporters.flatten import run_row
    from perfsdk.store import StoreError

    entries: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    plain = name is None and not tags and since is None
    for rid in store.run_ids():
        try:
            run = store.get(rid)
        except StoreError as exc:
            if plain and status in (None, "damaged"):
                entries.append({"run_id": rid, "name": None, "status": "damaged", "validity": None, "model": None,
                                "started_at": None, "finished_at": None, "tags": {}, "metrics": {},
                                "error": str(exc)})
                rows.append({})
            continue
        if (name is not None and run.name != name) or (status is not None and run.status != status):
            continue
        if tags and any(run.tags.get(k) != v for k, v in tags.items()):
            continue
        if since is not None and run.started_at < since:
            continue
        row = run_row(run)
        rows.append(row)
        entries.append({"run_id": run.run_id, "name": run.name, "status": run.status,
                        "validity": run.validity.verdict if run.validity is not None else None,
                        "model": run.model.model_id if run.model else None,
                        "started_at": run.started_at.isoformat(),
                        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
                        "tags": dict(run.tags), "metrics": {}, "_started": _started(run)})
    heads = headline_columns(rows)
    for entry, row in zip(entries, rows):
        entry["metrics"] = {c: row.get(c) for c in heads if c in row}
    entries.sort(key=lambda e: (e["started_at"] or "", e["run_id"]))
    return entries


@click.command("runs")
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--name", default=None, help="Only runs with this name.")
@click.option("--status", type=click.Choice(["ok", "partial", "failed", "damaged"]), default=None,
              help="Only runs with this status.")
@click.option("--tag", "tag_items", multiple=True, metavar="KEY=VALUE", help="Only runs with this tag (repeatable).")
@click.option("--since", default=None, metavar="WHEN",
              help="Only runs started since WHEN: a duration back from now (30m, 2h, 7d, 1w) or a date "
                   "(2026-11-03, 2026-11-03T10:15, UTC).")
@click.option("--metric", "metrics", multiple=True, metavar="COLUMN",
              help="Metric column to show (repeatable): a result field, whole (collectors.latency.ttft_s.p50), "
                   "by its collector's name (latency.ttft_s.p50) or by an unambiguous suffix (ttft_s.p50). "
                   f"Default: the first {TABLE_METRICS} headline metrics.")
@click.option("--all", "show_all", is_flag=True, help=f"Every run (the table shows the latest {SUMMARY_RUNS} of more).")
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON: every run with all its headline metrics.")
def runs_cmd(store_dir: str, name: str | None, status: str | None, tag_items: tuple[str, ...], since: str | None,
             metrics: tuple[str, ...], show_all: bool, as_json: bool) -> None:
    """List the stored runs: id, name, status, validity verdict, model, start time and headline metrics.

    The ids work in 'perfsdk compare' and 'perfsdk report', whole, as a unique prefix, or as
    'latest' for the most recent run.
    """
    from rich.table import Table

    store = _open(store_dir)
    tags = parse_tags(tag_items)
    when = parse_since(since) if since is not None else None
    entries = list_stored_runs(store, name=name, status=status, tags=tags, since=when)
    if metrics:
        from perfsdk.exporters.flatten import run_row
        from perfsdk.metric_names import MetricNameError, resolve_metric

        rows = {e["run_id"]: run_row(store.get(e["run_id"])) for e in entries if e["status"] != "damaged"}
        columns = list(dict.fromkeys(c for row in rows.values() for c in row))
        if rows:  # with no runs there is nothing to resolve against (and nothing to show)
            try:
                metrics = tuple(dict.fromkeys(resolve_metric(m, columns) for m in metrics))
            except MetricNameError as err:
                fail(f"--metric: {err}")
        for e in entries:
            if e["run_id"] in rows:
                e["metrics"] = {m: rows[e["run_id"]].get(m) for m in metrics}
    if as_json:
        click.echo(json.dumps([{k: v for k, v in e.items() if not k.startswith("_")} for e in entries], indent=2))
        return
    if not entries:
        click.echo(f"no runs in {store_dir}" + (" match" if name or status or tags or when else ""))
        return
    shown = list(metrics) or list(dict.fromkeys(c for e in entries for c in e["metrics"]))[:TABLE_METRICS]
    total = len(entries)
    if not show_all and total > SUMMARY_RUNS:
        entries = entries[-SUMMARY_RUNS:]
    t = Table(title=f"{total} run(s) in {store_dir}", box=None, title_justify="left",  # easy to grep and cut
              caption_justify="left")
    t.add_column("run", no_wrap=True)
    for col in ("name", "status", "validity", "model", "started (UTC)"):
        t.add_column(col, no_wrap=col in ("status", "validity"))
    # the unit in the header, bare numbers in the cells (ttft p50 ms: 10.33)
    metric_cols = [metric_column(m, [e["metrics"].get(m) for e in entries]) for m in shown]
    for header, _ in metric_cols:
        t.add_column(header, justify="right")
    style = {"ok": "green", "partial": "yellow", "failed": "red", "damaged": "red", "valid": "green",
             "noisy": "yellow", "invalid": "red"}
    for i, e in enumerate(entries):
        st, verdict = e["status"], e["validity"]
        t.add_row(e["run_id"], e["name"] or "-", f"[{style[st]}]{st}[/]",
                  f"[{style[verdict]}]{verdict}[/]" if verdict else "-", e["model"] or "-", e.get("_started") or "-",
                  *(cells[i] for _, cells in metric_cols))
    if len(entries) < total:
        t.caption = f"the latest {len(entries)} of {total} runs; --all lists every one"
    optional_columns(t, "started (UTC)", "name", "model")
    make_console().print(t)


@hookimpl
def perfsdk_register_commands(cli: click.Group) -> None:
    cli.add_command(store_group)
    cli.add_command(runs_cmd)

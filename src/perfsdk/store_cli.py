"""``perfsdk store check`` and ``perfsdk store repair``: keep a result store consistent.

The run folders are the source of truth; the SQLite index can always be rebuilt from them.
``check`` lists the differences (exit 1 when there are any), ``repair`` fixes them: indexes
runs missing from the index, drops index rows whose folder is gone, moves damaged runs aside
(``runs/.damaged-<id>``) and removes folders left half-written by a killed process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from perfsdk.plugins import hookimpl

_LABELS = {
    "unindexed": "runs on disk missing from the index",
    "missing": "index rows without a run folder",
    "unreadable": "damaged run folders (result.json unreadable)",
    "temporary": "half-written temporary folders",
}


def _open(store_dir: str) -> Any:
    from perfsdk.store import Store

    if not Path(store_dir).is_dir():
        click.echo(f"perfsdk: error: --store {store_dir}: no such result store", err=True)
        raise SystemExit(2)
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
    """Fix what ``check`` reports; damaged runs are moved aside, never deleted."""
    store = _open(store_dir)
    report = store.repair()
    after = store.check()
    if as_json:
        click.echo(json.dumps({"repaired": report, "remaining": after, "runs": len(store.run_ids())}, indent=2))
    else:
        _print(report, len(store.run_ids()), "repaired")
        if any(after.values()):
            click.echo("still inconsistent after repair:")
            _print(after, len(store.run_ids()), "")
    raise SystemExit(1 if any(after.values()) else 0)


@hookimpl
def perfsdk_register_commands(cli: click.Group) -> None:
    cli.add_command(store_group)

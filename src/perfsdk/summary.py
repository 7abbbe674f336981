"""The terminal summary of a run (rich tables), used by ``perfsdk run``.

Every collector in the run contributes through the collector contract: its ``summary_tables``
first, then its ``summary_rows`` in the "Summary" table. A collector that is not installed here
(or whose stored result no longer validates) is shown with the generic rendering of its scalar
fields, so nothing a run measured is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from perfsdk.collector import Collector, scalar_items
from perfsdk.fmt import fmt_bytes, fmt_num, fmt_s, fmt_value
from perfsdk.plugins import PluginRegistry, installed_registry, ordered_collectors
from perfsdk.schemas import RunResult

__all__ = ["CollectorBlock", "collector_blocks", "fmt_bytes", "fmt_num", "fmt_s", "headline_rows", "print_summary"]


@dataclass
class CollectorBlock:
    """What one collector shows in the summary."""

    name: str
    title: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    tables: list[Any] = field(default_factory=list)
    note: str | None = None


def _scope_note(run: RunResult, name: str) -> str | None:
    meta = run.collector_meta.get(name)
    if meta is None:
        return None
    if meta.scope == "rank0-only":
        return f"rank 0 only: no merge across {meta.ranks or 'all'} ranks (each rank's result is under ranks)"
    if meta.installed is False:
        return "collector not installed here: stored values shown as they are"
    if meta.validated is False:
        return f"stored result does not validate against the installed collector: {meta.validation_error}"
    return None


def collector_blocks(run: RunResult, registry: PluginRegistry | None = None) -> list[CollectorBlock]:
    """One block per collector of the run, in presentation order, through the contract."""
    reg = registry or installed_registry()
    blocks = []
    for name in ordered_collectors(run.collectors, reg):
        cls: type[Collector] | None = reg.collectors.get(name)
        result = run.collector_result(name, cls) if cls is not None else None
        block = CollectorBlock(name=name, title=(cls.title if cls is not None and cls.title else name),
                               note=_scope_note(run, name))
        if cls is not None and result is not None:
            block.rows = list(cls.summary_rows(result))
            block.tables = list(cls.summary_tables(result))
        else:
            block.rows = [(k, fmt_value(v, k)) for k, v in scalar_items(run.collectors[name], limit=12)]
        blocks.append(block)
    return blocks


def headline_rows(run: RunResult, registry: PluginRegistry | None = None) -> list[tuple[str, str]]:
    """Every collector's summary rows as (label, value), each block headed by its title."""
    rows: list[tuple[str, str]] = []
    for b in collector_blocks(run, registry):
        if not b.rows and not b.note:
            continue
        rows.append((f"[{b.title}]", ""))
        if b.note:
            rows.append(("  note", b.note))
        rows += [(f"  {label}", value) for label, value in b.rows]
    return rows


def print_summary(run: RunResult, console: Console | None = None, run_dir: str | None = None,
                  registry: PluginRegistry | None = None) -> None:
    """Print the run's summary: each collector's tables, then one table of their rows."""
    console = console or Console()
    status_style = {"ok": "green", "partial": "yellow", "failed": "red"}[run.status]
    model = run.model.model_id if run.model else "-"
    console.print(f"[bold]{run.name}[/] run [cyan]{run.run_id}[/] status [{status_style}]{run.status}[/]  model {model}")
    wl = run.workload
    if wl is not None and wl.prompts_filtered:
        limit = f" ({wl.max_input_tokens} tokens)" if wl.max_input_tokens else ""
        console.print(f"[yellow]note[/] {wl.prompts_filtered} of {wl.prompts_filtered + (wl.num_prompts or 0)} prompts "
                      f"left out: longer than workload.max_input_tokens{limit}")
    from perfsdk.validity import summary_lines

    for line in summary_lines(run.validity):
        console.print(line)
    blocks = collector_blocks(run, registry)
    for b in blocks:
        for table in b.tables:
            console.print(table)
    t = Table(title="Summary", show_header=False, show_edge=False)
    t.add_column("metric", overflow="fold")
    t.add_column("value", justify="right", overflow="fold")
    for b in blocks:
        if not b.rows and not b.note:
            continue
        t.add_row(f"[bold]{b.title}[/]", "")
        if b.note:
            t.add_row("  note", b.note)
        for label, value in b.rows:
            t.add_row(f"  {label}", value)
    console.print(t)
    for err in run.errors:
        console.print(f"[red]error[/] {err.source}{'/' + err.hook if err.hook else ''}: {err.type}: {err.message}")
    if run_dir:
        console.print(f"stored in {run_dir}")

"""What the CLI writes to a terminal or a pipe: error lines and tables that never cut a value.

- :func:`error_line` / :func:`fail` / :func:`warn`: one prefix for every command
  (``perfsdk: error: ...``, ``perfsdk: warning: ...``); :class:`PerfsdkGroup` gives click's own
  usage errors the same prefix.
- :func:`make_console`: a rich console whose ``print`` passes every table through
  :func:`fit_table`: cells wrap, or fold when a single word is too long, instead of ending in
  "…"; a column marked ``no_wrap=True`` (run ids) is kept whole; and a table whose narrowest
  layout is still wider than the console is printed vertically, one ``column  value`` block per
  row. Piped output has no terminal width: rich then uses ``COLUMNS``, else 80.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

ERROR_PREFIX = "perfsdk: error: "
WARNING_PREFIX = "perfsdk: warning: "

#: Exit code for invalid config or usage.
EXIT_USAGE = 2


def error_line(message: str) -> str:
    """``message`` with the one error prefix every command uses."""
    return f"{ERROR_PREFIX}{message}"


def echo_error(message: str) -> None:
    """Print an error line on standard error."""
    click.echo(error_line(message), err=True)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print an error line and exit (2, invalid config or usage, unless told otherwise)."""
    echo_error(message)
    sys.exit(code)


def warn(message: str) -> None:
    """Print a warning line on standard error."""
    click.echo(f"{WARNING_PREFIX}{message}", err=True)


class PerfsdkGroup(click.Group):
    """A click group whose usage errors ("No such option", bad values) use the perfsdk prefix."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.ClickException as exc:
            _show_click_error(exc)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            echo_error("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _show_click_error(exc: click.exceptions.ClickException) -> None:
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.exceptions.UsageError) and ctx is not None:
        click.echo(ctx.get_usage(), err=True)
        hint = ctx.help_option_names[0] if ctx.help_option_names else "--help"
        click.echo(f"Try '{ctx.command_path} {hint}' for help.", err=True)
    echo_error(exc.format_message())


# -- tables -----------------------------------------------------------------------------------

_WIDE = 100_000
#: A word longer than this may be folded over lines rather than widen its column.
FOLD_AT = 16


def _plain(console: Console, cell: Any) -> Text | None:
    if isinstance(cell, str):
        return console.render_str(cell)
    if isinstance(cell, Text):
        return cell
    return None


def _cell_width(console: Console, cell: Any) -> int:
    text = _plain(console, cell)
    if text is not None:
        return max((text.cell_len for text in text.split("\n")), default=0)
    return Measurement.get(console, console.options.update_width(_WIDE), cell).maximum


def _word_width(console: Console, cell: Any) -> int:
    text = _plain(console, cell)
    if text is not None:
        return max((len(w) for w in text.plain.split()), default=0)
    return Measurement.get(console, console.options.update_width(_WIDE), cell).minimum


def _bounds(console: Console, col: Any) -> tuple[int, int]:
    """(narrowest, natural) width of a column's content: keep-whole columns at their longest
    value, others at their longest word (up to :data:`FOLD_AT`); natural = the longest line."""
    cells = list(col.cells) + [col.header or ""]
    natural = max(_cell_width(console, c) for c in cells)
    if col.width is not None:
        return col.width, col.width
    if col.no_wrap:
        lo = max(col.min_width or 0, natural)
    else:
        lo = max(min(max(_word_width(console, c) for c in cells), FOLD_AT), col.min_width or 1)
    return lo, max(lo, natural)


def _extra(table: Table) -> tuple[list[int], int]:
    """Padding per column and the width of the rules between and around them."""
    _, right, _, left = table.padding
    n = len(table.columns)
    pads = []
    for i in range(n):
        pad = left + right
        if not table.pad_edge:
            pad -= (left if i == 0 else 0) + (right if i == n - 1 else 0)
        pads.append(pad)
    rules = (n - 1 + (2 if table.show_edge else 0)) if table.box is not None else 0
    return pads, rules


def _narrowest(console: Console, table: Table) -> int:
    """The narrowest width at which ``table`` shows every value (words whole up to
    :data:`FOLD_AT` characters, keep-whole columns whole), padding and rules included."""
    pads, rules = _extra(table)
    return sum(_bounds(console, c)[0] for c in table.columns) + sum(pads) + rules


def _set_widths(console: Console, table: Table, width: int) -> None:
    """Fixed column widths that fit ``width``: every column gets its narrowest width; the space
    left makes whole the columns that need least, so that as few columns as possible wrap, and
    what remains is shared by the others in proportion to their need."""
    pads, rules = _extra(table)
    bounds = [_bounds(console, c) for c in table.columns]
    left = width - rules - sum(pads) - sum(lo for lo, _ in bounds)
    wants = [hi - lo for lo, hi in bounds]
    given = [0] * len(wants)
    order = sorted(range(len(wants)), key=lambda i: wants[i])
    for k, i in enumerate(order):
        if wants[i] <= left:
            given[i], left = wants[i], left - wants[i]
            continue
        rest = order[k:]
        need = sum(wants[j] for j in rest)
        for j in rest:
            given[j] = left * wants[j] // need
        given[rest[-1]] += left - sum(given[j] for j in rest)
        break
    for col, (lo, _), g in zip(table.columns, bounds, given):
        col.width = lo + g


def _vertical(table: Table) -> Table:
    """The rows of ``table`` as blocks of ``column  value`` lines."""
    out = Table(title=table.title, caption=table.caption, show_header=False, show_edge=False, box=None,
                padding=(0, 1), title_justify=table.title_justify)
    out.add_column("column", style="bold", no_wrap=True)
    out.add_column("value", overflow="fold")
    columns = list(table.columns)
    cells = [list(c.cells) for c in columns]
    for i in range(table.row_count):
        if i:
            out.add_row("", "")
        for j, (col, col_cells) in enumerate(zip(columns, cells)):
            header = col.header if col.header not in (None, "") else f"#{j + 1}"
            out.add_row(header, col_cells[i] if i < len(col_cells) else "")
    return out


def fit_table(table: Table, console: Console, width: int | None = None) -> Table:
    """``table`` made to show every value in full at ``width`` (default: the console's).

    A table that fits is left as it is. Otherwise each column gets a fixed width: at least its
    longest word (up to :data:`FOLD_AT`; longer ones fold, never "…"), ``no_wrap`` columns their
    longest value, the rest of the width shared by need. If even that does not fit, the table's
    vertical form is returned.
    """
    width = width or console.width
    for col in table.columns:
        col.overflow = "fold"
    if not table.row_count:
        return table
    if Measurement.get(console, console.options.update_width(_WIDE), table).maximum <= width:
        return table  # fits on one line per row as it is
    if _narrowest(console, table) > width:
        return _vertical(table)
    _set_widths(console, table, width)
    return table


class TableConsole(Console):
    """A rich console that prints tables through :func:`fit_table`."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().print(*[fit_table(o, self) if isinstance(o, Table) else o for o in objects], **kwargs)


def make_console(stderr: bool = False, width: int | None = None) -> Console:
    """The console CLI commands print through (tables never truncated)."""
    return TableConsole(stderr=stderr, width=width)

"""What the CLI writes to a terminal or a pipe: error lines and tables that never cut a value.

- :func:`error_line` / :func:`fail` / :func:`warn`: one prefix for every command
  (``perfsdk: error: ...``, ``perfsdk: warning: ...``); :class:`PerfsdkGroup` gives click's own
  usage errors the same prefix.
- :func:`make_console`: a rich console whose ``print`` passes every table through
  :func:`fit_table`: cells wrap between words, never inside one that fits on a line, and never
  end in "…"; a column marked ``no_wrap=True`` (run ids) is kept whole; columns marked with
  :func:`optional_columns` are left out, with a note, when the table cannot fit otherwise
  (:data:`wide_option`, ``--wide``, keeps them); and a table whose narrowest layout is still
  wider than the console is printed vertically, one ``column  value`` block per row. Piped
  output has no terminal width: rich then uses ``COLUMNS``, else 80. A number in a table is
  bare: its unit is in the column header (``p50 ms``), so the two are never split apart.
"""

from __future__ import annotations

import re
import sys
from typing import Any, NoReturn
from weakref import WeakKeyDictionary

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
_WIDE_KEY = "perfsdk.wide"
#: Columns a table may leave out when it does not fit, in the order they go.
_OPTIONAL: WeakKeyDictionary[Table, list[str]] = WeakKeyDictionary()


def optional_columns(table: Table, *headers: str) -> Table:
    """Mark the columns headed ``headers`` as ones ``table`` may leave out, first ones first,
    when it does not fit the terminal with every word whole; a note under the table names them
    and ``--wide`` keeps them."""
    _OPTIONAL[table] = [h for h in headers if any(c.header == h for c in table.columns)]
    return table


def _keep_wide(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_WIDE_KEY] = True
    return value


#: ``--wide``: tables keep every column, as wide as they need (a terminal may then wrap lines).
wide_option = click.option("--wide", is_flag=True, expose_value=False, callback=_keep_wide,
                           help="Keep every table column, even wider than the terminal.")


def wide_requested() -> bool:
    """Whether the running command was given ``--wide``."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_WIDE_KEY))


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


_NUMBER = re.compile(r"\(?[-+~<>≈]?\d[\d.,]*(?:[eE][-+]?\d+)?[%x×]?")
_UNIT = re.compile(r"(?:[A-Za-zµ°%/²³]{1,6}|[A-Za-zµ]{1,3}/[A-Za-z]{1,3})[,;)]?")


def words(text: str) -> list[str]:
    """The words of ``text`` that a table does not break: a number and the unit after it
    (``515.35 ms``, ``446.8 MiB,``) count as one word, so a value never loses its unit."""
    parts = text.split()
    out: list[str] = []
    i = 0
    while i < len(parts):
        if i + 1 < len(parts) and _NUMBER.fullmatch(parts[i]) and _UNIT.fullmatch(parts[i + 1]):
            out.append(f"{parts[i]} {parts[i + 1]}")
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out


def _wrap(text: str, width: int) -> str:
    """``text`` wrapped at ``width`` between :func:`words` (a number keeps its unit); a line's
    leading spaces (indentation) are kept."""
    lines: list[str] = []
    for line in text.split("\n"):
        indent = line[: len(line) - len(line.lstrip(" "))]
        current = indent
        for w in words(line):
            if current.strip() and len(current) + 1 + len(w) > width:
                lines.append(current)
                current = indent
            current = f"{current} {w}" if current.strip() else current + w
        lines.append(current)
    return "\n".join(lines)


def echo_wrapped(text: str, err: bool = False, indent: str = "  ") -> None:
    """Print ``text`` wrapped between whole words at the terminal's width (COLUMNS when set,
    80 when piped); a number keeps its unit; lines after the first are indented by ``indent``."""
    import textwrap

    width = make_console(stderr=err).width
    lead = text[: len(text) - len(text.lstrip(" "))]
    glued = [w.replace(" ", "\u00a0") for w in words(text)]
    out = textwrap.fill(" ".join(glued), width=width, initial_indent=lead, subsequent_indent=lead + indent,
                        break_long_words=False, break_on_hyphens=False)
    click.echo(out.replace("\u00a0", " "), err=err)


def _word_width(console: Console, cell: Any) -> int:
    text = _plain(console, cell)
    if text is not None:
        return max((len(w) for w in words(text.plain)), default=0)
    return Measurement.get(console, console.options.update_width(_WIDE), cell).minimum


def _bounds(console: Console, col: Any) -> tuple[int, int]:
    """(narrowest, natural) width of a column's content: keep-whole columns at their longest
    value, others at their longest word; natural = the longest line."""
    cells = list(col.cells) + [col.header or ""]
    natural = max(_cell_width(console, c) for c in cells)
    if col.width is not None:
        return col.width, col.width
    if col.no_wrap:
        lo = max(col.min_width or 0, natural)
    else:
        lo = max(max(_word_width(console, c) for c in cells), col.min_width or 1)
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
    """The narrowest width at which ``table`` shows every value with every word whole,
    padding and rules included."""
    pads, rules = _extra(table)
    return sum(_bounds(console, c)[0] for c in table.columns) + sum(pads) + rules


def _natural(console: Console, table: Table) -> int:
    return Measurement.get(console, console.options.update_width(_WIDE), table).maximum


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
        if not col.no_wrap:
            # plain text is wrapped here, where a number keeps its unit; rich would split them
            col._cells = [_wrap(c, col.width) if isinstance(c, str) and "[" not in c and len(c) > col.width else c
                          for c in col._cells]


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


def _without(table: Table, gone: set[str]) -> Table:
    out = Table(title=table.title, show_header=table.show_header, show_edge=table.show_edge, box=table.box,
                padding=table.padding, pad_edge=table.pad_edge, title_justify=table.title_justify,
                caption_justify="left")
    out.columns = [c for c in table.columns if c.header not in gone]
    out.rows = table.rows
    return out


def _leave_out(table: Table, console: Console, width: int) -> Table | None:
    """``table`` without as few of its optional columns as it takes to fit ``width`` with every
    word whole, a note under it naming them; None when leaving all of them out is not enough.
    Columns go in the order they were marked; once the table fits, the later ones (the more
    useful) come back where there is room."""
    optional = _OPTIONAL.get(table, [])
    for k in range(1, len(optional) + 1):
        gone = optional[:k]
        if _narrowest(console, _without(table, set(gone))) > width:
            continue
        for h in reversed(gone[:-1]):
            if _narrowest(console, _without(table, set(gone) - {h})) <= width:
                gone.remove(h)
        out = _without(table, set(gone))
        note = f"left out to fit {width} columns: {', '.join(gone)} (--wide shows {'it' if len(gone) == 1 else 'them'})"
        out.caption = f"{table.caption}\n{note}" if table.caption else note
        _set_widths(console, out, width)
        return out
    return None


def fit_table(table: Table, console: Console, width: int | None = None, wide: bool = False) -> Table:
    """``table`` made to show every value in full at ``width`` (default: the console's).

    A table that fits is left as it is. Otherwise each column gets a fixed width: at least its
    longest word (a word is never broken while it fits on a line), ``no_wrap`` columns their
    longest value, the rest of the width shared by need. If that is still too wide, the columns
    marked with :func:`optional_columns` are left out, one by one, with a note under the table
    (unless ``wide``: then the table is returned whole, to be printed at its own width); if even
    that is not enough, the table's vertical form is returned.
    """
    width = width or console.width
    for col in table.columns:
        col.overflow = "fold"  # only a word longer than its whole line is folded
    if not table.row_count:
        return table
    if _natural(console, table) <= width:
        return table  # fits on one line per row as it is
    if _narrowest(console, table) > width:
        if wide:
            return table
        return _leave_out(table, console, width) or _vertical(table)
    _set_widths(console, table, width)
    return table


class TableConsole(Console):
    """A rich console that prints tables through :func:`fit_table`; ``wide``: tables keep every
    column and are printed at their own width."""

    def __init__(self, *args: Any, wide: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wide = wide

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        whole = [o for o in objects if isinstance(o, Table) and self.wide and _narrowest(self, o) > self.width]
        if not whole:
            super().print(*[fit_table(o, self) if isinstance(o, Table) else o for o in objects], **kwargs)
            return
        saved = self.width
        self.width = max([saved] + [_natural(self, o) for o in whole])
        try:
            super().print(*[o if o in whole else fit_table(o, self, saved) if isinstance(o, Table) else o
                            for o in objects], **kwargs)
        finally:
            self.width = saved


def make_console(stderr: bool = False, width: int | None = None, wide: bool | None = None) -> Console:
    """The console CLI commands print through (tables never truncated, words never broken);
    ``wide`` (default: whether the command was given ``--wide``) keeps every column."""
    return TableConsole(stderr=stderr, width=width, wide=wide_requested() if wide is None else wide)

"""Number, duration, size and percentage formatting: the one place every table takes its text from."""

from __future__ import annotations

import math
from typing import Any


def fmt_s(v: float | None) -> str:
    """Seconds with a readable unit: ``1.234 s``, ``12.35 ms``, ``80.0 µs``."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    a = abs(v)
    if a >= 1:
        return f"{v:.3f} s"
    if a >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    if a == 0:
        return "0 s"
    return f"{v * 1e6:.1f} µs"


def fmt_ms(v: float | None, digits: int = 3) -> str:
    """Seconds shown as a bare number of milliseconds (for columns headed "ms")."""
    return "-" if v is None else f"{v * 1e3:.{digits}f}"


def fmt_bytes(v: float | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 MiB``."""
    if v is None:
        return "-"
    x = float(v)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(v)  # pragma: no cover


def fmt_num(v: float | None, digits: int = 2) -> str:
    """Large counts with a decimal prefix (``3.20 G``); smaller ones with thousands separators."""
    if v is None:
        return "-"
    for div, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(v) >= div:
            return f"{v / div:.{digits}f} {unit}"
    return f"{v:,.{digits}f}"


def fmt_count(v: float | None) -> str:
    """An integer count with a decimal prefix from 1000 up (``1.234 k``, ``3.200 G``)."""
    if v is None:
        return "-"
    n = float(v)
    if not n.is_integer():
        return f"{n:.4g}"
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f} {unit}"
    return f"{n:.0f}"


def fmt_pct(v: float | None, digits: int = 1) -> str:
    """A percentage value (already in percent) without the sign: ``12.3``."""
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_us(v: float | None) -> str:
    """Seconds shown as a bare number of microseconds (for columns headed "µs")."""
    return "-" if v is None else f"{v * 1e6:.1f}"


def fmt_sig(v: float | None, digits: int = 4) -> str:
    """A float with ``digits`` significant digits, ``-`` for missing."""
    return "-" if v is None else f"{v:.{digits}g}"


def fmt_cell(v: Any) -> str:
    """A table cell: ``-`` for missing, floats with 4 significant digits, anything else as text."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def fmt_value(v: Any, key: str = "") -> str:
    """Any scalar, formatted by its type and (when given) the unit its field name ends with."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if key.endswith("_s"):
            return fmt_s(float(v))
        if key.endswith("_bytes"):
            return fmt_bytes(float(v))
        if key.endswith("_pct"):
            return f"{fmt_pct(float(v))} %"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    return str(v)


def duration_unit(values: list[float | None]) -> tuple[str, float]:
    """(unit, seconds per unit) for a column or table of durations: ms unless every value is
    under a millisecond (µs) or every one is at least 10 s (s)."""
    present = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    if present and max(present) < 1e-3:
        return "µs", 1e-6
    if present and min(present) >= 10:
        return "s", 1.0
    return "ms", 1e-3


def bytes_unit(values: list[float | None]) -> tuple[str, float]:
    """(binary unit, bytes per unit) that shows the smallest of ``values`` at 1 or more."""
    present = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    low = min(present) if present else 0
    for unit, size in (("TiB", 1024.0**4), ("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if low >= size:
            return unit, size
    return "B", 1.0


def fmt_bare(v: float | None, scale: float = 1.0) -> str:
    """``v / scale`` as a bare number for a column whose header carries the unit: about five
    significant digits, thousands separated (``25.13``, ``3,278.2``)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    x = v / scale
    digits = 0 if float(x).is_integer() and abs(x) >= 1000 else 2 if abs(x) < 1000 else 1 if abs(x) < 100_000 else 0
    return f"{x:,.{digits}f}"


_FIELD_UNITS = (("_per_s", "/s"), ("_bytes", "bytes"), ("_pct", "%"), ("_s", "s"), ("_j", "J"), ("_w", "W"))


def metric_column(column: str, values: list[Any]) -> tuple[str, list[str]]:
    """A header and cells for a column of a stored result field, the unit in the header and
    bare numbers in the cells: ``collectors.latency.ttft_s.p50`` -> ``ttft p50 ms``,
    ``collectors.memory.rss_peak_bytes`` -> ``rss peak MiB``, ``output_tokens_per_s`` ->
    ``output tokens/s``."""
    field = column.split(".", 2)[2] if column.startswith("collectors.") and column.count(".") >= 2 else column
    base, _, stat = field.partition(".")
    unit = next((u for suffix, u in _FIELD_UNITS if base.endswith(suffix)), None)
    nums = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values]
    if unit is None or all(n is None for n in nums) or any(n is None and v is not None for n, v in zip(nums, values)):
        return field.replace("_", " "), [fmt_cell(v) for v in values]
    name = base[: -len(next(s for s, u in _FIELD_UNITS if u == unit))].replace("_", " ")
    scale = 1.0
    if unit == "s":
        unit, scale = duration_unit(nums)
    elif unit == "bytes":
        unit, scale = bytes_unit(nums)
    header = f"{name}{unit}" if unit == "/s" else f"{name} {stat} {unit}" if stat else f"{name} {unit}"
    return header.replace("  ", " "), [fmt_bare(n, scale) for n in nums]

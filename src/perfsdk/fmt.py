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

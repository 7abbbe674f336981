"""Hints for mistyped names ("did you mean ...?"): config keys, collectors, exporters, hardware."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_matches(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``choices`` that look like ``name`` (case-insensitive), best first."""
    options = sorted({str(c) for c in choices})
    by_lower: dict[str, str] = {}
    for c in options:
        by_lower.setdefault(c.lower(), c)
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[f] for f in found]


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices``, or ``""`` when none is close."""
    found = close_matches(name, choices, n=2)
    if not found:
        return ""
    if len(found) == 1:
        return f" (did you mean {found[0]!r}?)"
    return f" (did you mean {found[0]!r} or {found[1]!r}?)"

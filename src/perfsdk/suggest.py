"""Hints for mistyped names ("did you mean ...?"): config keys, collectors, exporters, hardware."""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel


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


def _models(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a type annotation stands for (through Optional, unions, Annotated)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _models(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in get_args(tp) for m in _models(arg)]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return []


def _step(tp: Any, part: str | int) -> Any:
    origin = get_origin(tp)
    if origin is Annotated:
        return _step(get_args(tp)[0], part)
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            found = _step(arg, part)
            if found is not None:
                return found
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        for name, field in tp.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    args = get_args(tp)
    if origin in (list, tuple, set, frozenset) and isinstance(part, int) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def known_keys(model: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The keys allowed at ``path`` inside ``model`` (a pydantic error location without its
    last item); empty when the path leaves the models."""
    tp: Any = model
    for part in path:
        tp = _step(tp, part)
        if tp is None:
            return []
    keys: list[str] = []
    for m in _models(tp):
        for name, field in m.model_fields.items():
            keys.append(field.alias or name)
    return keys


def unknown_key_hint(model: type[BaseModel], loc: Sequence[str | int]) -> str:
    """``" (did you mean 'batch_size'?)"`` for an unknown key at error location ``loc``."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    return did_you_mean(loc[-1], known_keys(model, list(loc[:-1])))

"""Stored runs as a pandas DataFrame, flattened exactly like the CSV export."""

from __future__ import annotations

import os
from typing import Any

from perfsdk.exporters.flatten import ordered_columns, run_row
from perfsdk.schemas import RunResult
from perfsdk.store import Store


def as_store(store: Store | str | os.PathLike[str]) -> Store:
    """A :class:`~perfsdk.store.Store` from a store or a folder path."""
    return store if isinstance(store, Store) else Store(store)


def select_runs(store: Store | str | os.PathLike[str], *, name: str | None = None, status: str | None = None,
                tags: dict[str, str] | None = None, sweep_id: str | None = None,
                run_ids: list[str] | None = None, **tag_filters: Any) -> list[RunResult]:
    """Runs matching every filter. ``tag_<key>=value`` keyword arguments filter on tags, like
    ``tags={"<key>": value}``; ``sweep_id`` selects the points of one sweep."""
    wanted: dict[str, str] = {str(k): str(v) for k, v in (tags or {}).items()}
    for key, value in tag_filters.items():
        if not key.startswith("tag_"):
            raise TypeError(f"load_runs() got an unexpected filter {key!r} "
                            "(use name=, status=, sweep_id=, run_ids=, tags={...} or tag_<key>=)")
        wanted[key[4:]] = str(value)
    if sweep_id is not None:
        wanted["sweep_id"] = sweep_id
    st = as_store(store)
    return st.list_runs(run_ids, name=name, status=status, tags=wanted or None)


def runs_frame(runs: list[RunResult]) -> Any:
    """A DataFrame with one row per run and the CSV export's columns (key columns first)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("load_runs needs pandas: pip install 'perfsdk[report]'") from None

    rows = [run_row(r) for r in runs]
    cols = ordered_columns(rows)
    return pd.DataFrame(rows, columns=cols)


def load_runs(store: Store | str | os.PathLike[str] = "perfsdk-results", **filters: Any) -> Any:
    """Stored runs as a pandas DataFrame, one row per run, nested fields joined with dots.

    Filters: ``name``, ``status``, ``sweep_id``, ``run_ids``, ``tags={...}`` or ``tag_<key>=value``.
    A store folder that does not exist yields an empty frame.
    """
    return runs_frame(select_runs(store, **filters))

"""Bounded time series: long runs keep memory and run folders bounded.

Two tools, both keep evenly spaced rows and record that they did:

- :func:`downsample` caps a finished list of rows at ``max_rows`` (first and last row kept).
  ``Session.add_series`` goes through :func:`add_bounded`, so every series a collector attaches
  is capped, and the fact is written to the run as the artifact ``series_meta.json``
  (``{name: {rows_in, rows_kept, method, max_rows}}``) and logged as a warning.
- :class:`BoundedSeries` is for collectors that append while the run goes on (sampler probes):
  it never holds more than ``max_rows`` rows. When full, it drops every other row and from then
  on keeps one row in ``stride`` (doubling each time), so memory is constant however long the run.

The cap is ``PERFSDK_SERIES_MAX_ROWS`` (default :data:`DEFAULT_MAX_ROWS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import structlog

log = structlog.get_logger("perfsdk.series")

#: Rows kept per series unless ``PERFSDK_SERIES_MAX_ROWS`` says otherwise.
DEFAULT_MAX_ROWS = 100_000
#: Artifact that records which series were capped.
META_ARTIFACT = "series_meta.json"


def max_rows() -> int:
    """The per-series row cap from ``PERFSDK_SERIES_MAX_ROWS`` (at least 2)."""
    from perfsdk.envflags import integer

    return max(integer("PERFSDK_SERIES_MAX_ROWS", DEFAULT_MAX_ROWS), 2)


def downsample(rows: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` rows, evenly spaced over ``rows``, first and last included."""
    n = len(rows)
    if n <= limit:
        return list(rows)
    if limit < 2:
        raise ValueError("limit must be at least 2")
    return [rows[(i * (n - 1)) // (limit - 1)] for i in range(limit)]


class BoundedSeries:
    """An append-only series that never holds more than ``max_rows`` rows.

    Keeps every ``stride``-th appended row; when the buffer is full the stride doubles and every
    other kept row is dropped, so the kept rows stay evenly spaced (one in ``stride``).
    """

    def __init__(self, max_rows_: int | None = None) -> None:
        self.max_rows = max(int(max_rows_ if max_rows_ is not None else max_rows()), 2)
        self.rows: list[Any] = []
        self.stride = 1
        self.seen = 0

    def append(self, row: Any) -> None:
        """Offer one row; it is kept if it falls on the current stride."""
        if self.seen % self.stride == 0:
            if len(self.rows) >= self.max_rows:
                self.rows = self.rows[::2]
                self.stride *= 2
                if self.seen % self.stride == 0:
                    self.rows.append(row)
            else:
                self.rows.append(row)
        self.seen += 1

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def __getitem__(self, index: Any) -> Any:
        return self.rows[index]

    @property
    def downsampled(self) -> bool:
        return self.stride > 1

    def meta(self) -> dict[str, Any]:
        """What was kept, for ``series_meta.json``."""
        return {"rows_in": self.seen, "rows_kept": len(self.rows), "method": f"every {self.stride}th row",
                "max_rows": self.max_rows}


def add_bounded(session: Any, name: str, rows: Sequence[Any] | BoundedSeries) -> None:
    """Attach ``rows`` to ``session.series[name]``, capped; record the cap if it applied."""
    limit = max_rows()
    meta: dict[str, Any] | None = None
    if isinstance(rows, BoundedSeries):
        kept = list(rows.rows)
        if rows.downsampled:
            meta = rows.meta()
        if len(kept) > limit:
            before = len(kept)
            kept = downsample(kept, limit)
            meta = {"rows_in": rows.seen, "rows_kept": len(kept),
                    "method": f"every {rows.stride}th row, then evenly spaced {before} -> {len(kept)}",
                    "max_rows": limit}
    else:
        kept = downsample(rows, limit)
        if len(kept) < len(rows):
            meta = {"rows_in": len(rows), "rows_kept": len(kept), "method": "evenly spaced, first and last kept",
                    "max_rows": limit}
    session.series[name] = kept
    if meta is None:
        return
    log.warning("time series downsampled", series=name, rows_in=meta["rows_in"], rows_kept=meta["rows_kept"])
    notes: dict[str, Any] = {}
    raw = session.artifacts.get(META_ARTIFACT)
    if raw:
        try:
            notes = json.loads(raw)
        except ValueError:
            notes = {}
    notes[name] = meta
    session.artifacts[META_ARTIFACT] = json.dumps(notes, indent=2, sort_keys=True).encode()

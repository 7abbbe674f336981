"""The sweep manifest ``<store>/sweeps/<sweep_id>.json``: one entry per point, written
atomically by the driver. The store's tags are the source of truth; the manifest is what a
report and ``perfsdk sweep`` read back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsdk.store import Store, atomic_write

FINISHED = ("ok", "partial")


@dataclass
class PointState:
    """One point as the manifest records it."""

    point_id: str
    values: dict[str, Any]
    status: str = "pending"  # pending | running | ok | partial | failed
    run_id: str | None = None
    error: str | None = None
    objectives: dict[str, float | None] = field(default_factory=dict)
    feasible: bool | None = None
    pareto: bool = False
    config_hash: str | None = None
    strategies: list[str] = field(default_factory=list)
    validity: str | None = None  # the run's verdict: valid | noisy | invalid (None: not finished)
    validity_reasons: list[str] = field(default_factory=list)
    #: Figures besides the objectives: the run's records (``records.<name>``) and the quality
    #: metrics it was asked for (``collectors.quality.<metric>``).
    figures: dict[str, float | None] = field(default_factory=dict)


def manifest_path(store: Store, sweep_id: str) -> Path:
    """``<store>/sweeps/<sweep_id>.json``."""
    return store.root / "sweeps" / f"{sweep_id}.json"


def read_manifest(store: Store | str, sweep_id: str) -> dict[str, Any]:
    """A sweep's manifest; a missing one raises :class:`FileNotFoundError`."""
    st = store if isinstance(store, Store) else Store(store)
    path = manifest_path(st, sweep_id)
    if not path.is_file():
        raise FileNotFoundError(f"sweep {sweep_id} not found in {st.root}")
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def list_sweeps(store: Store | str) -> list[str]:
    """Ids of the sweeps in a store (from their manifests)."""
    st = store if isinstance(store, Store) else Store(store)
    folder = st.root / "sweeps"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def write_manifest(store: Store, sweep_id: str, manifest: dict[str, Any]) -> Path:
    """Write a sweep's manifest atomically; returns its path."""
    path = manifest_path(store, sweep_id)
    atomic_write(path, json.dumps(manifest, indent=2, default=str).encode("utf-8"))
    return path

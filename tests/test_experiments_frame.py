"""perfsdk.load_runs: a DataFrame with the CSV export's flattening, and its filters."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from pathlib import Path

import pytest

import perfsdk
from perfsdk.exporters.flatten import rows_for
from perfsdk.schemas import Record, RunResult
from perfsdk.store import Store


def _run(rid: str, name: str, status: str, tags: dict[str, str], tps: float) -> RunResult:
    return RunResult(run_id=rid, name=name, status=status, started_at=datetime(2026, 1, 1, tzinfo=timezone.utc),  # type: ignore[arg-type]
                     perfsdk_version="0", tags=tags, collectors={"latency": {"output_tokens_per_s": tps}},
                     records=[Record(name="accuracy", value=0.5 + tps / 1000)])


@pytest.fixture
def store(tmp_path: Path) -> Store:
    st = Store(tmp_path / "s")
    st.save(_run("r1", "a", "ok", {"sweep_id": "sw", "dtype": "float32"}, 100.0))
    st.save(_run("r2", "a", "failed", {"sweep_id": "sw", "dtype": "bfloat16"}, 50.0))
    st.save(_run("r3", "b", "ok", {"dtype": "bfloat16"}, 200.0))
    return st


def test_load_runs_flattens_like_csv(store: Store) -> None:
    df = perfsdk.load_runs(store.root)
    assert list(df["run_id"]) == ["r1", "r2", "r3"]
    cols, rows = rows_for(store.list_runs())
    assert list(df.columns) == cols
    assert df["collectors.latency.output_tokens_per_s"].tolist() == [100.0, 50.0, 200.0]
    assert df["records.accuracy"].tolist() == pytest.approx([0.6, 0.55, 0.7])
    assert df["tags.dtype"].tolist() == ["float32", "bfloat16", "bfloat16"]
    # the CSV exporter writes the same columns in the same order
    from perfsdk.plugins import collect_registry, get_plugin_manager

    buf = io.StringIO()
    collect_registry(get_plugin_manager()).exporters["csv"]().export(store.list_runs(), buf)
    assert next(csv.reader(io.StringIO(buf.getvalue()))) == cols


def test_filters(store: Store) -> None:
    assert perfsdk.load_runs(store, name="a")["run_id"].tolist() == ["r1", "r2"]
    assert perfsdk.load_runs(store, status="ok")["run_id"].tolist() == ["r1", "r3"]
    assert perfsdk.load_runs(store, sweep_id="sw", status="ok")["run_id"].tolist() == ["r1"]
    assert perfsdk.load_runs(store, tag_dtype="bfloat16")["run_id"].tolist() == ["r2", "r3"]
    assert perfsdk.load_runs(store, tags={"dtype": "bfloat16"}, name="b")["run_id"].tolist() == ["r3"]
    assert perfsdk.load_runs(store, run_ids=["r3", "r1"])["run_id"].tolist() == ["r3", "r1"]
    assert len(perfsdk.load_runs(store, name="zzz")) == 0
    with pytest.raises(TypeError, match="unexpected filter 'colour'"):
        perfsdk.load_runs(store, colour="red")


def test_missing_store_is_empty(tmp_path: Path) -> None:
    assert len(perfsdk.load_runs(tmp_path / "nothing")) == 0

"""The result store: layout, atomic writes, index, series, safe names."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from perfsdk.schemas import RunResult
from perfsdk.session import new_run_id
from perfsdk.store import Store, StoreError, safe_name


def _run(run_id: str | None = None, **kw) -> RunResult:
    base = dict(run_id=run_id or new_run_id(), name="r", status="ok", started_at=datetime.now(timezone.utc),
                perfsdk_version="0.1.0")
    base.update(kw)
    return RunResult(**base)


def test_save_get_roundtrip_with_series_and_artifacts(tmp_path):
    st = Store(tmp_path)
    r = _run(tags={"sweep_id": "s1"}, collectors={"not_installed": {"output_tokens": 5}})
    folder = st.save(r, series={"token_times": [{"t_s": 0.1}, {"t_s": 0.2}]}, artifacts={"trace.json": b"{}"})
    assert folder == tmp_path / "runs" / r.run_id
    back = st.get(r.run_id)
    # read back: the same run, with the collector marked as not installed here
    assert back.collector_meta["not_installed"].installed is False
    assert back.model_copy(update={"collector_meta": {}}) == r.model_copy(
        update={"series": {"token_times": "series/token_times.jsonl"}, "artifacts": {"trace.json": "artifacts/trace.json"}})
    assert st.read_series(r.run_id, "token_times") == [{"t_s": 0.1}, {"t_s": 0.2}]
    assert (folder / "artifacts" / "trace.json").read_bytes() == b"{}"
    assert st.indexed_ids() == [r.run_id]
    assert st.check() == {"unindexed": [], "missing": [], "unreadable": [], "temporary": []}


def test_filters_and_order(tmp_path):
    st = Store(tmp_path)
    ids = []
    for i, status in enumerate(["ok", "failed", "ok"]):
        r = _run(run_id=f"20260101T00000{i}-abc", name=f"n{i % 2}", status=status, tags={"k": str(i)})
        st.save(r)
        ids.append(r.run_id)
    assert st.run_ids() == ids
    assert [r.run_id for r in st.list_runs(status="ok")] == [ids[0], ids[2]]
    assert [r.run_id for r in st.list_runs(name="n1")] == [ids[1]]
    assert [r.run_id for r in st.list_runs(tags={"k": "2"})] == [ids[2]]
    assert [r.run_id for r in st.list_runs([ids[1]])] == [ids[1]]


def test_duplicate_and_unsafe_ids_rejected(tmp_path):
    st = Store(tmp_path)
    r = _run()
    st.save(r)
    with pytest.raises(StoreError, match="already exists"):
        st.save(r)
    for bad in ("../escape", "a/b", ".hidden", "..", "x\\y"):
        with pytest.raises(StoreError):
            safe_name(bad)
        with pytest.raises(StoreError):
            st.save(_run(run_id=bad))
    assert not (tmp_path.parent / "escape").exists()


def test_series_names_cannot_escape(tmp_path):
    st = Store(tmp_path)
    r = _run()
    folder = st.save(r, series={"../../evil": [{"a": 1}]}, artifacts={"../x.bin": b"1"})
    stored = st.get(r.run_id)
    assert all(not p.startswith("..") and "/../" not in p for p in list(stored.series.values()) + list(stored.artifacts.values()))
    assert (folder / stored.series["../../evil"]).is_file()


def test_missing_run_and_damaged_file(tmp_path):
    st = Store(tmp_path)
    with pytest.raises(StoreError, match="not found"):
        st.get("20260101T000000-000000000000")
    r = _run()
    st.save(r)
    (tmp_path / "runs" / r.run_id / "result.json").write_text("{truncated")
    assert st.list_runs() == []  # skipped, not a crash
    assert st.check()["unreadable"] == [r.run_id]

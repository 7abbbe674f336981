"""``perfsdk store check`` / ``repair`` and names that must not escape the store."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from perfsdk.schemas import RunResult
from perfsdk.store import Store, StoreError


def _run(rid: str) -> RunResult:
    now = datetime.now(timezone.utc)
    return RunResult(run_id=rid, name="n", status="ok", started_at=now, perfsdk_version="test")


def _store(tmp_path: Path, n: int) -> Store:
    store = Store(tmp_path / "store")
    for i in range(n):
        store.save(_run(f"run-{i}"))
    return store


def test_check_clean_store(tmp_path: Path, perfsdk_cli) -> None:
    store = _store(tmp_path, 3)
    res = perfsdk_cli(["store", "check", "--store", str(store.root), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.output) == {"runs": 3, "unindexed": [], "missing": [], "unreadable": [], "temporary": []}


def test_check_and_repair_every_kind_of_mismatch(tmp_path: Path, perfsdk_cli) -> None:
    store = _store(tmp_path, 4)
    with sqlite3.connect(store.index_path) as conn:  # run-0 on disk, not indexed
        conn.execute("DELETE FROM runs WHERE run_id = 'run-0'")
    import shutil

    shutil.rmtree(store.run_dir("run-1"))  # run-1 indexed, folder gone
    (store.run_dir("run-2") / "result.json").write_text('{"run_id": "run-2", "trunc')  # damaged
    (store.runs_dir / ".tmp-run-9-abc").mkdir()  # left by a killed writer
    res = perfsdk_cli(["store", "check", "--store", str(store.root), "--json"])
    assert res.exit_code == 1
    assert json.loads(res.output) == {"runs": 3, "unindexed": ["run-0"], "missing": ["run-1"],
                                      "unreadable": ["run-2"], "temporary": [".tmp-run-9-abc"]}
    res = perfsdk_cli(["store", "check", "--store", str(store.root)])
    assert res.exit_code == 1 and "4 problem(s)" in res.output and "run-2" in res.output
    # export still works and skips the damaged run
    res = perfsdk_cli(["export", "--format", "jsonl", "--store", str(store.root)])
    assert res.exit_code == 0
    assert sorted(json.loads(ln)["run_id"] for ln in res.stdout.splitlines()) == ["run-0", "run-3"]
    res = perfsdk_cli(["store", "repair", "--store", str(store.root)])
    assert res.exit_code == 0, res.output
    assert "4 problem(s) repaired" in res.output
    # it says where the damaged run went
    assert f"moved damaged run run-2 to {store.runs_dir / '.damaged-run-2'}" in res.output
    assert store.check() == {"unindexed": [], "missing": [], "unreadable": [], "temporary": []}
    assert store.indexed_ids() == ["run-0", "run-3"]
    assert (store.runs_dir / ".damaged-run-2" / "result.json").is_file()  # moved aside, not deleted


def test_check_unknown_store_is_usage_error(tmp_path: Path, perfsdk_cli) -> None:
    res = perfsdk_cli(["store", "check", "--store", str(tmp_path / "nope")])
    assert res.exit_code == 2


@pytest.mark.parametrize("rid", ["../x", "a/b", "/etc/passwd", "..", ".hidden", "a\\b", "", "x" * 300])
def test_run_ids_with_separators_are_refused(tmp_path: Path, rid: str) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(StoreError):
        store.save(_run(rid))
    with pytest.raises(StoreError):
        store.get(rid)
    assert list(tmp_path.iterdir()) in ([tmp_path / "store"], [])
    assert store.run_ids() == []


def test_series_names_that_sanitize_alike_do_not_overwrite(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.save(_run("r"), series={"a/b": [{"v": 1}], "a_b": [{"v": 2}], "a:b": [{"v": 3}]},
               artifacts={"../t.txt": b"1", ".._t.txt": b"2"})
    assert [store.read_series("r", n) for n in ("a/b", "a_b", "a:b")] == [[{"v": 1}], [{"v": 2}], [{"v": 3}]]
    run = store.get("r")
    assert sorted((store.run_dir("r") / f).read_bytes() for f in run.artifacts.values()) == [b"1", b"2"]

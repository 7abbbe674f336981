"""Many writers at once, and a writer killed with SIGKILL mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from perfsdk.store import Store

ROOT = Path(__file__).resolve().parents[1]

WRITER = r"""
import sys
from datetime import datetime, timezone
from perfsdk.schemas import RunResult
from perfsdk.session import new_run_id
from perfsdk.store import Store

store_dir, worker, runs, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = Store(store_dir)
i = 0
while runs < 0 or i < runs:
    now = datetime.now(timezone.utc)
    res = RunResult(run_id=new_run_id(), name=f"w{worker}", status="ok", started_at=now, finished_at=now,
                    perfsdk_version="test", tags={"worker": str(worker), "i": str(i)},
                    collectors={"latency": {"requests": i}})
    store.save(res, series={"samples": [{"k": k, "v": k * 0.5} for k in range(rows)]})
    i += 1
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_eight_writers_lose_nothing(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(store_dir), str(w), "25", "20"], env=_env(),
                              stderr=subprocess.PIPE, text=True) for w in range(8)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    store = Store(store_dir)
    ids = store.run_ids()
    assert len(ids) == 200 and len(set(ids)) == 200
    assert store.indexed_ids() == ids
    runs = store.list_runs(skip_unreadable=False)
    assert len(runs) == 200
    pairs = sorted((r.tags["worker"], int(r.tags["i"])) for r in runs)
    assert pairs == sorted((str(w), i) for w in range(8) for i in range(25))
    assert all(r.collectors["latency"]["requests"] == int(r.tags["i"]) for r in runs)
    assert all(len(store.read_series(r.run_id, "samples")) == 20 for r in runs[:10])
    assert store.check() == {"unindexed": [], "missing": [], "unreadable": [], "temporary": []}


def test_sigkill_mid_write_leaves_store_readable(tmp_path: Path, perfsdk_cli) -> None:
    store_dir = tmp_path / "store"
    runs_dir = store_dir / "runs"
    # Big series make each save take long enough to be caught half-way.
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(store_dir), "0", "-1", "150000"], env=_env(),
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    caught = False
    try:
        complete_seen = 0
        while time.monotonic() < deadline:
            if runs_dir.is_dir():
                names = os.listdir(runs_dir)
                complete_seen = sum(1 for n in names if not n.startswith("."))
                tmp = [n for n in names if n.startswith(".tmp-")]
                if complete_seen >= 1 and tmp and (runs_dir / tmp[0] / "series").is_dir():
                    p.send_signal(signal.SIGKILL)
                    caught = True
                    break
            time.sleep(0.005)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
    assert caught, "writer never seen mid-write"
    assert p.returncode == -signal.SIGKILL
    store = Store(store_dir)
    ids = store.run_ids()
    assert len(ids) >= 1
    for rid in ids:  # every run that is visible is complete
        assert len(store.read_series(rid, "samples")) == 150000
    report = store.check()
    assert report["unreadable"] == []
    # the half-written run is a hidden temporary folder (unless the rename won the race)
    assert len(report["temporary"]) <= 1
    res = perfsdk_cli(["export", "--format", "csv", "--store", str(store_dir)])
    assert res.exit_code == 0
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 + len(ids)
    res = perfsdk_cli(["store", "repair", "--store", str(store_dir)])
    assert res.exit_code == 0, res.output
    assert store.check() == {"unindexed": [], "missing": [], "unreadable": [], "temporary": []}
    assert store.indexed_ids() == ids

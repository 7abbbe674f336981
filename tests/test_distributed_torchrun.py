"""Two ranks on CPU under torchrun (gloo): one stored run with a ``ranks`` section."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from perfsdk.store import Store

from launcher import torchrun

ROOT = Path(__file__).resolve().parents[1]


def test_session_script_under_torchrun(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    proc = torchrun([str(ROOT / "examples" / "distributed_session.py"), "--store", str(store_dir),
                     "--prompts", "6", "--max-new-tokens", "4"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = Store(store_dir)
    ids = store.run_ids()
    assert len(ids) == 1, "only rank 0 stores"
    assert store.indexed_ids() == ids
    run = store.get(ids[0])
    assert run.status == "ok"
    # both ranks printed the same run id
    assert proc.stdout.count(ids[0]) == 2
    assert run.ranks is not None and [r.rank for r in run.ranks] == [0, 1]
    assert all(r.world_size == 2 for r in run.ranks)
    lat = run.collectors["latency"]
    # 6 prompts of 4..9 tokens, 3 per rank, 4 new tokens each
    assert [r.collectors["latency"]["requests"] for r in run.ranks] == [3, 3]
    assert lat["requests"] == 6 and lat["output_tokens"] == 24 and lat["input_tokens"] == 4 + 5 + 6 + 7 + 8 + 9
    assert lat["ttft_s"]["count"] == 6 and lat["tpot_s"]["count"] == 6 and lat["itl_s"]["count"] == 18
    assert lat["steps"] == 3 and lat["step_s"]["count"] == 3
    assert lat["wall_s"] == max(r.collectors["latency"]["wall_s"] for r in run.ranks)
    assert run.environment.extra["distributed"]["world_size"] == 2
    assert "rank1.token_times" in run.series
    assert len(store.read_series(ids[0], "rank1.token_times")) == 3 * 4


@pytest.mark.skipif(importlib.util.find_spec("perfsdk.models.runner") is None, reason="workload runner not available")
def test_perfsdk_run_under_torchrun(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    proc = torchrun(["-m", "perfsdk", "run", "--store", str(store_dir), "-q",
                     "--set", "workload.num_prompts=4", "--set", "workload.batching.batch_size=1",
                     "--set", "workload.generate.max_new_tokens=3", "--set", "workload.generate.min_new_tokens=3",
                     "--set", "workload.warmup_runs=0", "--set", "workload.min_iterations=1",
                     "--set", "collectors.energy=false", "--set", "collectors.utilization=false"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = Store(store_dir)
    ids = store.run_ids()
    assert len(ids) == 1
    run = store.get(ids[0])
    assert run.ranks is not None and len(run.ranks) == 2
    per_rank = [r.collectors["latency"] for r in run.ranks]
    lat = run.collectors["latency"]
    # 4 prompts, batch size 1, one timed pass: ranks 0 and 1 each run their 2-prompt share
    assert [r["requests"] for r in per_rank] == [2, 2] and [r["steps"] for r in per_rank] == [2, 2]
    assert lat["requests"] == 4 and lat["output_tokens"] == 12 and lat["steps"] == 2
    assert lat["input_tokens"] == per_rank[0]["input_tokens"] + per_rank[1]["input_tokens"]
    assert lat["ttft_s"]["count"] == 4 and lat["tpot_s"]["count"] == 4 and lat["itl_s"]["count"] == 8
    assert run.workload is not None and run.workload.num_prompts == 4
    # both ranks print the same run id (-q)
    assert proc.stdout.split() == [ids[0]]  # only rank 0 prints; rank 1 says where its data went
    assert f"rank 1: run {ids[0]}" in proc.stderr
    assert json.loads(json.dumps(run.model_dump(mode="json")))["run_id"] == ids[0]

"""Nothing silent: prompts left out by max_input_tokens are shown with the reason, and an
interrupted run records how far the workload got."""

from __future__ import annotations

import json

import pytest

import perfsdk
from perfsdk.models.runner import run_workload


def test_prompts_over_max_input_tokens_are_shown_in_the_summary(perfsdk_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\n" + " ".join(["word"] * 300) + "\nhello\n")  # the middle one is > 300 tokens
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), "--set", f"workload.prompts={prompts}",
                     "--set", "workload.num_prompts=3", "--set", "workload.max_input_tokens=100",
                     "--set", "workload.batching.batch_size=2", "--set", "workload.generate.max_new_tokens=2",
                     "--set", "workload.warmup_runs=0", "--set", "workload.min_iterations=1"])
    assert r.exit_code == 0, r.output
    assert "1 of 3 prompts left out: longer than workload.max_input_tokens (100 tokens)" in r.output
    (run,) = (store / "runs").iterdir()
    wl = json.loads((run / "result.json").read_text())["workload"]
    assert (wl["num_prompts"], wl["prompts_filtered"], wl["max_input_tokens"]) == (2, 1, 100)


def test_interrupted_run_records_the_counters_it_reached(tmp_path):
    cfg = {"workload": {"num_prompts": 4, "batching": {"batch_size": 1}, "generate": {"max_new_tokens": 2},
                        "warmup_runs": 1, "min_iterations": 5}}
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        seen.append(done)
        if done == 1 + 6:  # one warm-up batch, then six timed ones: one full pass of 4 and half of the next
            raise KeyboardInterrupt

    s = perfsdk.session(cfg, store=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with s:
            run_workload(s, progress=progress)
    res = s.result
    assert res is not None and res.status == "failed"
    assert (res.workload.warmup_runs, res.workload.timed_runs, res.workload.iterations) == (1, 6, 1)
    assert res.collectors["latency"]["steps"] == 6 and res.collectors["latency"]["warmup_steps"] == 1
    assert [e.source for e in res.errors] == ["interrupt"]
    stored = json.loads((tmp_path / "runs" / res.run_id / "result.json").read_text())["workload"]
    assert (stored["timed_runs"], stored["iterations"]) == (6, 1)

"""SIGINT / SIGTERM sent to a real ``perfsdk run`` process mid-run."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from perfsdk.store import Store

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("perfsdk.models.runner") is None,
                                reason="workload runner not available")


def _start(store_dir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PERFSDK_TRACE_HOOKS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    # A run far too long to finish: it only ends by the signal.
    args = ["-v", "run", "--store", str(store_dir), "-q",
            "--set", "workload.num_prompts=4", "--set", "workload.batching.batch_size=1",
            "--set", "workload.min_iterations=100000", "--set", "workload.warmup_runs=0",
            "--set", "workload.generate.max_new_tokens=8", "--set", "workload.generate.min_new_tokens=8",
            "--set", "collectors.energy=false", "--set", "collectors.utilization=false"]
    return subprocess.Popen([sys.executable, "-m", "perfsdk", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _interrupt(proc: subprocess.Popen[str], sig: int, times: int, out: dict[str, object]) -> None:
    """Wait for two finished steps (traced hook calls on stderr), then send ``sig``."""
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        if "hook=perfsdk_after_generate plugin=collector:latency" in line:
            seen += 1
            if seen == 2:
                for _ in range(times):
                    proc.send_signal(sig)
                break
    stdout, stderr = proc.communicate(timeout=90)
    out.update(rc=proc.returncode, stdout=stdout, stderr=stderr, seen=seen)


def test_sigint_and_sigterm_store_a_failed_run_with_the_data_so_far(tmp_path: Path) -> None:
    cases = {"SIGINT": (signal.SIGINT, 1, 130), "SIGTERM": (signal.SIGTERM, 2, 143)}
    results: dict[str, dict[str, object]] = {}
    threads = []
    for name, (sig, times, _) in cases.items():
        results[name] = {}
        proc = _start(tmp_path / name)
        t = threading.Thread(target=_interrupt, args=(proc, sig, times, results[name]))
        t.start()
        threads.append((t, proc))
    for t, proc in threads:
        t.join(timeout=150)
        if t.is_alive():
            proc.kill()
    for name, (sig, times, code) in cases.items():
        res = results[name]
        assert res.get("seen") == 2, res
        assert res["rc"] == code, str(res.get("stderr"))[-2000:]
        store = Store(tmp_path / name)
        ids = store.run_ids()
        assert len(ids) == 1 and store.indexed_ids() == ids
        # the run id is what -q prints
        assert str(res["stdout"]).strip() == ids[0]
        run = store.get(ids[0])
        assert run.status == "failed"
        interrupts = [e for e in run.errors if e.source == "interrupt"]
        assert len(interrupts) == 1 and interrupts[0].message == f"interrupted by {name}"
        lat = run.collectors["latency"]
        # the two steps finished before the signal are kept (batch size 1, 8 tokens each)
        assert lat["steps"] >= 2 and lat["output_tokens"] == 8 * lat["requests"]
        assert len(store.read_series(ids[0], "token_times")) == 8 * lat["steps"]
        assert "memory" in run.collectors

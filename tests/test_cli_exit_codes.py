"""Exit 2 (invalid config or usage, model not found) stores nothing and prints the error once;
a Hub id without network fails at once, with or without HF_HUB_OFFLINE."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perfsdk.config import ConfigError, ModelConfig
from perfsdk.models import loader

SMALL = ["--set", "workload.num_prompts=2", "--set", "workload.batching.batch_size=2",
         "--set", "workload.generate.max_new_tokens=2", "--set", "workload.warmup_runs=0",
         "--set", "workload.min_iterations=1"]
#: A Hub id that no cache on any machine holds.
MISSING_ID = "perfsdk-tests/no-such-model-5c1e"


def _closed_port() -> int:
    """A local TCP port with nothing listening (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stored(store: Path) -> list[Path]:
    runs = store / "runs"
    return sorted(runs.iterdir()) if runs.is_dir() else []


def _assert_usage_error_once(result, store: Path, *needles: str) -> str:
    out = result.output
    assert result.exit_code == 2, out
    assert out.count("perfsdk: error: ") == 1, out
    for needle in needles:
        assert out.count(needle) == 1, (needle, out)
    assert "Latency" not in out and "status failed" not in out  # no summary of a run that never was
    assert _stored(store) == []
    return out


def test_hub_id_offline_exits_2_and_stores_nothing(perfsdk_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store = tmp_path / "store"
    t0 = time.monotonic()
    r = perfsdk_cli(["run", "--store", str(store), "--set", f"model.id={MISSING_ID}", *SMALL])
    elapsed = time.monotonic() - t0
    out = _assert_usage_error_once(r, store, f"model.id: {MISSING_ID!r}")
    assert "HF_HUB_OFFLINE is set" in out
    assert "point model.id at a local folder" in out and "--set model.id=./models/no-such-model-5c1e" in out
    assert elapsed < 2.0


def test_hub_id_without_network_and_without_offline_flag_fails_fast(perfsdk_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        loader.check_model_available(ModelConfig(id=MISSING_ID))
    assert time.monotonic() - t0 < 2.0
    assert f"the Hub ({endpoint}) cannot be reached" in str(err.value)
    assert "point model.id at a local folder" in str(err.value)

    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), "--set", f"model.id={MISSING_ID}", *SMALL],
                    env={"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None})
    _assert_usage_error_once(r, store, "cannot be reached")


def test_hub_check_gives_up_on_a_silent_address(monkeypatch):
    """An address that never answers (nor resolves) costs the probe's time limit, not more."""
    release = threading.Event()

    def hang(*a, **k):
        release.wait(10)
        raise OSError("gave up")

    monkeypatch.setattr(loader.socket, "create_connection", hang)
    t0 = time.monotonic()
    ok, why = loader.hub_reachable("https://192.0.2.1", timeout_s=0.3)
    elapsed = time.monotonic() - t0
    release.set()
    assert (ok, why) == (False, "no answer within 0.3 s")
    assert elapsed < 1.0


def test_hub_id_in_a_fresh_process_without_offline_variables(tmp_path):
    """As a user would type it: no HF_HUB_OFFLINE at all, the Hub unreachable, an empty cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_HOME=str(tmp_path / "hf"), COLUMNS="120")
    store = tmp_path / "store"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "perfsdk", "run", "--store", str(store),
                           "--set", f"model.id={MISSING_ID}", *SMALL],
                          capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("perfsdk: error: ") == 1 and "cannot be reached" in proc.stderr
    assert _stored(store) == []
    # the Hub client's own retries take about 25 s here; the check answers at once (the rest is
    # interpreter and torch start-up on a shared machine)
    assert elapsed < 15, elapsed


def test_folder_with_config_but_no_weights_exits_2(perfsdk_cli, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), "--set", f"model.id={folder}", *SMALL])
    out = _assert_usage_error_once(r, store, f"model.id: folder {folder} has a config.json but no weights")
    assert "save_pretrained" in out


def test_invalid_input_found_during_the_run_stores_nothing(perfsdk_cli, tmp_path):
    """Every prompt longer than max_input_tokens is only known once the tokenizer is loaded,
    inside the session: still exit 2, the error once, no run stored."""
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), *SMALL, "--set", "workload.max_input_tokens=1"])
    _assert_usage_error_once(r, store, "workload.max_input_tokens: all 2 prompts are longer than 1 tokens")
    assert not (store / "index.sqlite").exists() or json.loads(
        perfsdk_cli(["runs", "--store", str(store), "--json"]).output) == []


def test_unknown_exporter_in_config_exits_2_before_the_run(perfsdk_cli, tmp_path):
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), *SMALL, "--set", "exporters=[jsonl, csvv]"])
    _assert_usage_error_once(r, store, "exporters[1]: unknown exporter 'csvv' (did you mean 'csv'?)")


def test_failed_run_exits_1_stores_the_run_and_prints_the_error_once(perfsdk_cli, tmp_path, monkeypatch):
    import perfsdk.models.runner as runner

    def boom(session, progress=None):
        session.load()
        raise RuntimeError("the model fell over")

    monkeypatch.setattr(runner, "run_workload", boom)
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), *SMALL])
    assert r.exit_code == 1, r.output
    assert r.output.count("the model fell over") == 1 and "status failed" in r.output
    (run,) = _stored(store)
    stored = json.loads((run / "result.json").read_text())
    assert stored["status"] == "failed"
    assert [(e["source"], e["type"], e["message"]) for e in stored["errors"]] == [
        ("user", "RuntimeError", "the model fell over")]
    r = perfsdk_cli(["run", "--store", str(tmp_path / "q"), "--quiet", *SMALL])
    assert r.exit_code == 1
    assert r.output.count("perfsdk: error: run failed: RuntimeError: the model fell over") == 1

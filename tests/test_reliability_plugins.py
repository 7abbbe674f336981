"""Faulty collectors cannot break a run; plugin allow-list and disable switches from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel

import perfsdk
from perfsdk.collector import Collector, CollectorResult
from perfsdk.plugins import hookimpl
from perfsdk.store import Store

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ["perfsdk_session_start", "perfsdk_load", "perfsdk_before_generate", "perfsdk_window_open",
         "perfsdk_window_close", "perfsdk_after_generate", "perfsdk_finalize"]
CFG = {"collectors": {"energy": False, "utilization": False}}


class GoodResult(CollectorResult):
    steps: int


class Raiser(Collector):
    """Raises in every lifecycle hook."""

    name = "raiser"

    @hookimpl
    def perfsdk_session_start(self, session: Any) -> None:
        raise RuntimeError("start")

    @hookimpl
    def perfsdk_load(self, session: Any, event: Any) -> None:
        raise RuntimeError("load")

    @hookimpl
    def perfsdk_before_generate(self, session: Any, step: Any) -> None:
        raise RuntimeError("before")

    @hookimpl
    def perfsdk_window_open(self, session: Any, window: Any) -> None:
        raise KeyError(window.name)

    @hookimpl
    def perfsdk_window_close(self, session: Any, window: Any) -> None:
        raise ZeroDivisionError(window.name)

    @hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        raise RuntimeError("after")

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> None:
        raise RuntimeError("finalize")


class WrongFields(Collector):
    """Returns a dict that fails its Result schema."""

    name = "wrongfields"
    Result = GoodResult

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> Any:
        return {"steps": "many", "extra": 1}


class OtherModel(BaseModel):
    nope: int = 1


class WrongType(Collector):
    """Returns a different model and a string in two sessions."""

    name = "wrongtype"
    Result = GoodResult

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> Any:
        return "not a result"


class Slow(Collector):
    """Sleeps in the measured path; still produces a valid result."""

    name = "slow"
    Result = GoodResult

    @hookimpl
    def perfsdk_window_open(self, session: Any, window: Any) -> None:
        if window.kind == "step":
            time.sleep(0.12)

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> GoodResult:
        return GoodResult(steps=len(session.measured_steps))


def _run(tmp_path: Path, model: Any, collectors: list[type]) -> Any:
    with perfsdk.session(CFG, collectors=collectors, store=tmp_path) as s:
        s.load(model=model)
        ids = torch.tensor([[5, 6, 7, 8]])
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                   min_new_tokens=3, do_sample=False)
    return s


def test_collector_raising_in_every_hook_is_isolated(tmp_path: Path, tiny_causal_lm: Any) -> None:
    s = _run(tmp_path, tiny_causal_lm, [Raiser])
    run = Store(tmp_path).get(s.result.run_id)
    assert run.status == "partial"
    by_hook: dict[str, int] = {}
    for e in run.errors:
        assert e.source == "raiser"
        by_hook[e.hook or ""] = by_hook.get(e.hook or "", 0) + 1
    # windows: session, step:0, prefill, decode (each opened and closed once)
    assert by_hook == {"perfsdk_session_start": 1, "perfsdk_load": 1, "perfsdk_before_generate": 1,
                       "perfsdk_window_open": 4, "perfsdk_window_close": 4, "perfsdk_after_generate": 1,
                       "perfsdk_finalize": 1}
    assert {e.type for e in run.errors} == {"RuntimeError", "KeyError", "ZeroDivisionError"}
    assert "raiser" not in run.collectors
    assert run.collectors["latency"]["output_tokens"] == 3 and run.collectors["latency"]["requests"] == 1
    assert run.collectors["memory"]["rss_peak_bytes"] > 0


def test_invalid_results_are_errors_not_stored(tmp_path: Path, tiny_causal_lm: Any) -> None:
    s = _run(tmp_path, tiny_causal_lm, [WrongFields, WrongType])
    run = Store(tmp_path).get(s.result.run_id)
    assert run.status == "partial"
    errs = {e.source: e for e in run.errors}
    assert set(errs) == {"wrongfields", "wrongtype"}
    assert all(e.hook == "perfsdk_finalize" and "failed validation" in e.message for e in errs.values())
    assert "steps" in errs["wrongfields"].message
    assert "wrongfields" not in run.collectors and "wrongtype" not in run.collectors
    assert run.collectors["latency"]["steps"] == 1


def test_slow_hook_is_timed_and_flagged(tmp_path: Path, tiny_causal_lm: Any) -> None:
    s = _run(tmp_path, tiny_causal_lm, [Slow])
    run = Store(tmp_path).get(s.result.run_id)
    assert run.status == "ok"  # slow is not wrong: the result is kept
    assert run.collectors["slow"] == {"steps": 1}
    t = run.environment.extra["hook_time"]["slow.perfsdk_window_open"]
    assert t["calls"] == 4 and t["over_budget"] == 1 and t["max_s"] >= 0.12
    assert t["total_s"] >= 0.12
    assert list(run.environment.extra["hook_time"])[0] == "slow.perfsdk_window_open"  # slowest first
    assert run.environment.extra["hook_time"]["latency.perfsdk_after_generate"]["over_budget"] == 0


# -- plugin switches from the command line ----------------------------------------------------

PLUGIN_SRC = '''
import os
from pathlib import Path
from perfsdk import Collector, hookimpl

Path(os.environ["MARKER"]).write_text("plugin code ran")


class Evil(Collector):
    name = "evil"


@hookimpl
def perfsdk_register_collectors(register):
    register(Evil)
'''


@pytest.fixture
def fake_dist(tmp_path: Path) -> Path:
    """An installed-looking distribution with a ``perfsdk`` entry point, on a private path."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "evil_plugin.py").write_text(PLUGIN_SRC)
    info = site / "perfsdk_evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: perfsdk-evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[perfsdk]\nevil = evil_plugin\n")
    return site


def _plugins_subprocess(site: Path, marker: Path, *args: str) -> tuple[set[str], bool]:
    env = dict(os.environ, MARKER=str(marker), PYTHONPATH=f"{site}{os.pathsep}{ROOT / 'src'}")
    for k in ("PERFSDK_PLUGINS", "PERFSDK_DISABLE_PLUGIN_AUTOLOAD"):
        env.pop(k, None)
    if marker.exists():
        marker.unlink()
    proc = subprocess.run([sys.executable, "-m", "perfsdk", *args, "plugins", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {r["name"] for r in json.loads(proc.stdout)}, marker.exists()


def test_no_plugin_autoload_in_a_fresh_process(tmp_path: Path, fake_dist: Path) -> None:
    marker = tmp_path / "marker"
    names, ran = _plugins_subprocess(fake_dist, marker, "--no-plugin-autoload")
    assert "evil" not in names and not ran  # the module was never imported


def test_plugin_switches_from_cli(tmp_path: Path, fake_dist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from perfsdk.cli import cli

    marker = tmp_path / "marker"
    monkeypatch.syspath_prepend(str(fake_dist))
    monkeypatch.setenv("MARKER", str(marker))

    def plugins(*args: str, env: dict[str, str] | None = None) -> tuple[set[str], bool]:
        for k in ("PERFSDK_PLUGINS", "PERFSDK_DISABLE_PLUGIN_AUTOLOAD"):
            monkeypatch.delenv(k, raising=False)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        sys.modules.pop("evil_plugin", None)
        if marker.exists():
            marker.unlink()
        res = CliRunner().invoke(cli, [*args, "plugins", "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return {r["name"] for r in json.loads(res.stdout)}, marker.exists()

    names, ran = plugins()
    assert "evil" in names and ran
    names, ran = plugins("--no-plugin-autoload")
    assert "evil" not in names and not ran
    names, ran = plugins("--plugins", "pyruntime")
    assert "evil" not in names and not ran
    names, ran = plugins("--plugins", "evil")
    assert "evil" in names and "pyruntime" not in names and ran
    names, ran = plugins("--plugins=evil,pyruntime")
    assert "evil" in names and ran
    names, ran = plugins(env={"PERFSDK_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "evil" not in names and not ran
    names, ran = plugins(env={"PERFSDK_PLUGINS": "nothing"})
    assert "evil" not in names and not ran
    sys.modules.pop("evil_plugin", None)

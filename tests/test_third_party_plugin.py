"""The separately installable plugin package in plugins/ works through the entry point."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "plugins" / "perfsdk-pyruntime"


@pytest.fixture(scope="module")
def installed(perfsdk_plugin_installer):
    """The plugin package, installed into a temporary folder for this module only."""
    with perfsdk_plugin_installer.activate(PKG) as folder:
        yield folder


def test_installed_in_a_temporary_folder_not_the_environment(installed):
    import perfsdk_pyruntime.plugin

    assert Path(perfsdk_pyruntime.plugin.__file__).resolve().is_relative_to(installed.resolve())
    eps = [ep for ep in importlib.metadata.entry_points(group="perfsdk") if ep.name == "pyruntime"]
    assert eps and Path(eps[0].dist.locate_file("")).resolve() == installed.resolve()  # type: ignore[union-attr]
    assert not installed.resolve().is_relative_to(Path(sys.prefix).resolve())
    assert not any(PKG.glob("**/*.egg-info")) and not (PKG / "build").exists()  # the source tree stays clean


def test_listed_by_perfsdk_plugins(installed, perfsdk_cli):
    r = perfsdk_cli(["plugins", "--json"])
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert rows["pyruntime"]["collectors"] == ["pyruntime"]
    assert rows["pyruntime"]["distribution"] == "perfsdk-pyruntime 0.1.0"
    assert rows["pyruntime"]["builtin"] is False


def test_enabled_in_config_and_exported_to_csv(installed, perfsdk_cli, tmp_path):
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), "--set", "collectors.pyruntime={}",
                     "--set", "workload.num_prompts=2", "--set", "workload.batching.batch_size=2",
                     "--set", "workload.generate.max_new_tokens=3", "--set", "workload.warmup_runs=0",
                     "--set", "workload.min_iterations=1"])
    assert r.exit_code == 0, r.output
    out = perfsdk_cli(["export", "--format", "csv", "--store", str(store)]).output
    row = next(csv.DictReader(io.StringIO(out)))
    assert int(row["collectors.pyruntime.threads_peak"]) >= 1
    assert float(row["collectors.pyruntime.gc_pause_s"]) >= 0
    assert int(row["collectors.pyruntime.gc_collections"]) >= 0
    assert "collectors.pyruntime.ctx_switches_voluntary" in row


def test_bad_setting_names_the_plugin_field(installed, perfsdk_cli, tmp_path):
    r = perfsdk_cli(["run", "--store", str(tmp_path / "s"), "--set", "collectors.pyruntime.track_gcc=true"])
    assert r.exit_code == 2
    assert "collectors.pyruntime.track_gcc: unknown key" in r.output


def test_disable_autoload_and_allow_list(installed, perfsdk_cli, monkeypatch):
    monkeypatch.setenv("PERFSDK_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = {row["name"] for row in json.loads(perfsdk_cli(["plugins", "--json"]).output)}
    assert "pyruntime" not in names
    monkeypatch.delenv("PERFSDK_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("PERFSDK_PLUGINS", "something-else")
    names = {row["name"] for row in json.loads(perfsdk_cli(["plugins", "--json"]).output)}
    assert "pyruntime" not in names
    monkeypatch.setenv("PERFSDK_PLUGINS", "pyruntime")
    names = {row["name"] for row in json.loads(perfsdk_cli(["plugins", "--json"]).output)}
    assert "pyruntime" in names

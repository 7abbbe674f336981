"""CodeCarbon offline on CPU: its own row beside the counters, quiet, no files."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("codecarbon")

import perfsdk  # noqa: E402
from perfsdk.energy.codecarbon_source import CodeCarbonSource  # noqa: E402


@pytest.mark.slow
def test_codecarbon_row_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    before = set(threading.enumerate())
    cfg = {"collectors": {"energy": {"sources": ["codecarbon"], "codecarbon": {"country_iso_code": "FRA"}},
                          "utilization": False}}
    with perfsdk.session(cfg, store=None) as s:
        with s.stage("work"):
            sum(i * i for i in range(200_000))
    res = s.result.collectors["energy"]
    (row,) = [w for w in res["windows"] if w["source"] == "codecarbon"]
    assert row["window"] == "session" and row["method"] == "estimated" and row["device"] == "host"
    assert row["scope"] == "machine"
    assert row["energy_j"] > 0 and row["co2_kg"] > 0
    assert res["energy_j"]["codecarbon:machine"] == row["energy_j"]
    cc = res["codecarbon"]
    assert cc["country_iso_code"] == "FRA"
    assert cc["energy_j"] == pytest.approx(cc["cpu_energy_j"] + cc["gpu_energy_j"] + cc["ram_energy_j"])
    assert res["co2_kg"] == cc["co2_kg"]
    assert any("session window only" in n for n in res["notes"])
    assert os.listdir(tmp_path) == []  # no emissions.csv, no lock file
    out = capsys.readouterr()
    assert "codecarbon" not in (out.out + out.err).lower()  # quiet
    assert set(threading.enumerate()) - before == set()


def test_stop_without_start_and_twice() -> None:
    src = CodeCarbonSource()
    assert src.stop() is None
    ok, _ = src.start()
    assert ok
    assert src.stop() is not None
    assert src.stop() is None
    assert logging.getLogger("codecarbon").level >= logging.ERROR

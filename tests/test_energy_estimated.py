"""The opt-in estimated source: TDP x utilization, integrated, always labeled."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perfsdk.collectors.energy import EnergyCollector, EnergyConfig, build_result
from perfsdk.energy.estimated import EstimatedSource
from perfsdk.energy.fake import FakeNvmlReader
from perfsdk.energy.windows import EnergyMeter
from perfsdk.events import Window


def test_tdp_times_utilization_integrated_over_a_window() -> None:
    src = EstimatedSource(cpu_tdp_w=100.0, nvml=FakeNvmlReader(power_limit_w=300.0, utilization_pct=50.0),
                          cpu_percent=lambda: 25.0)
    ok, reason = src.open()
    assert ok and "TDP x utilization" in reason
    assert src.read_power() == {c: w for c, w in zip(src.channels, [25.0, 150.0])}
    meter = EnergyMeter([src])
    meter.open(1, "session", 0)
    meter.sample_power(1_000_000_000)
    rows = {w.channel.scope: w for w in meter.close(1, 2_000_000_000)}
    assert rows["cpu"].energy_j == pytest.approx(50.0) and rows["cpu"].channel.method == "estimated"
    assert rows["gpu"].energy_j == pytest.approx(300.0) and rows["gpu"].samples == 3


def test_nothing_to_estimate_gives_reasons() -> None:
    ok, reason = EstimatedSource(cpu_tdp_w=None, use_nvml=False).open()
    assert not ok and reason == "CPU: set collectors.energy.cpu_tdp_w to estimate CPU power"


def test_estimates_never_make_the_status_ok(tmp_path: object) -> None:
    cfg = EnergyConfig(sources=["rapl"], rapl_root=str(tmp_path), estimated=True, cpu_tdp_w=65.0,
                       codecarbon={"enabled": False})
    col = EnergyCollector(cfg, nvml_reader=FakeNvmlReader(energy_mj=[None]))
    col.meter = EnergyMeter(col._open_sources())
    w = Window(name="session", kind="session", start_ns=0)
    col.perfsdk_window_open(None, w)  # type: ignore[arg-type]
    w.end_ns = 1_000_000_000
    col.perfsdk_window_close(None, w)  # type: ignore[arg-type]
    res = build_result(col, SimpleNamespace(measured_steps=[]))  # type: ignore[arg-type]
    assert res.status == "unavailable"
    assert {s.name: s.available for s in res.sources} == {"nvml": False, "rapl": False, "estimated": True}
    assert {(x.source, x.scope, x.method) for x in res.windows} == {("estimated", "cpu", "estimated"),
                                                                    ("estimated", "gpu", "estimated")}
    assert res.measured_keys == [] and res.j_per_output_token is None

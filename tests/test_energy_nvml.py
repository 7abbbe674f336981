"""NVML source through a scripted reader: counter steps, low confidence, integration fallback."""

from __future__ import annotations

import pytest

from perfsdk.energy.fake import FakeNvmlReader
from perfsdk.energy.nvml import NvmlSource, open_nvml
from perfsdk.energy.windows import EnergyMeter, PowerTrace

MS = 1_000_000  # ns


def test_counter_steps_become_window_energy() -> None:
    reader = FakeNvmlReader(names=["A", "B"], energy_mj=[[0, 1_000, 4_500, 9_000], [0, 0, 250, 250]])  # first value: probe at open
    src = NvmlSource(reader)
    ok, reason = src.open()
    assert ok and "2 GPU(s)" in reason
    assert [(c.device, c.method) for c in src.channels] == [("0", "counter"), ("1", "counter")]
    meter = EnergyMeter([src])
    meter.open(1, "session", 0)
    meter.open(2, "step:0", 500 * MS)
    step = {w.channel.device: w for w in meter.close(2, 1500 * MS)}
    sess = {w.channel.device: w for w in meter.close(1, 2000 * MS)}
    assert step["0"].energy_j == pytest.approx(4.5)  # 4500 -> 9000 mJ
    assert step["1"].energy_j == pytest.approx(0.0)  # 250 -> 250 mJ
    assert sess["0"].energy_j == pytest.approx(8.0)  # 1000 -> 9000 mJ
    assert sess["0"].power_w == pytest.approx(4.0)
    assert step["0"].power_w == pytest.approx(4.5)
    assert not step["0"].low_confidence


def test_window_shorter_than_update_period_is_low_confidence() -> None:
    src = NvmlSource(FakeNvmlReader(energy_mj=[[0, 10, 20]]))
    src.open()
    meter = EnergyMeter([src])
    meter.open(1, "prefill", 0)
    (w,) = meter.close(1, 30 * MS)  # 30 ms < 100 ms
    assert w.low_confidence and w.energy_j == pytest.approx(0.01)


def test_unsupported_counter_falls_back_to_labeled_integration() -> None:
    # GPU 0 has the counter; GPU 1 does not and is integrated from power samples.
    reader = FakeNvmlReader(names=["new", "old"], energy_mj=[[0, 1_000, 2_000], None],
                            power_w=[[0.0], [100.0, 100.0, 200.0, 200.0]])
    src = NvmlSource(reader)
    ok, reason = src.open()
    assert ok and "energy counter unsupported" in reason
    assert [c.method for c in src.channels] == ["counter", "integrated"]
    meter = EnergyMeter([src])
    assert meter.wants_power_samples
    meter.open(1, "step:0", 0)                 # edge sample: 100 W at 0 s
    meter.sample_power(500 * MS)               # sampler:      100 W at 0.5 s
    meter.sample_power(1000 * MS)              # sampler:      200 W at 1.0 s
    rows = {w.channel.device: w for w in meter.close(1, 2000 * MS)}  # edge: 200 W at 2 s
    assert rows["0"].energy_j == pytest.approx(1.0)
    # trapezoid: 0.5 s x 100 W + 0.5 s x 150 W + 1 s x 200 W = 50 + 75 + 200
    assert rows["1"].energy_j == pytest.approx(325.0)
    assert rows["1"].channel.method == "integrated"
    assert rows["1"].samples == 4


def test_power_trace_interpolates_inside_and_holds_at_the_ends() -> None:
    tr = PowerTrace()
    assert tr.energy_j(0, 10) == (None, 0)  # no samples: missing, not zero
    tr.add(1_000_000_000, 10.0)
    tr.add(3_000_000_000, 30.0)
    e, n = tr.energy_j(2_000_000_000, 4_000_000_000)  # 20 W -> 30 W, then held at 30 W
    assert n == 1 and e == pytest.approx(25.0 + 30.0)
    e, n = tr.energy_j(0, 1_000_000_000)  # before the first sample: held at 10 W
    assert e == pytest.approx(10.0)


def test_open_nvml_without_driver_gives_a_reason() -> None:
    reader, reason = open_nvml()
    if reader is not None:
        reader.close()
        pytest.skip("a GPU is visible here")
    assert reason and ("driver" in reason or "not installed" in reason or "no GPU" in reason)

"""Window accounting end to end through the collector hooks with a scripted NVML counter.

Hand-computed numbers: every value below is a difference of the scripted counter readings.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perfsdk.collectors.energy import EnergyCollector, EnergyConfig, build_result
from perfsdk.energy.fake import FakeNvmlReader
from perfsdk.energy.windows import EnergyMeter
from perfsdk.events import Step, Window

MS = 1_000_000

# (event, window name, t in ms, counter mJ read at that edge or None when the edge is shared)
TIMELINE = [
    ("open", "session", 0, 1000),
    ("open", "step:0", 100, 2000), ("open", "prefill", 101, 2100), ("switch", None, 150, 3000),
    ("close", "decode", 300, 5000), ("close", "step:0", 301, 5050),
    ("open", "step:1", 400, 6000), ("open", "prefill", 401, 6100), ("switch", None, 450, 7100),
    ("close", "decode", 700, 9100), ("close", "step:1", 701, 9150),
    ("open", "step:2", 800, 10000), ("open", "prefill", 801, 10100), ("switch", None, 850, 11300),
    ("close", "decode", 1100, 13300), ("close", "step:2", 1101, 13360),
    ("open", "stage:post", 1200, 14000), ("close", "stage:post", 1300, 14500),
    ("close", "session", 1400, 15000),
]


def _run() -> tuple[EnergyCollector, SimpleNamespace, FakeNvmlReader]:
    counter = [0] + [mj for *_, mj in TIMELINE]  # the first value is read when the source opens
    # a counter that refreshes every millisecond, as the scripted values say (phases of ~100 ms then
    # hold enough updates for per-token figures)
    reader = FakeNvmlReader(names=["Fake GPU"], energy_mj=[counter], update_period_s=0.001)
    col = EnergyCollector(EnergyConfig(sources=["nvml"], codecarbon={"enabled": False}), nvml_reader=reader)
    col.meter = EnergyMeter(col._open_sources())
    steps = [
        Step(kind="generate", index=0, batch_size=2, input_tokens=[8, 8], output_tokens=[4, 4], warmup=True,
             end_ns=301 * MS),
        Step(kind="generate", index=1, batch_size=2, input_tokens=[8, 8], output_tokens=[4, 4], end_ns=701 * MS),
        Step(kind="generate", index=2, batch_size=2, input_tokens=[8, 8], output_tokens=[4, 3], end_ns=1101 * MS),
    ]
    session = SimpleNamespace(measured_steps=[s for s in steps if not s.warmup])
    open_w: dict[str, Window] = {}
    for event, name, t_ms, _ in TIMELINE:
        t = t_ms * MS
        if event == "switch":
            prev = open_w.pop("prefill")
            prev.end_ns = t
            col.perfsdk_window_close(session, prev)
            name = "decode"
            event = "open"
        if event == "open":
            idx = next((int(w.name.split(":")[1]) for w in open_w.values() if w.kind == "step"), None)
            kind = name.split(":")[0]
            if kind == "step":
                idx = int(name.split(":")[1])
            w = Window(name=name, kind=kind, start_ns=t, step_index=idx if kind != "stage" else None,
                       warmup=idx == 0 and kind != "stage")
            open_w[name] = w
            col.perfsdk_window_open(session, w)
        else:
            w = open_w.pop(name)
            w.end_ns = t
            col.perfsdk_window_close(session, w)
    return col, session, reader


def test_each_edge_is_read_once_and_shared_edges_share_a_reading() -> None:
    col, _, reader = _run()
    assert col.meter is not None
    assert col.meter.edge_reads == len(TIMELINE)  # prefill close and decode open share one read
    assert reader.energy_calls == len(TIMELINE) + 1


def test_per_window_per_phase_and_per_token_numbers() -> None:
    col, session, _ = _run()
    res = build_result(col, session)
    key = "nvml:gpu:0"
    assert res.status == "ok"
    win = {(w.window, w.step_index): w.energy_j for w in res.windows}
    assert win[("step:1", 1)] == pytest.approx(3.15)
    assert win[("prefill", 1)] == pytest.approx(1.0)
    assert win[("decode", 1)] == pytest.approx(2.0)
    assert win[("step:2", 2)] == pytest.approx(3.36)
    assert win[("session", None)] == pytest.approx(14.0)

    assert res.output_tokens == 15  # 4+4 + 4+3; warm-up step excluded
    assert res.energy_j[key] == pytest.approx(14.0)
    assert res.steps_energy_j[key] == pytest.approx(6.51)
    assert res.j_per_output_token_by_source[key] == pytest.approx(6.51 / 15)
    assert res.output_tokens_per_j_by_source[key] == pytest.approx(15 / 6.51)
    assert res.j_per_output_token == pytest.approx(6.51 / 15)  # one GPU: the headline is its figure
    assert res.measured_energy_j == pytest.approx(14.0)
    assert res.j_per_output_token_per_phase == pytest.approx(
        {"session": 14.0 / 15, "steps": 6.51 / 15, "prefill": 2.2 / 15, "decode": 4.0 / 15})

    pp = res.per_phase
    assert pp["prefill"][key].energy_j == pytest.approx(2.2)
    assert pp["prefill"][key].windows == 2
    assert pp["prefill"][key].j_per_input_token == pytest.approx(2.2 / 32)
    assert pp["decode"][key].energy_j == pytest.approx(4.0)
    assert pp["decode"][key].j_per_output_token == pytest.approx(4.0 / 15)
    assert pp["decode"][key].duration_s == pytest.approx(0.5)
    assert pp["decode"][key].power_w == pytest.approx(8.0)
    assert pp["step:2"][key].output_tokens == 7
    assert pp["step:2"][key].j_per_output_token == pytest.approx(3.36 / 7)
    assert pp["stage:post"][key].energy_j == pytest.approx(0.5)
    assert "step:0" not in pp  # warm-up: counted, not summarized
    assert res.warmup_windows == 3


def test_nested_windows_add_up() -> None:
    col, session, _ = _run()
    res = build_result(col, session)
    w = {(x.window, x.step_index): x.energy_j for x in res.windows}
    steps = w[("step:0", 0)] + w[("step:1", 1)] + w[("step:2", 2)]
    gaps = 1.0 + 0.95 + 0.85 + 0.64 + 0.5  # counter moves between the steps, the stage and the edges
    assert steps + w[("stage:post", None)] + gaps == pytest.approx(w[("session", None)])
    for i in (0, 1, 2):
        inner = w[("prefill", i)] + w[("decode", i)]
        assert inner <= w[(f"step:{i}", i)]
    # prefill and decode share their edge: step 1 = 0.1 (open edges) + 1.0 + 2.0 + 0.05 (close edges)
    assert w[("step:1", 1)] == pytest.approx(0.1 + w[("prefill", 1)] + w[("decode", 1)] + 0.05)


def test_missing_reading_makes_the_phase_missing_not_zero() -> None:
    reader = FakeNvmlReader(energy_mj=[[0, 100, 200]])
    col = EnergyCollector(EnergyConfig(sources=["nvml"], codecarbon={"enabled": False}), nvml_reader=reader)
    col.meter = EnergyMeter(col._open_sources())
    reader.total_energy_mj = lambda i: (_ for _ in ()).throw(RuntimeError("GPU lost"))  # type: ignore[method-assign]
    session = SimpleNamespace(measured_steps=[])
    w = Window(name="session", kind="session", start_ns=0)
    col.perfsdk_window_open(session, w)
    w.end_ns = 10**9
    col.perfsdk_window_close(session, w)
    res = build_result(col, session)
    assert res.windows[0].energy_j is None and res.energy_j == {"nvml:gpu:0": None}
    assert res.j_per_output_token_by_source == {} and res.j_per_output_token is None


def test_only_slow_sources_are_read_off_the_timed_step() -> None:
    from concurrent.futures import Future

    from perfsdk.energy.base import Channel, EnergySource
    from perfsdk.energy.nvml import NvmlSource

    class Fast(EnergySource):  # like RAPL's sysfs files: microseconds a read
        name = "fast"

        def open(self) -> tuple[bool, str]:
            self.channels = [Channel(source="fast", scope="package", device="0", method="counter")]
            self.available = True
            return True, "ok"

        def read_counters(self) -> dict[Channel, int]:
            return {self.channels[0]: 5}

    fast = Fast()
    fast.open()
    inline = EnergyMeter([fast])
    assert inline.edge(10, defer=True) == {fast.channels[0]: 5}  # read in place, no helper thread
    slow = NvmlSource(FakeNvmlReader(energy_mj=[[0, 7]]))
    slow.open()
    helper = EnergyMeter([slow])
    f = helper.edge(10, defer=True)
    assert isinstance(f, Future) and list(f.result().values()) == [7]
    helper.close_all()

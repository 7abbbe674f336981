"""RAPL through a fake powercap tree: summing, nesting, wraparound, failed reads, permissions."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfsdk.energy.fake import make_powercap_tree, set_energy_uj
from perfsdk.energy.rapl import RaplSource, zone_delta_uj
from perfsdk.energy.windows import EnergyMeter

RANGE = 1_000_000  # wraparound range of every fake zone, in µJ


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_powercap_tree(tmp_path, {
        "intel-rapl:0": ("package-0", 100_000, RANGE),
        "intel-rapl:0:0": ("core", 50_000, RANGE),
        "intel-rapl:0:1": ("uncore", 10_000, RANGE),
        "intel-rapl:0:2": ("dram", 7_000, RANGE),
        "intel-rapl:1": ("package-1", 990_000, RANGE),
        "intel-rapl:1:0": ("core", 1_000, RANGE),
        "intel-rapl:1:1": ("dram", 3_000, RANGE),
    })


def _by_scope(src: RaplSource) -> dict[str, object]:
    return {c.scope: c for c in src.channels}


def test_packages_summed_dram_separate_nested_never_reported(tree: Path) -> None:
    src = RaplSource(str(tree))
    ok, reason = src.open()
    assert ok, reason
    ch = _by_scope(src)
    assert sorted(ch) == ["dram", "package"]  # core/uncore live inside the packages
    assert ch["package"].device == "0,1" and ch["package"].device_name == "package-0+package-1"
    assert ch["dram"].device == "0:2,1:1"
    assert all(c.method == "counter" for c in src.channels)
    assert len(src.skipped) == 3  # two core zones and one uncore zone


def test_window_delta_with_wraparound_mid_window(tree: Path) -> None:
    src = RaplSource(str(tree))
    src.open()
    meter = EnergyMeter([src])
    meter.open(1, "session", 0)
    # package-0 +200_000 µJ; package-1 wraps 990_000 -> 5_000 (+15_000 µJ); core moves (ignored)
    set_energy_uj(tree, "intel-rapl:0", 300_000)
    set_energy_uj(tree, "intel-rapl:1", 5_000)
    set_energy_uj(tree, "intel-rapl:0:0", 900_000)
    set_energy_uj(tree, "intel-rapl:0:2", 9_500)
    set_energy_uj(tree, "intel-rapl:1:1", 4_000)
    rows = {w.channel.scope: w for w in meter.close(1, 2_000_000_000)}
    assert rows["package"].energy_j == pytest.approx((200_000 + 15_000) / 1e6)
    assert rows["dram"].energy_j == pytest.approx((2_500 + 1_000) / 1e6)
    assert rows["package"].power_w == pytest.approx(0.215 / 2.0)
    assert rows["package"].duration_s == 2.0


def test_zone_delta_arithmetic() -> None:
    assert zone_delta_uj(10, 25, RANGE) == 15
    assert zone_delta_uj(999_990, 10, RANGE) == 20
    assert zone_delta_uj(999_990, 10, None) is None  # went backwards, range unknown
    assert zone_delta_uj(None, 10, RANGE) is None


def test_failed_read_is_missing_not_zero(tree: Path) -> None:
    fail = {"on": False}

    def read_text(p: Path) -> str:
        if fail["on"] and p.parent.name == "intel-rapl:1" and p.name == "energy_uj":
            raise OSError(5, "Input/output error")
        return p.read_text()

    src = RaplSource(str(tree), read_text)
    assert src.open()[0]
    meter = EnergyMeter([src])
    meter.open(1, "step:0", 0)
    fail["on"] = True
    set_energy_uj(tree, "intel-rapl:0:2", 8_000)
    rows = {w.channel.scope: w for w in meter.close(1, 1_000_000)}
    assert rows["package"].energy_j is None  # one socket missing: the sum is missing
    assert rows["package"].power_w is None
    assert rows["dram"].energy_j == pytest.approx(0.001)


def test_root_only_counters_report_the_fix(tree: Path) -> None:
    def read_text(p: Path) -> str:
        if p.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(p))
        return p.read_text()

    src = RaplSource(str(tree), read_text)
    ok, reason = src.open()
    assert not ok and src.channels == []
    assert "root only" in reason
    assert f"sudo chmod o+r {tree}/intel-rapl:*/energy_uj" in reason


def test_partly_root_only_keeps_readable_zones(tree: Path) -> None:
    def read_text(p: Path) -> str:
        if p.name == "energy_uj" and p.parent.name in ("intel-rapl:0:2", "intel-rapl:1:1"):
            raise PermissionError(13, "Permission denied")
        return p.read_text()

    src = RaplSource(str(tree), read_text)
    ok, reason = src.open()
    assert ok
    assert [c.scope for c in src.channels] == ["package"]
    assert "root-only, left out: intel-rapl:0:2, intel-rapl:1:1" in reason


def test_absent_root_and_empty_root(tmp_path: Path) -> None:
    ok, reason = RaplSource(str(tmp_path / "nope")).open()
    assert not ok and "does not exist" in reason and "rapl_root" in reason
    ok, reason = RaplSource(str(tmp_path)).open()
    assert not ok and "no intel-rapl zones" in reason


def test_nested_layout_subzones_inside_package_folder(tmp_path: Path) -> None:
    make_powercap_tree(tmp_path, {"intel-rapl:0": ("package-0", 10, RANGE)})
    make_powercap_tree(tmp_path / "intel-rapl:0", {"intel-rapl:0:0": ("core", 1, RANGE),
                                                   "intel-rapl:0:1": ("dram", 2, RANGE)})
    src = RaplSource(str(tmp_path))
    assert src.open()[0]
    assert sorted(c.scope for c in src.channels) == ["dram", "package"]


# -- counters exact over any window: polling between edges, accumulation across wraps -----------


class FakeClock:
    """The source's read clock, moved by hand (nanoseconds)."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t

    def at(self, seconds: float) -> int:
        self.t = int(round(seconds * 1e9))
        return self.t


R30 = 30_000_000  # 30 J: at 10 W the counter wraps every 3 s


def _two_packages(tmp_path: Path) -> Path:
    return make_powercap_tree(tmp_path, {"intel-rapl:0": ("package-0", 0, R30), "intel-rapl:1": ("package-1", 0, R30)})


def _advance(tree: Path, t: float, w0: float = 10.0, w1: float = 5.0) -> None:
    """Counters of a 10 W and a 5 W package at time t, wrapped like the hardware does."""
    set_energy_uj(tree, "intel-rapl:0", int(round(w0 * t * 1e6)) % R30)
    set_energy_uj(tree, "intel-rapl:1", int(round(w1 * t * 1e6)) % R30)


def test_poll_interval_follows_range_and_max_power(tmp_path: Path) -> None:
    src = RaplSource(str(_two_packages(tmp_path)), max_power_w=20.0)
    assert src.open()[0]
    # 30 J at 20 W wraps in 1.5 s at the fastest; read twice per wrap
    assert src.poll_interval_s() == pytest.approx(0.75)
    src = RaplSource(str(tmp_path), max_power_w=1e9)
    src.open()
    assert src.poll_interval_s() == 0.001  # never faster than 1 ms
    assert RaplSource(str(tmp_path)).poll_interval_s() is None  # not opened: no zones, nothing to poll


def test_several_wraps_inside_one_window_are_exact(tmp_path: Path) -> None:
    tree = _two_packages(tmp_path)
    clock = FakeClock()
    src = RaplSource(str(tree), max_power_w=20.0, clock_ns=clock)
    assert src.open()[0]
    meter = EnergyMeter([src])
    meter.open(1, "session", clock.at(0.0))
    # 7 s: package-0 wraps twice (at 3 s and 6 s), package-1 once (at 6 s); polled every 0.5 s
    for k in range(1, 14):
        _advance(tree, k * 0.5)
        src.poll(clock.at(k * 0.5))
    _advance(tree, 7.0)
    (row,) = meter.close(1, clock.at(7.0))
    assert row.energy_j == pytest.approx((10 + 5) * 7.0)  # 105 J, not the 5.7 W x 7 s of one-wrap arithmetic
    assert row.power_w == pytest.approx(15.0)
    assert not row.low_confidence and row.note is None


def test_edges_too_far_apart_are_low_confidence_not_silently_short(tmp_path: Path) -> None:
    tree = _two_packages(tmp_path)
    clock = FakeClock()
    src = RaplSource(str(tree), max_power_w=20.0, clock_ns=clock)
    src.open()
    meter = EnergyMeter([src])
    meter.open(1, "session", clock.at(0.0))
    _advance(tree, 7.0)  # no poll in between: the wraps cannot be seen
    (row,) = meter.close(1, clock.at(7.0))
    assert row.energy_j is not None and row.energy_j < 105.0
    assert row.low_confidence and "short by whole counter ranges" in (row.note or "")


def test_wrap_exactly_at_a_window_edge(tmp_path: Path) -> None:
    tree = _two_packages(tmp_path)
    clock = FakeClock()
    src = RaplSource(str(tree), max_power_w=20.0, clock_ns=clock)
    src.open()
    meter = EnergyMeter([src])
    meter.open(1, "session", clock.at(0.0))
    for k in range(1, 6):
        _advance(tree, k * 0.5)
        src.poll(clock.at(k * 0.5))
    _advance(tree, 3.0)  # package-0 reads exactly 0 here: 30 J = one full range
    assert (tree / "intel-rapl:0" / "energy_uj").read_text().strip() == "0"
    t_edge = clock.at(3.0)
    meter.open(2, "step:0", t_edge)
    for k in range(7, 10):
        _advance(tree, k * 0.5)
        src.poll(clock.at(k * 0.5))
    _advance(tree, 5.0)
    (step,) = meter.close(2, clock.at(5.0))
    (session,) = meter.close(1, clock.at(5.0))
    assert step.energy_j == pytest.approx(15 * 2.0)
    assert session.energy_j == pytest.approx(15 * 5.0)
    assert not step.low_confidence and not session.low_confidence


def test_failed_read_in_the_middle_labels_the_window(tmp_path: Path) -> None:
    tree = _two_packages(tmp_path)
    clock = FakeClock()
    failing: set[float] = set()

    def read_text(p: Path) -> str:
        if p.name == "energy_uj" and p.parent.name == "intel-rapl:0" and clock.t / 1e9 in failing:
            raise OSError(5, "Input/output error")
        return p.read_text()

    src = RaplSource(str(tree), read_text, max_power_w=20.0, clock_ns=clock)
    src.open()
    meter = EnergyMeter([src])
    meter.open(1, "a", clock.at(0.0))
    failing.add(1.0)  # one poll fails; the next good read comes 1 s after the last: still within a wrap
    for k in range(1, 5):
        _advance(tree, k * 0.5)
        src.poll(clock.at(k * 0.5))
    (a,) = meter.close(1, clock.at(2.0))
    assert a.energy_j == pytest.approx(15 * 2.0)  # exact, yet labelled
    assert a.low_confidence and a.note is not None and "1 counter read(s) failed" in a.note
    assert "short" not in a.note

    meter.open(2, "b", clock.at(2.0))
    failing.update({2.5, 3.0, 3.5, 4.0})  # 2.5 s without a good read: longer than the 1.5 s wrap time
    for k in range(5, 11):
        _advance(tree, k * 0.5)
        src.poll(clock.at(k * 0.5))
    (b,) = meter.close(2, clock.at(5.0))
    assert b.low_confidence and "short by whole counter ranges" in (b.note or "")
    assert "4 failed read(s)" in (b.note or "")

    meter.open(3, "c", clock.at(5.0))  # reads are good again: the next window is clean
    for k in range(11, 13):
        _advance(tree, k * 0.5)
        src.poll(clock.at(k * 0.5))
    (c,) = meter.close(3, clock.at(6.0))
    assert c.energy_j == pytest.approx(15.0) and not c.low_confidence


def test_session_polls_counters_on_the_shared_sampler(tmp_path: Path) -> None:
    import perfsdk
    from perfsdk.collectors.energy import EnergyCollector, EnergyConfig

    _two_packages(tmp_path)
    energy = EnergyCollector(EnergyConfig(rapl_root=str(tmp_path), sources=["rapl"], codecarbon={"enabled": False},
                                          rapl_max_power_w=20.0))
    with perfsdk.session({"collectors": {"utilization": False, "memory": False}}, store=None,
                         collectors=[energy]) as s:
        stats = s.sampler.stats()
    assert stats["energy-counters"]["interval_s"] == pytest.approx(0.75)

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

"""Synthetic readings for tests: a scripted NVML reader and a fake powercap tree.

Both plug into the same seams the real readers use (``NvmlReader`` and the powercap root), so
tests of collectors and of third-party plugins can exercise energy accounting without a GPU
or RAPL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from perfsdk.energy.nvml import NVML_UPDATE_PERIOD_S


class FakeNvmlReader:
    """An :class:`~perfsdk.energy.nvml.NvmlReader` with scripted values.

    ``energy_mj[i]`` is a list of counter values returned one per call for GPU ``i`` (the last
    repeats), or ``None`` for a GPU without the counter. ``power_w[i]`` works the same way.
    ``update_period_s`` is how often the scripted counter is taken to refresh (NVML's usual
    period by default).
    """

    def __init__(self, names: Sequence[str] = ("Fake GPU",), energy_mj: Sequence[Iterable[int] | None] | None = None,
                 power_w: Sequence[Iterable[float]] | None = None, power_limit_w: float = 300.0,
                 utilization_pct: float = 50.0, memory_used_bytes: int = 1 << 30, sm_clock_mhz: float = 1500.0,
                 temperature_c: float = 60.0, update_period_s: float | None = None) -> None:
        n = len(names)
        self.update_period_s = NVML_UPDATE_PERIOD_S if update_period_s is None else update_period_s
        self.names = list(names)
        self._energy = [list(e) if e is not None else None for e in (energy_mj or [[0]] * n)]
        self._power = [list(p) for p in (power_w or [[100.0]] * n)]
        self._pos_e = [0] * n
        self._pos_p = [0] * n
        self.limit = power_limit_w
        self.util = utilization_pct
        self.mem = memory_used_bytes
        self.clock = sm_clock_mhz
        self.temp = temperature_c
        self.closed = False
        self.energy_calls = 0

    @staticmethod
    def _next(values: list, pos: list[int], i: int) -> object:
        v = values[min(pos[i], len(values) - 1)]
        pos[i] += 1
        return v

    def device_count(self) -> int:
        return len(self.names)

    def name(self, index: int) -> str:
        return self.names[index]

    def total_energy_mj(self, index: int) -> int | None:
        seq = self._energy[index]
        if seq is None:
            return None
        self.energy_calls += 1
        return int(self._next(seq, self._pos_e, index))  # type: ignore[call-overload]

    def power_w(self, index: int) -> float | None:
        return float(self._next(self._power[index], self._pos_p, index))  # type: ignore[arg-type]

    def power_limit_w(self, index: int) -> float | None:
        return self.limit

    def utilization_pct(self, index: int) -> float | None:
        return self.util

    def memory_used_bytes(self, index: int) -> int | None:
        return self.mem

    def sm_clock_mhz(self, index: int) -> float | None:
        return self.clock

    def temperature_c(self, index: int) -> float | None:
        return self.temp

    def close(self) -> None:
        self.closed = True


def make_powercap_tree(root: str | Path, zones: dict[str, tuple[str, int, int | None]]) -> Path:
    """Write a flat powercap tree: ``{"intel-rapl:0": ("package-0", energy_uj, max_range_uj)}``."""
    root = Path(root)
    for zid, (name, energy, max_range) in zones.items():
        d = root / zid
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{energy}\n")
        if max_range is not None:
            (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    return root


def set_energy_uj(root: str | Path, zone: str, energy_uj: int) -> None:
    """Overwrite one zone's counter in a fake tree."""
    (Path(root) / zone / "energy_uj").write_text(f"{energy_uj}\n")

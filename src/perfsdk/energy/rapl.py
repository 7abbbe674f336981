"""RAPL energy counters through the Linux powercap interface.

Layout (``/sys/class/powercap`` by default; containers may mount it elsewhere)::

    intel-rapl:0/            name = package-0, energy_uj, max_energy_range_uj
    intel-rapl:0:0/          name = core     (inside package-0: never added to it)
    intel-rapl:0:1/          name = uncore   (inside package-0)
    intel-rapl:0:2/          name = dram     (its own domain, reported separately)
    intel-rapl:1/            name = package-1

Packages are summed across sockets into one ``package`` channel, DRAM zones into one ``dram``
channel, ``psys`` (whole platform, overlaps the packages) is its own channel. ``core`` and
``uncore`` live inside their package and are not reported, so nothing nested is ever summed.
Counters wrap at ``max_energy_range_uj``; a delta is taken modulo that range. Since 2020 most
kernels make ``energy_uj`` readable by root only; that is reported with the fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfsdk.energy.base import Channel, EnergySource

DEFAULT_ROOT = "/sys/class/powercap"
#: RAPL counters refresh about every millisecond.
RAPL_UPDATE_PERIOD_S = 0.001

_TOP = re.compile(r"^intel-rapl:(\d+)$")
_SUB = re.compile(r"^intel-rapl:(\d+):(\d+)$")
#: Zones nested inside a package (their energy is part of the package's).
NESTED_SCOPES = frozenset({"core", "uncore"})


def permission_fix(root: str) -> str:
    """The shell command that makes the counters readable for non-root users."""
    return f"sudo chmod o+r {root}/intel-rapl:*/energy_uj {root}/intel-rapl:*:*/energy_uj (or run as root)"


def _scope_of(name: str) -> str:
    if name.startswith("package"):
        return "package"
    return name.strip()


class RaplZone:
    """One powercap zone: its folder, name, scope and wraparound range."""

    def __init__(self, path: Path, name: str, max_range_uj: int | None) -> None:
        self.path = path
        self.name = name
        self.scope = _scope_of(name)
        self.max_range_uj = max_range_uj

    def __repr__(self) -> str:
        return f"RaplZone({self.path.name}, {self.name})"


class RaplSource(EnergySource):
    """Reads RAPL ``energy_uj`` counters under ``root``.

    ``read_text`` is the reading seam (``Path.read_text`` by default); tests pass a function
    that raises ``PermissionError`` or ``OSError`` for chosen files.
    """

    name = "rapl"

    def __init__(self, root: str = DEFAULT_ROOT, read_text: Callable[[Path], str] | None = None) -> None:
        super().__init__()
        self.root = root
        self._read_text = read_text or (lambda p: p.read_text())
        self.zones: dict[str, list[RaplZone]] = {}
        self.skipped: list[str] = []

    # -- discovery ------------------------------------------------------------------------

    def discover(self) -> list[RaplZone]:
        """All RAPL zones under the root (flat or nested layout), top-level first."""
        root = Path(self.root)
        found: dict[str, Path] = {}
        if not root.is_dir():
            return []
        for entry in sorted(root.iterdir()):
            if _TOP.match(entry.name) or _SUB.match(entry.name):
                found.setdefault(entry.name, entry)
            if _TOP.match(entry.name) and entry.is_dir():
                for sub in sorted(entry.iterdir()):
                    if _SUB.match(sub.name):
                        found.setdefault(sub.name, sub)
        zones = []
        for zid in sorted(found, key=lambda z: [int(x) for x in z.split(":")[1:]]):
            path = found[zid]
            try:
                name = self._read_text(path / "name").strip()
            except OSError:
                name = zid
            try:
                max_range: int | None = int(self._read_text(path / "max_energy_range_uj").strip())
            except (OSError, ValueError):
                max_range = None
            zones.append(RaplZone(path, name, max_range))
        return zones

    def open(self) -> tuple[bool, str]:
        """Find the zones and check that their counters can be read."""
        root = Path(self.root)
        if not root.exists():
            return self._fail(f"{self.root} does not exist: no powercap interface (not Linux, a VM or container "
                              "without it, or the intel_rapl driver is not loaded); set collectors.energy.rapl_root "
                              "if it is mounted elsewhere")
        zones = self.discover()
        if not zones:
            return self._fail(f"no intel-rapl zones under {self.root} (the CPU or kernel does not expose RAPL)")
        by_scope: dict[str, list[RaplZone]] = {}
        denied: list[str] = []
        for z in zones:
            if z.scope in NESTED_SCOPES:
                self.skipped.append(f"{z.path.name} ({z.name}): inside its package, not summed")
                continue
            try:
                int(self._read_text(z.path / "energy_uj").strip())
            except PermissionError:
                denied.append(z.path.name)
                continue
            except (OSError, ValueError) as exc:
                self.skipped.append(f"{z.path.name} ({z.name}): unreadable ({exc})")
                continue
            by_scope.setdefault(z.scope, []).append(z)
        if denied and not by_scope:
            return self._fail(f"RAPL counters under {self.root} are readable by root only ({', '.join(denied)}); "
                              f"fix: {permission_fix(self.root)}")
        if not by_scope:
            return self._fail(f"no readable RAPL counters under {self.root}: " + "; ".join(self.skipped))
        self.zones = by_scope
        self.channels = [
            Channel(source="rapl", scope=scope, device=",".join(z.path.name.split(":", 1)[1] for z in zs),
                    method="counter", device_name="+".join(z.name for z in zs), update_period_s=RAPL_UPDATE_PERIOD_S)
            for scope, zs in by_scope.items()
        ]
        parts = [f"{c.scope}: {c.device_name}" for c in self.channels]
        if denied:
            parts.append(f"root-only, left out: {', '.join(denied)} (fix: {permission_fix(self.root)})")
        self.available, self.reason = True, "; ".join(parts)
        return True, self.reason

    def _fail(self, reason: str) -> tuple[bool, str]:
        self.available, self.reason, self.channels = False, reason, []
        return False, reason

    # -- reading --------------------------------------------------------------------------

    def _read_zone(self, z: RaplZone) -> int | None:
        try:
            return int(self._read_text(z.path / "energy_uj").strip())
        except (OSError, ValueError):
            return None

    def read_counters(self) -> dict[Channel, Any]:
        """Per channel, the raw ``energy_uj`` of each of its zones (``None`` where a read failed)."""
        return {c: [self._read_zone(z) for z in self.zones[c.scope]] for c in self.channels}

    def delta_j(self, channel: Channel, start: Any, end: Any) -> float | None:
        """Sum over the channel's zones of (end − start) modulo each zone's range, in joules."""
        if start is None or end is None:
            return None
        total_uj = 0
        for z, a, b in zip(self.zones[channel.scope], start, end):
            d = zone_delta_uj(a, b, z.max_range_uj)
            if d is None:
                return None
            total_uj += d
        return total_uj / 1e6


def zone_delta_uj(start: int | None, end: int | None, max_range_uj: int | None) -> int | None:
    """Microjoules between two readings of one counter, allowing one wraparound.

    ``None`` when either reading is missing, or when the counter went backwards and the range
    is unknown.
    """
    if start is None or end is None:
        return None
    if end >= start:
        return end - start
    if not max_range_uj:
        return None
    return end + max_range_uj - start

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
Since 2020 most kernels make ``energy_uj`` readable by root only; that is reported with the fix.

Wraparound. Each counter wraps at ``max_energy_range_uj`` (about 262 kJ on recent CPUs: 20 to
60 minutes under load). A difference modulo the range is exact only if the counter wrapped at
most once between two reads, so the source keeps, per zone, a monotonic total: every read adds
the difference to the previous read, modulo the range. The shared sampler reads every zone at
least twice per the shortest time a wrap can take (``max_energy_range_uj`` at
``max_power_w``, a generous bound of what one zone can draw), so no wrap goes unseen, and a
window of any length reads the exact energy across any number of wraps. A read that fails is
counted; a window with a failed read inside it is low-confidence, and says whether the good
reads around the failure were close enough together to see every wrap.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsdk.energy.base import Channel, EnergySource

DEFAULT_ROOT = "/sys/class/powercap"
#: RAPL counters refresh about every millisecond.
RAPL_UPDATE_PERIOD_S = 0.001
#: A generous upper bound of the power one zone can draw; the polling period follows from it.
RAPL_MAX_POWER_W = 1000.0
#: Reads per shortest wrap time (2: a read may come late by up to half a wrap and still see it).
READS_PER_WRAP = 2
#: The sampler never polls faster than this, whatever the range.
MIN_POLL_INTERVAL_S = 0.001

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

    def wrap_s(self, max_power_w: float) -> float | None:
        """The shortest time this counter can take to wrap (at ``max_power_w``)."""
        if not self.max_range_uj:
            return None
        return self.max_range_uj / (max_power_w * 1e6)

    def __repr__(self) -> str:
        return f"RaplZone({self.path.name}, {self.name})"


@dataclass(frozen=True)
class ZoneTotal:
    """A zone's monotonic energy at one read, and the read failures so far."""

    total_uj: int
    failed_reads: int
    unseen_wraps: int  # gaps between good reads long enough to hide a wrap


class _ZoneAccumulator:
    """Monotonic energy of one zone from successive raw reads (each allowed one wrap)."""

    def __init__(self, zone: RaplZone, max_power_w: float) -> None:
        self.zone = zone
        wrap = zone.wrap_s(max_power_w)
        self.wrap_ns = int(wrap * 1e9) if wrap is not None else None
        self.last_raw: int | None = None
        self.last_ns: int | None = None
        self.total_uj = 0
        self.failed_reads = 0
        self.unseen_wraps = 0

    def add(self, raw: int | None, t_ns: int) -> ZoneTotal | None:
        if raw is None:
            self.failed_reads += 1
            return None
        if self.last_raw is not None and self.last_ns is not None:
            if self.wrap_ns is not None and t_ns - self.last_ns >= self.wrap_ns:
                self.unseen_wraps += 1
            d = zone_delta_uj(self.last_raw, raw, self.zone.max_range_uj)
            if d is None:  # went backwards with no known range: the difference is lost
                self.unseen_wraps += 1
            else:
                self.total_uj += d
        self.last_raw, self.last_ns = raw, t_ns
        return ZoneTotal(self.total_uj, self.failed_reads, self.unseen_wraps)


class RaplSource(EnergySource):
    """Reads RAPL ``energy_uj`` counters under ``root``, accumulating each zone across wraps.

    ``read_text`` is the reading seam (``Path.read_text`` by default); tests pass a function
    that raises ``PermissionError`` or ``OSError`` for chosen files. ``clock_ns`` (the session
    clock, ``time.perf_counter_ns``) times the reads, to tell gaps long enough to hide a wrap.
    """

    name = "rapl"

    def __init__(self, root: str = DEFAULT_ROOT, read_text: Callable[[Path], str] | None = None,
                 max_power_w: float = RAPL_MAX_POWER_W, clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        super().__init__()
        self.root = root
        self._read_text = read_text or (lambda p: p.read_text())
        self.max_power_w = max_power_w
        self._clock_ns = clock_ns
        self.zones: dict[str, list[RaplZone]] = {}
        self.skipped: list[str] = []
        self._acc: dict[Path, _ZoneAccumulator] = {}
        self._lock = threading.Lock()

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
        self._acc = {z.path: _ZoneAccumulator(z, self.max_power_w) for zs in by_scope.values() for z in zs}
        self.poll(self._clock_ns())  # the baseline of every total
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

    def _read_all(self, t_ns: int) -> dict[Channel, list[ZoneTotal | None]]:
        out: dict[Channel, list[ZoneTotal | None]] = {}
        with self._lock:  # the sampler thread and the window edges both read
            for c in self.channels:
                out[c] = [self._acc[z.path].add(self._read_zone(z), t_ns) for z in self.zones[c.scope]]
        return out

    def poll_interval_s(self) -> float | None:
        """Half the shortest time any zone can take to wrap at ``max_power_w`` (at least 1 ms)."""
        wraps = [w for zs in self.zones.values() for z in zs if (w := z.wrap_s(self.max_power_w)) is not None]
        if not wraps:
            return None
        return max(MIN_POLL_INTERVAL_S, min(wraps) / READS_PER_WRAP)

    def poll(self, t_ns: int) -> None:
        """Read every zone once (the sampler probe), so that each wrap is seen."""
        self._read_all(self._clock_ns())

    def read_counters(self) -> dict[Channel, Any]:
        """Per channel, each zone's :class:`ZoneTotal` at this read (``None`` where it failed)."""
        return self._read_all(self._clock_ns())

    def delta_j(self, channel: Channel, start: Any, end: Any) -> float | None:
        """Joules between two reads: the growth of the zones' monotonic totals, summed."""
        if start is None or end is None or any(x is None for x in (*start, *end)):
            return None
        return sum(b.total_uj - a.total_uj for a, b in zip(start, end)) / 1e6

    def window_note(self, channel: Channel, start: Any, end: Any) -> str | None:
        """Why the window is low-confidence: reads that failed, or a gap long enough for a wrap."""
        if start is None or end is None or any(x is None for x in (*start, *end)):
            return None
        failed = sum(b.failed_reads - a.failed_reads for a, b in zip(start, end))
        unseen = sum(b.unseen_wraps - a.unseen_wraps for a, b in zip(start, end))
        if unseen:
            return (f"{unseen} gap(s) between counter reads as long as a counter wrap can take "
                    f"(at {self.max_power_w:g} W)" + (f", {failed} failed read(s)" if failed else "")
                    + ": the energy may be short by whole counter ranges")
        if failed:
            return (f"{failed} counter read(s) failed inside the window; the reads around them were close "
                    "enough to see every wrap")
        return None


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

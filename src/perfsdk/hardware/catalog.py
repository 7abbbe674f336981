"""The hardware catalogue: built-in profiles, user files and plugin-registered profiles.

Resolution order for a name: profiles from files the user passed (``--hardware-file``) win over
plugin-registered ones, which win over the built-ins in ``hardware/profiles/*.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from perfsdk.hardware.profile import HardwareProfile, HardwareProfileError, load_profile_file, parse_profile

log = structlog.get_logger("perfsdk.hardware")

BUILTIN_DIR = Path(__file__).parent / "profiles"


def builtin_profiles() -> dict[str, HardwareProfile]:
    """Every profile shipped with perfsdk, by name."""
    out: dict[str, HardwareProfile] = {}
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        for prof in load_profile_file(path):
            out[prof.name] = prof
    return out


def _coerce(obj: Any, origin: str) -> list[HardwareProfile]:
    """A plugin may register a HardwareProfile, a dict or a path to a YAML file."""
    if isinstance(obj, HardwareProfile):
        return [obj]
    if isinstance(obj, dict):
        return [parse_profile(obj, origin)]
    if isinstance(obj, (str, Path)):
        return load_profile_file(obj)
    raise HardwareProfileError(f"{origin}: cannot register {type(obj).__name__} as a hardware profile")


def plugin_profiles(pm: Any = None) -> tuple[dict[str, HardwareProfile], dict[str, str], list[str]]:
    """Profiles registered through ``perfsdk_register_hardware``.

    Returns (profiles by name, plugin name by profile name, errors). A broken plugin profile is
    reported, never fatal.
    """
    from perfsdk.plugins import collect_hardware, get_plugin_manager

    if pm is None:
        pm = get_plugin_manager()
    profiles: dict[str, HardwareProfile] = {}
    owners: dict[str, str] = {}
    errors: list[str] = []
    for owner, obj in collect_hardware(pm):
        try:
            for prof in _coerce(obj, f"plugin {owner}"):
                profiles[prof.name] = prof
                owners[prof.name] = owner
        except HardwareProfileError as err:
            log.warning("invalid plugin hardware profile", plugin=owner, error=str(err))
            errors.append(str(err))
    return profiles, owners, errors


@dataclass
class Catalog:
    """All known profiles and where each came from (``builtin``, ``plugin:<name>`` or a path)."""

    profiles: dict[str, HardwareProfile] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, files: Iterable[str | Path] = (), *, plugins: bool = True, pm: Any = None) -> Catalog:
        """Built-ins, then plugin profiles, then ``files`` (later sources override earlier)."""
        cat = cls()
        for name, prof in builtin_profiles().items():
            cat.add(prof, "builtin")
        if plugins:
            try:
                profs, owners, errors = plugin_profiles(pm)
            except Exception as exc:  # plugin discovery must not break the built-in catalogue
                log.warning("could not collect plugin hardware", error=repr(exc))
                profs, owners, errors = {}, {}, [repr(exc)]
            for name, prof in profs.items():
                cat.add(prof, f"plugin:{owners[name]}")
            cat.errors.extend(errors)
        for f in files:
            for prof in load_profile_file(f):
                cat.add(prof, str(f))
        return cat

    def add(self, profile: HardwareProfile, origin: str) -> None:
        self.profiles[profile.name] = profile
        self.origins[profile.name] = origin

    def names(self) -> list[str]:
        return sorted(self.profiles)

    def get(self, name: str) -> HardwareProfile:
        """The profile called ``name``; an unknown name lists the known ones."""
        try:
            return self.profiles[name]
        except KeyError:
            from perfsdk.suggest import did_you_mean

            raise HardwareProfileError(
                f"unknown hardware profile {name!r}{did_you_mean(name, self.names())} "
                f"(available: {', '.join(self.names())})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.profiles


def get_profile(name_or_path: str, files: Iterable[str | Path] = ()) -> HardwareProfile:
    """A profile by catalogue name, or the (single) profile in a YAML file path."""
    p = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) and p.is_file():
        profs = load_profile_file(p)
        if len(profs) != 1:
            raise HardwareProfileError(f"{p}: holds {len(profs)} profiles; name one of them")
        return profs[0]
    return Catalog.load(files).get(name_or_path)

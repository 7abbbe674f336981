"""The hardware catalogue: built-in profiles, user files and plugin-registered profiles.

Resolution order for a name: profiles from files the user passed (``--hardware-file``) win over
plugin-registered ones, which win over the built-ins in ``hardware/profiles/*.yaml``. Names are
looked up ignoring case and with ``_`` read as ``-`` (``PIM_AI_1chip`` finds ``pim-ai-1chip``),
as device-keyed hardware files name their devices.

Plugin profiles come from a plugin manager's ``perfsdk_register_hardware`` hook. Pass the one
already built (a session's ``session.pm``, which also holds the plugins given to
``perfsdk.session(plugins=[...])``) so that entry points are not loaded a second time; without
one, the process-wide manager of :func:`perfsdk.plugins.shared_plugin_manager` is used.
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
    from perfsdk.plugins import collect_hardware, shared_plugin_manager

    if pm is None:
        pm = shared_plugin_manager()
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
            cat.add_file(f)
        return cat

    def add(self, profile: HardwareProfile, origin: str) -> None:
        self.profiles[profile.name] = profile
        self.origins[profile.name] = origin

    def add_file(self, path: str | Path) -> list[HardwareProfile]:
        """Add every profile of a YAML file (any supported format); returns them."""
        profs = load_profile_file(path)
        for prof in profs:
            self.add(prof, str(path))
        return profs

    def names(self) -> list[str]:
        return sorted(self.profiles)

    def key(self, name: str) -> str | None:
        """The catalogue name ``name`` refers to (exact, else ignoring case and ``_``/``-``)."""
        if name in self.profiles:
            return name
        norm = normalize_name(name)
        return norm if norm in self.profiles else None

    def get(self, name: str) -> HardwareProfile:
        """The profile called ``name``; an unknown name lists the known ones."""
        key = self.key(name)
        if key is None:
            from perfsdk.suggest import did_you_mean

            raise HardwareProfileError(
                f"unknown hardware profile {name!r}{did_you_mean(name, self.names())} "
                f"(available: {', '.join(self.names())})"
            )
        return self.profiles[key]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.key(name) is not None


def normalize_name(name: str) -> str:
    """How names are compared: lower case, ``_`` as ``-``."""
    return name.strip().lower().replace("_", "-")


#: Catalogue profiles of GPUs, by a part of the name CUDA reports (most specific first).
GPU_PROFILES_BY_NAME = (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                        ("a100", "a100-80gb-sxm"), ("l4", "l4"))


def profile_for_gpu_name(name: str) -> str | None:
    """The catalogue profile of a GPU by the name CUDA or NVML reports (``NVIDIA H200``), or ``None``."""
    low = name.lower()
    return next((prof for key, prof in GPU_PROFILES_BY_NAME if key in low), None)


def profile_for_device(device: Any) -> str | None:
    """The catalogue profile of the CUDA device ``device`` (by the name CUDA reports), or ``None``
    when it is not a CUDA device or no profile matches its name."""
    if device is None or getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return None
    try:
        import torch

        name = torch.cuda.get_device_name(device)
    except Exception:
        return None
    return profile_for_gpu_name(name)


def is_profile_path(value: str) -> bool:
    """Whether a ``--hardware`` / ``targets`` value names a YAML file rather than a profile."""
    return value.endswith((".yaml", ".yml"))


def get_profile(name_or_path: str, files: Iterable[str | Path] = (), *, pm: Any = None,
                catalog: Catalog | None = None) -> HardwareProfile:
    """A profile by catalogue name, or the (single) profile in a YAML file path.

    A file with several devices is an error that lists them (pick one by name, with the file
    given as an extra hardware file). ``catalog`` (or one loaded from ``files`` and ``pm``) is
    where names are looked up; the profile of a file is added to it.
    """
    if is_profile_path(name_or_path):
        profs = load_profile_file(name_or_path)
        if len(profs) != 1:
            raise HardwareProfileError(
                f"{name_or_path}: holds {len(profs)} devices ({', '.join(p.name for p in profs)}); "
                f"name one of them and pass the file as an extra hardware file (--hardware NAME "
                f"--hardware-file {name_or_path})")
        if catalog is not None:
            catalog.add(profs[0], name_or_path)
        return profs[0]
    return (catalog if catalog is not None else Catalog.load(files, pm=pm)).get(name_or_path)

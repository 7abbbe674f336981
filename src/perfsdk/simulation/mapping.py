"""Mapping: which device runs which module, and where data comes back through the host.

A mapping (YAML file, or the ``mapping`` section of the simulation collector's config)::

    default: gpu                      # device for unmapped modules (else the --hardware profile)
    devices: {gpu: h100-sxm, pim0: pim-ai-dimm, pim1: pim-ai-dimm}
    layers:
      - {match: "model.layers.*.mlp.experts.*", device: pim0, transfer: m}
      - {match: "model.layers.*.mlp.*", device: pim1, transfer: t}

Rules are tried in order; the first whose ``match`` (a module path or a glob, ``*`` spans dots)
fits wins. Transfer points:

- ``t``: the op's input comes from the host and its output goes back to the host; both
  directions cost the device's host-link bandwidth and pJ/bit, on every execution.
- ``m``: the input is shared by a group (e.g. MoE experts) and sent once per group per
  forward pass; each member's output still goes back. The group is ``group`` or the rule's match.

Devices of the same profile are separate instances (own memory capacity, own static power).
Without a transfer point, moving data between devices is assumed hidden behind compute.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from perfsdk.hardware.profile import HardwareProfileError, format_validation_error


class MappingError(ValueError):
    """An invalid mapping; the message names the file and field path."""


class LayerRule(BaseModel):
    """Modules matching ``match`` run on ``device``, with an optional transfer point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str = Field(min_length=1, description="Module path or glob, e.g. model.layers.*.mlp.*")
    device: str = Field(min_length=1, description="A device name from `devices` (or a profile name)")
    transfer: Literal["t", "m"] | None = Field(default=None, description="Transfer point: t or m")
    group: str | None = Field(default=None, description="Group of an `m` transfer point (default: the match)")

    def matches(self, module_path: str) -> bool:
        return module_path == self.match or fnmatch.fnmatchcase(module_path, self.match)


class Mapping(BaseModel):
    """Device instances and layer-to-device rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: dict[str, str] = Field(default_factory=dict, description="Device name -> profile name")
    default: str | None = Field(default=None, description="Device for unmapped modules")
    layers: list[LayerRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Mapping:
        if self.default is not None and self.default not in self.devices:
            raise ValueError(f"default: device {self.default!r} is not in devices")
        return self

    def resolve(self, module_path: str) -> tuple[str | None, LayerRule | None]:
        """(device name or ``None`` for the default, the rule that matched)."""
        for rule in self.layers:
            if rule.matches(module_path):
                return rule.device, rule
        return None, None


def parse_mapping(data: Any, origin: str = "mapping") -> Mapping:
    """Validate a mapping dict (``mapping:`` wrapper allowed); errors name the field path."""
    if isinstance(data, Mapping):
        return data
    if isinstance(data, dict) and set(data) == {"mapping"}:
        data = data["mapping"]
    if not isinstance(data, dict):
        raise MappingError(f"{origin}: expected a mapping, got {type(data).__name__}")
    try:
        return Mapping.model_validate(data)
    except ValidationError as err:
        raise MappingError(format_validation_error(err, origin).replace("hardware profile", "mapping")) from None


def load_mapping(path: str | Path) -> Mapping:
    """Read a mapping YAML file."""
    p = Path(path)
    if not p.is_file():
        raise MappingError(f"{p}: mapping file not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise MappingError(f"{p}: not valid YAML: {err}") from None
    return parse_mapping(data, str(p))


def mapping_from(value: Any) -> Mapping | None:
    """A mapping from ``None``, a path, a dict or a :class:`Mapping`."""
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        return load_mapping(value)
    return parse_mapping(value)


__all__ = ["LayerRule", "Mapping", "MappingError", "HardwareProfileError", "load_mapping", "mapping_from",
           "parse_mapping"]

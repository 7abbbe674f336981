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
A rule may also name a hardware profile directly (``device: PIM-AI-1chip``): one instance of it.
Profile names are compared ignoring case and with ``_`` read as ``-``.

The flat form of processing-in-memory simulators is accepted as well: layer name ->
``"device[,t|m]"``::

    linear1: PIM-AI-1chip,t
    linear2: PIM-AI-1chip,t

Each key is a module path or glob; a plain name without dots (``q_proj``) also matches that
name at any depth (``*.q_proj``), as those simulators name layers by their attribute name. Rules
with ``m`` that share a parent (``experts.0``, ``experts.1``) form one group.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal

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


_FIELDS = {"devices", "default", "layers"}


def is_flat_mapping(data: Any) -> bool:
    """Whether ``data`` is the flat ``layer: "device[,option]"`` form."""
    return (isinstance(data, dict) and bool(data) and not (set(data) & _FIELDS)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()))


def parse_flat_mapping(data: dict[str, str], origin: str = "mapping") -> Mapping:
    """Rules from the flat ``layer: "device[,t|m]"`` form; errors name the layer."""
    rules: list[dict[str, Any]] = []
    for key, value in data.items():
        parts = [p.strip() for p in value.split(",")]
        device, options = parts[0], [p for p in parts[1:] if p]
        if not key.strip() or not device:
            raise MappingError(f"{origin}: {key}: expected 'device' or 'device,t' or 'device,m', got {value!r}")
        bad = [o for o in options if o not in ("t", "m")]
        if bad or len(options) > 1:
            raise MappingError(f"{origin}: {key}: unknown option {','.join(bad or options)!r} "
                               f"(options: t = transfer point, m = shared-input transfer point; one of them)")
        transfer = options[0] if options else None
        group = key.rsplit(".", 1)[0] if transfer == "m" and "." in key else None
        matches = [key] if ("." in key or any(c in key for c in "*?[")) else [key, f"*.{key}"]
        for match in matches:
            rules.append({"match": match, "device": device, "transfer": transfer,
                          "group": group if group is not None else (key if transfer == "m" else None)})
    return parse_mapping({"layers": rules}, origin)


def parse_mapping(data: Any, origin: str = "mapping") -> Mapping:
    """Validate a mapping dict (``mapping:`` wrapper allowed); errors name the field path."""
    if isinstance(data, Mapping):
        return data
    if isinstance(data, dict) and set(data) == {"mapping"}:
        data = data["mapping"]
    if not isinstance(data, dict):
        raise MappingError(f"{origin}: expected a mapping, got {type(data).__name__}")
    if is_flat_mapping(data):
        return parse_flat_mapping(data, origin)
    try:
        return Mapping.model_validate(data)
    except ValidationError as err:
        raise MappingError(format_validation_error(err, origin).replace("hardware profile", "mapping")) from None


def load_mapping(path: str | Path) -> Mapping:
    """Read a mapping YAML file."""
    from perfsdk.yamlio import read_yaml

    p = Path(path)
    return parse_mapping(read_yaml(p, what="mapping file", error=MappingError), str(p))


def mapping_from(value: Any) -> Mapping | None:
    """A mapping from ``None``, a path, a dict or a :class:`Mapping`."""
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        return load_mapping(value)
    return parse_mapping(value)


__all__ = ["LayerRule", "Mapping", "MappingError", "HardwareProfileError", "is_flat_mapping", "load_mapping",
           "mapping_from", "parse_flat_mapping", "parse_mapping"]

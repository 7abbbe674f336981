"""Device-keyed hardware files: the format of processing-in-memory simulators, loaded as it is.

Such a file maps device names to their figures::

    My_accelerator:
        host_to_device_bw_GBs: 22        # required
        host_to_device_pj_per_bit: 200
        device_to_host_bw_GBs: 88
        device_to_host_pj_per_bit: 50
        mem_bw_GBs: 6553.6
        mem_pj_per_bit: 0.95
        tflops: 320
        pj_per_tflop: 0.4e+12
        softmax_ns_per_element: 6.25e-03  # optional
        SiLU_ns_per_element: 9.375e-03
        RMSNorm_ns_per_element: 1.625e-02
    My_accelerator2: {...}

Each device becomes one :class:`~perfsdk.hardware.profile.HardwareProfile`. Underscores in the
device name become hyphens (``My_accelerator`` -> ``My-accelerator``); the profile's name is that,
lower-cased (``my-accelerator``), and catalogue look-ups ignore case, so a mapping may name the
device either way. The format gives one compute rate for every data type, so ``tflops`` becomes
the peak of every ``peak_tflops`` key; ``pj_per_tflop`` is divided by 10^12 into
``compute_pj_per_flop``.

Defaults for what the format leaves out (documented in ``docs/simulation.md``): no per-element
rate (softmax, SiLU, RMSNorm ops are then costed by the roofline like any other op), kind
``accelerator``, memory capacity not stated (the memory fit is not checked), no static power,
efficiency 1.0 (the device reaches its peak, as the format assumes), no per-op overhead. Those
perfsdk fields may also be given per device, next to the format's own keys.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfsdk.hardware.profile import DeviceKind, HardwareProfile, HardwareProfileError

#: The format's keys that map one to one: key in the file -> HardwareProfile field.
_RENAMES: dict[str, str] = {
    "host_to_device_bw_GBs": "host_to_device_gbs",
    "host_to_device_pj_per_bit": "host_to_device_pj_per_bit",
    "device_to_host_bw_GBs": "device_to_host_gbs",
    "device_to_host_pj_per_bit": "device_to_host_pj_per_bit",
    "mem_bw_GBs": "memory_bandwidth_gbs",
    "mem_pj_per_bit": "memory_pj_per_bit",
    "softmax_ns_per_element": "softmax_ns_per_element",
    "SiLU_ns_per_element": "activation_ns_per_element",
    "RMSNorm_ns_per_element": "norm_ns_per_element",
}

#: Peak-compute keys that receive the format's single ``tflops`` figure.
_ALL_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")

_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class DeviceEntry(BaseModel):
    """One device of a device-keyed file, with the format's own field names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host_to_device_bw_GBs: float = Field(gt=0, description="Host to device bandwidth, GB/s")
    host_to_device_pj_per_bit: float = Field(ge=0, description="Host to device energy, pJ/bit")
    device_to_host_bw_GBs: float = Field(gt=0, description="Device to host bandwidth, GB/s")
    device_to_host_pj_per_bit: float = Field(ge=0, description="Device to host energy, pJ/bit")
    mem_bw_GBs: float = Field(gt=0, description="Device memory bandwidth, GB/s")
    mem_pj_per_bit: float = Field(ge=0, description="Device memory energy, pJ/bit")
    tflops: float = Field(gt=0, description="Compute rate, TFLOPS (every data type)")
    pj_per_tflop: float = Field(ge=0, description="Compute energy, pJ per TFLOP (10^12 FLOPs)")
    softmax_ns_per_element: float | None = Field(default=None, ge=0)
    SiLU_ns_per_element: float | None = Field(default=None, ge=0)
    RMSNorm_ns_per_element: float | None = Field(default=None, ge=0)
    # perfsdk's own fields, optional here (the format does not have them)
    kind: DeviceKind = "accelerator"
    variant: str | None = Field(default=None, min_length=1)
    source: str | None = Field(default=None, min_length=1)
    description: str | None = None
    memory_capacity_gb: float | None = Field(default=None, gt=0)
    static_power_w: float = Field(default=0.0, ge=0)
    compute_efficiency: float = Field(default=1.0, gt=0, le=1)
    memory_efficiency: float = Field(default=1.0, gt=0, le=1)
    op_overhead_s: float = Field(default=0.0, ge=0)


def hyphenated(name: str) -> str:
    """The device's name as a mapping names it: underscores become hyphens."""
    return name.replace("_", "-")


def profile_name(name: str) -> str:
    """The catalogue name of a device: hyphenated and lower-cased."""
    return hyphenated(name).lower()


def is_device_file(data: Any) -> bool:
    """Whether parsed YAML looks like a device-keyed file (device name -> mapping of figures)
    rather than one perfsdk profile (which has ``name``) or a ``profiles:`` list."""
    if not isinstance(data, dict) or not data or "name" in data or "profiles" in data:
        return False
    return all(isinstance(k, str) and isinstance(v, dict) for k, v in data.items())


def _field_error(err: ValidationError, origin: str, device: str) -> HardwareProfileError:
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            msg = "unknown key (known: " + ", ".join(DeviceEntry.model_fields) + ")"
        elif e["type"] == "missing":
            msg = "field required"
        else:
            msg = e["msg"]
        parts.append(f"{field}: {msg}" if field else msg)
    return HardwareProfileError(f"{origin}: device {device}: " + "; ".join(parts))


def parse_device_file(data: dict[str, Any], origin: str = "<hardware file>") -> list[HardwareProfile]:
    """The profiles of a device-keyed file, in file order. Errors name the file, the device
    and the field."""
    out: list[HardwareProfile] = []
    seen: dict[str, str] = {}
    for raw_name, fields in data.items():
        if not _NAME_OK.match(raw_name):
            raise HardwareProfileError(
                f"{origin}: device {raw_name!r}: a device name uses letters, digits, '_', '-' and '.' only")
        shown = hyphenated(raw_name)
        name = profile_name(raw_name)
        if name in seen:
            raise HardwareProfileError(f"{origin}: device {raw_name}: same name as device {seen[name]} "
                                       f"(names are compared with '_' as '-' and ignoring case)")
        seen[name] = raw_name
        try:
            entry = DeviceEntry.model_validate(fields)
        except ValidationError as err:
            raise _field_error(err, origin, raw_name) from None
        values: dict[str, Any] = {new: getattr(entry, old) for old, new in _RENAMES.items()}
        values = {k: v for k, v in values.items() if v is not None}
        profile = {
            "name": name,
            "kind": entry.kind,
            "variant": entry.variant or f"{shown}, as described in {origin}",
            "source": entry.source or f"{origin} (device-keyed hardware file, device {raw_name})",
            "description": entry.description or "",
            "peak_tflops": {k: entry.tflops for k in _ALL_DTYPES},
            "compute_pj_per_flop": entry.pj_per_tflop / 1e12,
            "memory_capacity_gb": entry.memory_capacity_gb,
            "static_power_w": entry.static_power_w,
            "compute_efficiency": entry.compute_efficiency,
            "memory_efficiency": entry.memory_efficiency,
            "op_overhead_s": entry.op_overhead_s,
            **values,
        }
        try:
            out.append(HardwareProfile.model_validate(profile))
        except ValidationError as err:  # pragma: no cover - DeviceEntry already checked the figures
            raise _field_error(err, origin, raw_name) from None
    return out


__all__ = ["DeviceEntry", "hyphenated", "is_device_file", "parse_device_file", "profile_name"]

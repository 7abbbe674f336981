"""Energy sources (NVML, RAPL, CodeCarbon, estimated) and window accounting."""

from __future__ import annotations

from perfsdk.energy.base import Channel, EnergySource
from perfsdk.energy.nvml import NvmlReader, NvmlSource, open_nvml
from perfsdk.energy.rapl import RaplSource
from perfsdk.energy.windows import EnergyMeter, PowerTrace, WindowEnergy

__all__ = ["Channel", "EnergyMeter", "EnergySource", "NvmlReader", "NvmlSource", "PowerTrace", "RaplSource",
           "WindowEnergy", "open_nvml"]

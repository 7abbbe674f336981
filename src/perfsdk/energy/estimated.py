"""The opt-in ``estimated`` source: rated power × utilization, sampled and integrated.

It is never used silently: only ``collectors.energy.estimated: true`` turns it on, and every
value it gives is labeled ``method: estimated``. GPUs use NVML's enforced power limit as the
rating and NVML utilization; the CPU uses ``cpu_tdp_w`` (which must be set, since no portable
interface reports a CPU's TDP) times the system-wide busy fraction.
"""

from __future__ import annotations

from collections.abc import Callable

from perfsdk.energy.base import Channel, EnergySource
from perfsdk.energy.nvml import NVML_UPDATE_PERIOD_S, NvmlReader, open_nvml


class EstimatedSource(EnergySource):
    """TDP × utilization for the CPU (if ``cpu_tdp_w``) and each GPU (if NVML works)."""

    name = "estimated"

    def __init__(self, cpu_tdp_w: float | None = None, nvml: NvmlReader | None = None,
                 cpu_percent: Callable[[], float | None] | None = None, use_nvml: bool = True) -> None:
        super().__init__()
        self.cpu_tdp_w = cpu_tdp_w
        self._nvml = nvml
        self._owns_nvml = False
        self._use_nvml = use_nvml
        self._cpu_percent = cpu_percent
        self._gpu: dict[Channel, tuple[int, float]] = {}
        self._cpu: Channel | None = None

    def open(self) -> tuple[bool, str]:
        reasons = []
        if self.cpu_tdp_w:
            if self._cpu_percent is None:
                from perfsdk.energy.cpu import SystemCpu

                self._cpu_percent = SystemCpu().percent
            self._cpu = Channel(source="estimated", scope="cpu", device="all", method="estimated",
                                device_name=f"TDP {self.cpu_tdp_w:g} W")
            self.channels.append(self._cpu)
        else:
            reasons.append("CPU: set collectors.energy.cpu_tdp_w to estimate CPU power")
        if self._use_nvml and self._nvml is None:
            self._nvml, why = open_nvml()
            self._owns_nvml = self._nvml is not None
            if self._nvml is None:
                reasons.append(f"GPU: {why}")
        if self._nvml is not None:
            for i in range(self._nvml.device_count()):
                limit = self._nvml.power_limit_w(i)
                if not limit:
                    reasons.append(f"GPU {i}: no power limit reported")
                    continue
                ch = Channel(source="estimated", scope="gpu", device=str(i), method="estimated",
                             device_name=f"{self._nvml.name(i)} (limit {limit:g} W)",
                             update_period_s=NVML_UPDATE_PERIOD_S)
                self._gpu[ch] = (i, limit)
                self.channels.append(ch)
        self.available = bool(self.channels)
        names = [f"{c.scope}:{c.device} {c.device_name}" for c in self.channels]
        parts = ["TDP x utilization: " + ", ".join(names)] if names else []
        self.reason = "; ".join(parts + reasons)
        return self.available, self.reason

    def close(self) -> None:
        if self._owns_nvml and self._nvml is not None:
            self._nvml.close()

    def read_power(self) -> dict[Channel, float | None]:
        out: dict[Channel, float | None] = {}
        if self._cpu is not None and self._cpu_percent is not None and self.cpu_tdp_w:
            pct = self._cpu_percent()
            out[self._cpu] = None if pct is None else self.cpu_tdp_w * pct / 100.0
        for ch, (i, limit) in self._gpu.items():
            try:
                util = self._nvml.utilization_pct(i) if self._nvml is not None else None
            except Exception:
                util = None
            out[ch] = None if util is None else limit * util / 100.0
        return out

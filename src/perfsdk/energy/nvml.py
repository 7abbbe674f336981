"""NVIDIA GPUs through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` distribution).

Everything NVML is behind :class:`NvmlReader`, a narrow interface with one method per value.
:class:`PynvmlReader` implements it over ``pynvml``; tests implement it with scripted numbers.
The energy source prefers the total-energy counter (millijoules since driver load, Volta and
newer) and falls back to integrating power samples, labeled ``integrated``, only on GPUs where
the counter is not supported.
"""

from __future__ import annotations

from typing import Any, Protocol

from perfsdk.energy.base import Channel, EnergySource, Method

#: NVML refreshes power and the energy counter roughly every 100 ms on most boards (some
#: refresh faster); windows or sampling intervals below this are flagged.
NVML_UPDATE_PERIOD_S = 0.1


class NvmlReader(Protocol):
    """The NVML values perfsdk reads. Methods raise on failure; ``None`` means unsupported."""

    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def total_energy_mj(self, index: int) -> int | None: ...
    def power_w(self, index: int) -> float | None: ...
    def power_limit_w(self, index: int) -> float | None: ...
    def utilization_pct(self, index: int) -> float | None: ...
    def memory_used_bytes(self, index: int) -> int | None: ...
    def sm_clock_mhz(self, index: int) -> float | None: ...
    def temperature_c(self, index: int) -> float | None: ...
    def close(self) -> None: ...


class PynvmlReader:
    """:class:`NvmlReader` over ``pynvml``. Construct with :func:`open_nvml`."""

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._handles: dict[int, Any] = {}
        self._closed = False

    def _h(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return h

    def _unsupported(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            if getattr(exc, "value", None) == self._nv.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def name(self, index: int) -> str:
        n = self._nv.nvmlDeviceGetName(self._h(index))
        return n.decode() if isinstance(n, bytes) else str(n)

    def total_energy_mj(self, index: int) -> int | None:
        v = self._unsupported(self._nv.nvmlDeviceGetTotalEnergyConsumption, self._h(index))
        return None if v is None else int(v)

    def power_w(self, index: int) -> float | None:
        v = self._unsupported(self._nv.nvmlDeviceGetPowerUsage, self._h(index))
        return None if v is None else v / 1000.0

    def power_limit_w(self, index: int) -> float | None:
        v = self._unsupported(self._nv.nvmlDeviceGetEnforcedPowerLimit, self._h(index))
        return None if v is None else v / 1000.0

    def utilization_pct(self, index: int) -> float | None:
        v = self._unsupported(self._nv.nvmlDeviceGetUtilizationRates, self._h(index))
        return None if v is None else float(v.gpu)

    def memory_used_bytes(self, index: int) -> int | None:
        v = self._unsupported(self._nv.nvmlDeviceGetMemoryInfo, self._h(index))
        return None if v is None else int(v.used)

    def sm_clock_mhz(self, index: int) -> float | None:
        v = self._unsupported(self._nv.nvmlDeviceGetClockInfo, self._h(index), self._nv.NVML_CLOCK_SM)
        return None if v is None else float(v)

    def temperature_c(self, index: int) -> float | None:
        v = self._unsupported(self._nv.nvmlDeviceGetTemperature, self._h(index), self._nv.NVML_TEMPERATURE_GPU)
        return None if v is None else float(v)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nv.nvmlShutdown()
        except Exception:  # shutting down twice or after a driver reset is harmless
            pass


def open_nvml() -> tuple[NvmlReader | None, str]:
    """Initialize NVML: ``(reader, reason)``; ``reader`` is ``None`` with the reason why."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, _init_reason(pynvml, exc)
    reader = PynvmlReader(pynvml)
    try:
        count = reader.device_count()
    except pynvml.NVMLError as exc:
        reader.close()
        return None, f"NVML could not count GPUs: {exc}"
    if count == 0:
        reader.close()
        return None, "NVML found no GPU"
    return reader, f"{count} GPU(s)"


def _init_reason(pynvml: Any, exc: Exception) -> str:
    lib_missing = getattr(pynvml, "NVMLError_LibraryNotFound", ())
    no_driver = getattr(pynvml, "NVMLError_DriverNotLoaded", ())
    if lib_missing and isinstance(exc, lib_missing):
        return "no NVIDIA driver: the NVML library (libnvidia-ml.so) was not found"
    if no_driver and isinstance(exc, no_driver):
        return "the NVIDIA driver is not loaded (no GPU, or the kernel module is missing)"
    return f"NVML initialization failed: {exc}"


class NvmlSource(EnergySource):
    """GPU energy: total-energy counter per GPU, power integration where it is unsupported.

    ``reader`` (an :class:`NvmlReader`) is the seam; with ``None`` the source opens pynvml.
    """

    #: one NVML read took about 1.7 ms on an H200 machine (docs/energy.md)
    slow_reads = True

    name = "nvml"

    def __init__(self, reader: NvmlReader | None = None) -> None:
        super().__init__()
        self._reader = reader
        self._owns_reader = reader is None
        self._index: dict[Channel, int] = {}

    @property
    def reader(self) -> NvmlReader | None:
        return self._reader

    def open(self) -> tuple[bool, str]:
        if self._reader is None:
            self._reader, reason = open_nvml()
            if self._reader is None:
                self.available, self.reason = False, reason
                return False, reason
        r = self._reader
        notes = []
        for i in range(r.device_count()):
            name = r.name(i)
            try:
                counter = r.total_energy_mj(i)
            except Exception:
                counter = None
            method: Method = "counter" if counter is not None else "integrated"
            if method == "integrated":
                notes.append(f"GPU {i}: energy counter unsupported, integrating power samples")
            ch = Channel(source="nvml", scope="gpu", device=str(i), method=method, device_name=name,
                         update_period_s=getattr(r, "update_period_s", NVML_UPDATE_PERIOD_S))
            self._index[ch] = i
            self.channels.append(ch)
        self.available = bool(self.channels)
        self.reason = f"{len(self.channels)} GPU(s): " + ", ".join(
            f"{c.device} {c.device_name} ({c.method})" for c in self.channels)
        if notes:
            self.reason += "; " + "; ".join(notes)
        if not self.channels:
            self.reason = "NVML found no GPU"
        return self.available, self.reason

    def close(self) -> None:
        if self._reader is not None and self._owns_reader:
            self._reader.close()

    def read_counters(self) -> dict[Channel, Any]:
        assert self._reader is not None
        out: dict[Channel, Any] = {}
        for ch, i in self._index.items():
            if ch.method != "counter":
                continue
            try:
                out[ch] = self._reader.total_energy_mj(i)
            except Exception:
                out[ch] = None
        return out

    def delta_j(self, channel: Channel, start: Any, end: Any) -> float | None:
        if start is None or end is None or end < start:
            return None
        return (end - start) / 1000.0

    def read_power(self) -> dict[Channel, float | None]:
        assert self._reader is not None
        out: dict[Channel, float | None] = {}
        for ch, i in self._index.items():
            if ch.method != "integrated":
                continue
            try:
                out[ch] = self._reader.power_w(i)
            except Exception:
                out[ch] = None
        return out

"""Capture the environment a run happened in (host, CPU, RAM, software, GPUs, energy sources)."""

from __future__ import annotations

import functools
import os
import platform
import socket
import sys
from typing import Any

from perfsdk.schemas import EnvironmentInfo


def cpu_model() -> str | None:
    """This machine's CPU model name (``/proc/cpuinfo``; else what :mod:`platform` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvml_rapl() -> tuple[bool, str | None, bool, str | None]:
    try:
        from perfsdk.doctor import nvml_status, rapl_status

        nv_ok, nv_reason = nvml_status()
        rp_ok, rp_reason = rapl_status()
        return nv_ok, nv_reason, rp_ok, rp_reason
    except Exception as exc:  # doctor is optional at import time
        return False, f"unknown: {exc!r}", False, f"unknown: {exc!r}"


@functools.lru_cache(maxsize=1)
def _static_environment() -> dict[str, Any]:
    import psutil

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "ram_bytes": int(psutil.virtual_memory().total),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_available"] = bool(torch.cuda.is_available())
        info["cuda_version"] = torch.version.cuda
        if info["cuda_available"]:
            info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:
        pass
    nv_ok, nv_reason, rp_ok, rp_reason = _nvml_rapl()
    info.update(nvml_available=nv_ok, nvml_reason=nv_reason, rapl_available=rp_ok, rapl_reason=rp_reason)
    if nv_ok:
        try:
            import pynvml

            pynvml.nvmlInit()
            drv = pynvml.nvmlSystemGetDriverVersion()
            info["gpu_driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:
            pass
    return info


def capture_environment() -> EnvironmentInfo:
    """The environment of this process (static parts are computed once per process)."""
    data = dict(_static_environment())
    try:
        import torch

        data["torch_threads"] = torch.get_num_threads()
    except Exception:
        pass
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID"):
        if key in os.environ:
            data.setdefault("extra", {})[key] = os.environ[key]
    return EnvironmentInfo(**data)

"""What can be measured on this machine, and what to do about what cannot.

``run_checks()`` returns one :class:`Check` per source — CUDA, NVML, RAPL, CodeCarbon — each
with whether it is available, why (not), and the fix. ``perfsdk doctor`` prints them as a
table; ``perfsdk.env`` records ``nvml_status()`` and ``rapl_status()`` with every run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from perfsdk.energy.rapl import DEFAULT_ROOT, RaplSource, permission_fix


class Check(BaseModel):
    """One measurement source: available here or not, why, and how to fix it."""

    model_config = ConfigDict(frozen=True)

    name: str
    available: bool
    reason: str
    fix: str | None = None


def cuda_status() -> tuple[bool, str]:
    """Whether torch can use a CUDA device."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
    n = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
    return True, f"{n} device(s): {names} (CUDA {torch.version.cuda})"


def nvml_status() -> tuple[bool, str]:
    """Whether NVML works (``nvidia-ml-py`` installed, driver loaded, a GPU present)."""
    from perfsdk.energy.nvml import open_nvml

    reader, reason = open_nvml()
    if reader is None:
        return False, reason
    try:
        names = [reader.name(i) for i in range(reader.device_count())]
        counters = []
        for i in range(len(names)):
            try:
                counters.append(reader.total_energy_mj(i) is not None)
            except Exception:
                counters.append(False)
    finally:
        reader.close()
    parts = [f"{i}: {n} ({'energy counter' if c else 'no energy counter: power integration'})"
             for i, (n, c) in enumerate(zip(names, counters))]
    return True, f"{len(names)} GPU(s): " + "; ".join(parts)


def rapl_status(root: str = DEFAULT_ROOT, read_text: Callable[[Path], str] | None = None) -> tuple[bool, str]:
    """Whether RAPL counters under ``root`` can be read, and which zones (``read_text``: test seam)."""
    src = RaplSource(root, read_text)
    return src.open()


def _nvml_fix(reason: str) -> str | None:
    if "not installed" in reason:
        return "pip install nvidia-ml-py"
    if "library" in reason or "driver" in reason:
        return "install the NVIDIA driver, or run where a GPU is visible (containers: --gpus all)"
    if "no GPU" in reason:
        return "run on a machine with an NVIDIA GPU"
    return None


def _rapl_fix(root: str, reason: str) -> str | None:
    if "root only" in reason:
        return permission_fix(root)
    if "does not exist" in reason:
        return ("on bare-metal Linux: sudo modprobe intel_rapl_common; in a container, mount "
                "/sys/class/powercap and set collectors.energy.rapl_root")
    if "no intel-rapl zones" in reason:
        return "RAPL needs an Intel (Sandy Bridge+) or AMD (Zen+) CPU on bare metal"
    return None


def codecarbon_check() -> Check:
    """CodeCarbon: installed, and the offline settings perfsdk uses."""
    from perfsdk.energy.codecarbon_source import codecarbon_status

    ok, why = codecarbon_status()
    if not ok:
        return Check(name="codecarbon", available=False, reason=why, fix="pip install codecarbon")
    reason = (f"{why}; perfsdk runs it offline (OfflineEmissionsTracker, no files, no API, "
              "allow_multiple_runs, log level error), CO2 for collectors.energy.codecarbon.country_iso_code (default USA)")
    cfg_files = [p for p in (Path.home() / ".codecarbon.config", Path.cwd() / ".codecarbon.config") if p.exists()]
    if cfg_files:
        reason += f"; note: {', '.join(map(str, cfg_files))} may override settings"
    return Check(name="codecarbon", available=True, reason=reason)


def run_checks(rapl_root: str = DEFAULT_ROOT) -> list[Check]:
    """Check every source: CUDA, NVML, RAPL, CodeCarbon."""
    checks = []
    ok, why = cuda_status()
    checks.append(Check(name="cuda", available=ok, reason=why,
                        fix=None if ok else "install a CUDA build of torch and run on an NVIDIA GPU"))
    ok, why = nvml_status()
    checks.append(Check(name="nvml", available=ok, reason=why, fix=None if ok else _nvml_fix(why)))
    ok, why = rapl_status(rapl_root)
    checks.append(Check(name="rapl", available=ok, reason=why, fix=None if ok else _rapl_fix(rapl_root, why)))
    checks.append(codecarbon_check())
    return checks

"""What can be measured on this machine, and what to do about what cannot.

``run_checks()`` returns the installed ``transformers`` release against the tested range, and one
:class:`Check` per source — CUDA, NVML, RAPL, CodeCarbon — and per
quantization backend — bitsandbytes, float8 — each with whether it is available, why (not), and
the fix. ``perfsdk doctor`` prints them as a
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


def bitsandbytes_check() -> Check:
    """bitsandbytes: installed, importable, and which quantization types it offers here.

    Not imported when it is not installed (``importlib.util.find_spec``)."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return Check(name="bitsandbytes", available=False, reason="unavailable: not installed",
                     fix="pip install bitsandbytes (model.quantization bnb-8bit / bnb-4bit need it and a CUDA GPU)")
    try:
        import bitsandbytes as bnb
    except Exception as exc:  # a broken native library raises at import
        return Check(name="bitsandbytes", available=False,
                     reason=f"unavailable: installed but cannot be imported: {type(exc).__name__}: {exc}",
                     fix="reinstall bitsandbytes for this CUDA and torch version")
    version = getattr(bnb, "__version__", "?")
    ok, why = cuda_status()
    if not ok:
        return Check(name="bitsandbytes", available=False,
                     reason=f"unavailable: bitsandbytes {version} installed, but no CUDA GPU ({why})",
                     fix="run on a machine with an NVIDIA GPU")
    types = ["8-bit (LLM.int8, bnb-8bit)"]
    nn = getattr(bnb, "nn", None)
    if nn is not None and hasattr(nn, "Linear4bit"):
        types.append("4-bit nf4 and fp4 (bnb-4bit; compute dtype float32, float16 or bfloat16)")
    return Check(name="bitsandbytes", available=True, reason=f"bitsandbytes {version}: " + "; ".join(types))


def float8_check() -> Check:
    """float8 e4m3 matmuls (``model.dtype: float8_e4m3fn``): on the GPU when there is one, else the CPU."""
    from perfsdk.models.float8 import float8_status

    ok, _ = cuda_status()
    device = "cuda" if ok else "cpu"
    ok, why = float8_status(device)
    fix = None if ok else "float8 needs torch >= 2.1 with torch._scaled_mm and, on CUDA, compute capability 8.9+"
    return Check(name="float8", available=ok, reason=why if ok else f"unavailable: {why}", fix=fix)


def transformers_check(installed: str | None = None) -> Check:
    """The installed ``transformers`` release against the range the test suite runs on."""
    from perfsdk.models.internals import tested_range_text, transformers_version, within_tested_range

    installed = installed if installed is not None else transformers_version()
    tested = tested_range_text()
    if installed is None:
        return Check(name="transformers", available=False, reason=f"unavailable: not installed (tested: {tested})",
                     fix="pip install transformers")
    inside = within_tested_range(installed)
    if inside is False:
        return Check(name="transformers", available=True,
                     reason=f"transformers {installed}, outside the tested range {tested}: measurements read what "
                            f"runs, but a rename in this release may not have been seen",
                     fix=f"install a release in {tested}, or report what differs")
    return Check(name="transformers", available=True, reason=f"transformers {installed} (tested: {tested})")


def run_checks(rapl_root: str = DEFAULT_ROOT) -> list[Check]:
    """Check every source: transformers, CUDA, NVML, RAPL, CodeCarbon, bitsandbytes, float8."""
    checks = [transformers_check()]
    ok, why = cuda_status()
    checks.append(Check(name="cuda", available=ok, reason=why,
                        fix=None if ok else "install a CUDA build of torch and run on an NVIDIA GPU"))
    ok, why = nvml_status()
    checks.append(Check(name="nvml", available=ok, reason=why, fix=None if ok else _nvml_fix(why)))
    ok, why = rapl_status(rapl_root)
    checks.append(Check(name="rapl", available=ok, reason=why, fix=None if ok else _rapl_fix(rapl_root, why)))
    checks.append(codecarbon_check())
    checks.append(bitsandbytes_check())
    checks.append(float8_check())
    return checks

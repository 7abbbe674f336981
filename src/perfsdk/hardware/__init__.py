"""Hardware profiles (YAML, validated), the built-in catalogue and the roofline model."""

from perfsdk.hardware.catalog import Catalog, builtin_profiles, get_profile
from perfsdk.hardware.profile import HardwareProfile, HardwareProfileError, PeakTflops, load_profile_file, parse_profile

__all__ = [
    "Catalog",
    "HardwareProfile",
    "HardwareProfileError",
    "PeakTflops",
    "builtin_profiles",
    "get_profile",
    "load_profile_file",
    "parse_profile",
]

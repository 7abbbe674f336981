"""Hardware profiles: schema validation, the built-in catalogue, plugin registration, roofline."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from perfsdk.hardware import Catalog, HardwareProfile, HardwareProfileError, builtin_profiles, load_profile_file
from perfsdk.hardware.roofline import attainable_flops, ridge_point, roofline
from perfsdk.plugins import get_plugin_manager, hookimpl

BUILTINS = {"a100-80gb-sxm", "h100-sxm", "h100-pcie", "h200", "l4", "host-cpu", "pim-ai-chip", "pim-ai-dimm"}

GOOD = {
    "name": "my-gpu", "kind": "gpu", "variant": "test card", "source": "made up for a test",
    "host_to_device_gbs": 10, "host_to_device_pj_per_bit": 100, "device_to_host_gbs": 20,
    "device_to_host_pj_per_bit": 50, "memory_bandwidth_gbs": 100, "memory_pj_per_bit": 10,
    "memory_capacity_gb": 16, "peak_tflops": {"fp32": 1, "bf16": 2}, "compute_pj_per_flop": 2,
}


def _write(tmp_path: Path, data: dict, name: str = "prof.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_catalogue_loads_every_builtin() -> None:
    profs = builtin_profiles()
    assert set(profs) == BUILTINS
    for p in profs.values():
        assert p.source and p.variant
        assert p.memory_bandwidth_gbs > 0 and p.memory_capacity_gb > 0
    assert profs["h100-sxm"].memory_bandwidth_gbs == 3350
    assert profs["h100-sxm"].peak_flops("bfloat16") == 989.5e12
    assert profs["h200"].memory_capacity_gb == 141
    assert profs["pim-ai-dimm"].softmax_ns_per_element == 6.25e-3
    assert not profs["host-cpu"].has_host_link and profs["l4"].has_host_link


def test_good_file_loads(tmp_path: Path) -> None:
    [p] = load_profile_file(_write(tmp_path, GOOD))
    assert p.name == "my-gpu"
    assert p.effective_bandwidth_bytes_per_s == 100e9
    assert p.dtype_key("float16") == "bf16"  # falls back to the related type the device has
    assert p.dtype_key("torch.float32") == "fp32"


def test_missing_field_named(tmp_path: Path) -> None:
    bad = {k: v for k, v in GOOD.items() if k != "memory_bandwidth_gbs"}
    path = _write(tmp_path, bad)
    with pytest.raises(HardwareProfileError) as ei:
        load_profile_file(path)
    assert str(path) in str(ei.value)
    assert "memory_bandwidth_gbs: field required" in str(ei.value)


def test_negative_bandwidth_named(tmp_path: Path) -> None:
    with pytest.raises(HardwareProfileError) as ei:
        load_profile_file(_write(tmp_path, {**GOOD, "host_to_device_gbs": -5}))
    assert "host_to_device_gbs: Input should be greater than 0" in str(ei.value)


def test_unknown_key_named(tmp_path: Path) -> None:
    with pytest.raises(HardwareProfileError) as ei:
        load_profile_file(_write(tmp_path, {**GOOD, "peak_tflops": {"fp32": 1, "fp64": 2}}))
    assert "peak_tflops.fp64: unknown key" in str(ei.value)


def test_gpu_needs_host_link(tmp_path: Path) -> None:
    bad = {k: v for k, v in GOOD.items() if k != "device_to_host_gbs"}
    with pytest.raises(HardwareProfileError, match="missing device_to_host_gbs"):
        load_profile_file(_write(tmp_path, bad))


def test_efficiency_above_one_rejected(tmp_path: Path) -> None:
    with pytest.raises(HardwareProfileError, match="compute_efficiency"):
        load_profile_file(_write(tmp_path, {**GOOD, "compute_efficiency": 1.5}))


def test_missing_dtype_is_an_error() -> None:
    pim = builtin_profiles()["pim-ai-dimm"]
    with pytest.raises(HardwareProfileError, match="no peak_tflops for fp32"):
        pim.dtype_key("float32")


def test_file_overrides_and_plugin_profiles(tmp_path: Path) -> None:
    path = _write(tmp_path, {**GOOD, "name": "h100-sxm", "memory_bandwidth_gbs": 1})

    class Plugin:
        @staticmethod
        @hookimpl
        def perfsdk_register_hardware(register):  # type: ignore[no-untyped-def]
            register({**GOOD, "name": "plugin-gpu"})
            register(HardwareProfile.model_validate({**GOOD, "name": "plugin-gpu-2"}))
            register({"name": "broken"})

    pm = get_plugin_manager(load_entry_points=False, extra_plugins=[Plugin()])
    cat = Catalog.load([path], pm=pm)
    assert cat.get("h100-sxm").memory_bandwidth_gbs == 1
    assert cat.origins["h100-sxm"] == str(path)
    assert cat.origins["plugin-gpu"].startswith("plugin:")
    assert "plugin-gpu-2" in cat
    assert len(cat.errors) == 1 and "broken" not in cat
    with pytest.raises(HardwareProfileError, match="unknown hardware profile 'nope'"):
        cat.get("nope")


def test_roofline() -> None:
    p = HardwareProfile.model_validate(GOOD)
    assert ridge_point(p, "float32") == 1e12 / 100e9  # 10 FLOPs per byte
    assert attainable_flops(p, "float32", 2.0) == 200e9
    pt = roofline(1e9, 1e6, p, "float32")
    assert pt.compute_s == 1e-3 and pt.memory_s == 1e-5 and pt.bound == "compute"

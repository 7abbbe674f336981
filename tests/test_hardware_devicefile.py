"""Device-keyed hardware files (device name -> figures) load as they are, everywhere a profile
file is accepted; bad ones name the file, the device and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from perfsdk.hardware import HardwareProfileError, load_profile_file
from perfsdk.hardware.catalog import Catalog
from perfsdk.simulation.mapping import MappingError, parse_mapping
from perfsdk.cli.simulate import hardware_group, simulate_command

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pim_architectures.yaml"

SEED = """\
# yaml-language-server: $schema=<path-to-this-library>/architectures_schema.json

My_accelerator:
    # * Required parameters:
    host_to_device_bw_GBs: 22
    host_to_device_pj_per_bit: 200
    device_to_host_bw_GBs: 88
    device_to_host_pj_per_bit: 50
    mem_bw_GBs: 6553.6
    mem_pj_per_bit: 0.95
    tflops: 320
    pj_per_tflop: 0.4e+12
    # * Optional parameters:
    softmax_ns_per_element: 6.25e-03
    SiLU_ns_per_element: 9.375e-03
    RMSNorm_ns_per_element: 1.625e-02

My_accelerator2:
    host_to_device_bw_GBs: 16
    host_to_device_pj_per_bit: 100
    device_to_host_bw_GBs: 16
    device_to_host_pj_per_bit: 100
    mem_bw_GBs: 1000
    mem_pj_per_bit: 2
    tflops: 50
    pj_per_tflop: 1.0e+12
"""


@pytest.fixture()
def seed_file(tmp_path: Path) -> Path:
    f = tmp_path / "arch.yaml"
    f.write_text(SEED)
    return f


def test_seed_file_loads_with_renamed_fields_and_defaults(seed_file: Path) -> None:
    acc, acc2 = load_profile_file(seed_file)
    assert (acc.name, acc2.name) == ("my-accelerator", "my-accelerator2")  # underscores -> hyphens
    assert acc.host_to_device_gbs == 22 and acc.host_to_device_pj_per_bit == 200
    assert acc.device_to_host_gbs == 88 and acc.device_to_host_pj_per_bit == 50
    assert acc.memory_bandwidth_gbs == 6553.6 and acc.memory_pj_per_bit == 0.95
    # one rate for every data type; pJ per TFLOP -> pJ per FLOP
    assert acc.peak_tflops.available() == {k: 320 for k in ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")}
    assert acc.compute_pj_per_flop == 0.4
    assert (acc.softmax_ns_per_element, acc.activation_ns_per_element, acc.norm_ns_per_element) == (
        6.25e-3, 9.375e-3, 1.625e-2)
    # the documented defaults of what the format leaves out
    assert acc2.softmax_ns_per_element is None and acc2.activation_ns_per_element is None
    assert acc2.norm_ns_per_element is None
    assert acc2.kind == "accelerator" and acc2.memory_capacity_gb is None and acc2.static_power_w == 0
    assert acc2.compute_efficiency == acc2.memory_efficiency == 1.0 and acc2.peak_assumed
    assert "My-accelerator2" in acc2.variant and str(seed_file) in acc2.source


def test_catalog_names_ignore_case_and_underscores(seed_file: Path) -> None:
    cat = Catalog.load([seed_file], plugins=False)
    for name in ("My-accelerator", "My_accelerator", "my-accelerator", "MY_ACCELERATOR"):
        assert name in cat and cat.get(name).memory_bandwidth_gbs == 6553.6
    assert cat.origins["my-accelerator2"] == str(seed_file)
    with pytest.raises(HardwareProfileError, match="unknown hardware profile 'My-accelerator3'"):
        cat.get("My-accelerator3")


@pytest.mark.parametrize(("change", "message"), [
    ({"mem_bw_GBs": None}, "device My_accelerator: mem_bw_GBs: field required"),
    ({"tflops": -1}, "device My_accelerator: tflops: Input should be greater than 0"),
    ({"mem_bw_GB": 5}, "device My_accelerator: mem_bw_GB: unknown key"),
    ({"SiLU_ns_per_element": "fast"}, "device My_accelerator: SiLU_ns_per_element: Input should be a valid number"),
])
def test_bad_device_names_the_file_device_and_field(tmp_path: Path, change: dict, message: str) -> None:
    data = yaml.safe_load(SEED)
    for k, v in change.items():
        if v is None:
            del data["My_accelerator"][k]
        else:
            data["My_accelerator"][k] = v
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(HardwareProfileError) as err:
        load_profile_file(f)
    assert str(err.value).startswith(f"{f}: ") and message in str(err.value)
    r = CliRunner().invoke(hardware_group, ["show", str(f)])
    assert r.exit_code == 2 and message in r.output
    r = CliRunner().invoke(simulate_command, ["--model", "llama-2-7b", "--hardware-file", str(f)])
    assert r.exit_code == 2 and message in r.output


def test_clashing_names_and_bad_yaml(tmp_path: Path) -> None:
    f = tmp_path / "dup.yaml"
    data = yaml.safe_load(SEED)
    data["my-ACCELERATOR"] = data["My_accelerator"]
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(HardwareProfileError, match="same name as device My_accelerator"):
        load_profile_file(f)
    f.write_text("a: [b\n")
    with pytest.raises(HardwareProfileError, match=f"{f}: not valid YAML"):
        load_profile_file(f)
    with pytest.raises(HardwareProfileError, match="hardware profile file not found"):
        load_profile_file(tmp_path / "none.yaml")


def test_show_and_convert_to_perfsdk_format(seed_file: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(hardware_group, ["show", str(seed_file), "--json"])
    assert r.exit_code == 0, r.output
    docs = json.loads(r.output)
    assert [d["name"] for d in docs] == ["my-accelerator", "my-accelerator2"]
    r = CliRunner().invoke(hardware_group, ["show", "My-accelerator", "--hardware-file", str(seed_file), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["memory_bandwidth_gbs"] == 6553.6
    out = tmp_path / "converted.yaml"
    r = CliRunner().invoke(hardware_group, ["convert", str(seed_file), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "2 profiles: my-accelerator, my-accelerator2" in r.output
    text = out.read_text()
    assert text.startswith("# converted by perfsdk hardware convert") and "profiles:" in text
    assert "memory_bandwidth_gbs: 6553.6" in text and "mem_bw_GBs" not in text
    # the converted file is perfsdk's own format and gives the same profiles
    assert load_profile_file(out) == load_profile_file(seed_file)
    r = CliRunner().invoke(hardware_group, ["convert", str(EXAMPLE)])
    assert r.exit_code == 0 and "name: pim-ai-1chip" in r.output and "name: pim-ai-dimm" in r.output


def test_simulate_with_a_device_file(seed_file: Path, tmp_path: Path) -> None:
    args = ["--model", "llama-2-7b", "--input-tokens", "16", "--output-tokens", "4", "--json"]
    # a file with several devices is not one device
    r = CliRunner().invoke(simulate_command, [*args, "--hardware", str(seed_file)])
    assert r.exit_code == 2 and "holds 2 devices (my-accelerator, my-accelerator2)" in r.output
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({"My_accelerator": yaml.safe_load(SEED)["My_accelerator"]}))
    r = CliRunner().invoke(simulate_command, [*args, "--hardware", str(one)])
    assert r.exit_code == 0, r.output
    by_file = json.loads(r.output)
    r = CliRunner().invoke(simulate_command, [*args, "--hardware", "My_accelerator", "--hardware-file", str(seed_file)])
    assert r.exit_code == 0, r.output
    by_name = json.loads(r.output)
    assert by_file["hardware"] == by_name["hardware"] == "my-accelerator"
    assert by_file["ttft_s"] == by_name["ttft_s"] and by_file["fits_in_memory"] is None
    [dev] = by_name["devices"]
    assert dev["peak_assumed"] and dev["capacity_bytes"] is None
    # mapping layers onto the file's devices by their hyphenated names
    mapping = tmp_path / "map.yaml"
    mapping.write_text("model.layers.*.mlp.*: My-accelerator2,t\n")
    r = CliRunner().invoke(simulate_command, [*args, "--hardware", "h100-sxm", "--hardware-file", str(seed_file),
                                              "--mapping", str(mapping)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["hardware"] == "h100-sxm, My-accelerator2"
    assert d["phases"]["prefill"]["transfer_s"] > 0


def test_flat_mapping_form() -> None:
    m = parse_mapping({"linear1": "PIM-AI-1chip,t", "q_proj": "pim,m", "model.lm_head": "gpu"})
    assert m.resolve("linear1")[1].transfer == "t"
    dev, rule = m.resolve("model.layers.3.self_attn.q_proj")  # a plain name matches at any depth
    assert dev == "pim" and rule.transfer == "m" and rule.group == "q_proj"
    assert m.resolve("model.lm_head") == ("gpu", m.layers[-1]) and m.layers[-1].transfer is None
    assert m.resolve("linear10") == (None, None)
    with pytest.raises(MappingError, match="linear1: unknown option 'x'"):
        parse_mapping({"linear1": "PIM-AI-1chip,x"}, "map.yaml")
    with pytest.raises(MappingError, match="linear1: expected 'device'"):
        parse_mapping({"linear1": ",t"})


def test_bad_file_in_collector_config_is_a_config_error(tmp_path: Path) -> None:
    import perfsdk
    from perfsdk.config import ConfigError

    data = yaml.safe_load(SEED)
    del data["My_accelerator2"]["tflops"]
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="collectors.simulation.*device My_accelerator2: tflops: field required"):
        perfsdk.session({"collectors": {"simulation": {"targets": [str(f)]}}}, store=None)
    with pytest.raises(ConfigError, match="linear1: unknown option"):
        perfsdk.session({"collectors": {"simulation": {"mapping": {"linear1": "x,q"}}}}, store=None)

"""Mapping and transfer points: hand-computed expectations."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfsdk.hardware import HardwareProfile
from perfsdk.hardware.catalog import Catalog
from perfsdk.simulation.analytic import _Emitter
from perfsdk.simulation.costmodel import cost_op
from perfsdk.simulation.mapping import MappingError, load_mapping, parse_mapping
from perfsdk.simulation.predictor import Simulator

BASE = {
    "kind": "gpu", "variant": "v", "source": "s",
    "host_to_device_gbs": 10, "host_to_device_pj_per_bit": 100,
    "device_to_host_gbs": 20, "device_to_host_pj_per_bit": 50,
    "memory_bandwidth_gbs": 100, "memory_pj_per_bit": 10, "memory_capacity_gb": 1,
    "peak_tflops": {"fp32": 1}, "compute_pj_per_flop": 2,
}
A = HardwareProfile.model_validate({**BASE, "name": "dev-a", "static_power_w": 10})
B = HardwareProfile.model_validate({**BASE, "name": "dev-b", "memory_bandwidth_gbs": 1000, "static_power_w": 2,
                                    "memory_capacity_gb": 0.001})


def catalog() -> Catalog:
    cat = Catalog()
    cat.add(A, "test")
    cat.add(B, "test")
    return cat


def ops(paths: list[str]) -> list:
    e = _Emitter("float32", "prefill", 0, 1)
    for p in paths:
        e.linear(p, batch=4, tokens=1, k=1024, n=1024)
    return e.ops


def test_transfer_point_t() -> None:
    m = parse_mapping({"devices": {"a": "dev-a"}, "default": "a",
                       "layers": [{"match": "mlp.*", "device": "a", "transfer": "t"}]})
    [op] = ops(["mlp.up"])
    res = Simulator(A, m, catalog()).predict([op], batch_size=4)
    # input 4x1024 fp32 = 16,384 bytes in at 10 GB/s, output 16,384 bytes back at 20 GB/s
    transfer_s = 16_384 / 10e9 + 16_384 / 20e9
    assert transfer_s == pytest.approx(2.4576e-6)
    assert res.phases["prefill"].transfer_s == pytest.approx(transfer_s)
    c = cost_op(op, A)
    assert res.ttft_s == pytest.approx(c.time_s + transfer_s)
    transfer_j = 16_384 * 8 * 100e-12 + 16_384 * 8 * 50e-12
    assert res.phases["prefill"].energy_j == pytest.approx(c.dynamic_energy_j + transfer_j + 10 * res.ttft_s)


def test_transfer_point_m_sends_shared_input_once() -> None:
    m = parse_mapping({"devices": {"a": "dev-a"},
                       "layers": [{"match": "experts.*", "device": "a", "transfer": "m"}]})
    res = Simulator(A, m, catalog()).predict(ops(["experts.0", "experts.1"]), batch_size=4)
    assert res.phases["prefill"].transfer_s == pytest.approx(16_384 / 10e9 + 2 * 16_384 / 20e9)


def test_transfer_bound_label() -> None:
    m = parse_mapping({"layers": [{"match": "x", "device": "dev-a", "transfer": "t"}]})
    e = _Emitter("float32", "prefill", 0, 1)
    e.linear("x", batch=64, tokens=1, k=16, n=16)  # tiny weights, activations dominate
    res = Simulator(A, m, catalog()).predict(e.ops, batch_size=64)
    assert res.layers[0].bound == "transfer"


def test_two_device_mapping(tmp_path: Path) -> None:
    f = tmp_path / "map.yaml"
    f.write_text("mapping:\n  default: gpu\n  devices: {gpu: dev-a, pim0: dev-b, pim1: dev-b}\n"
                 "  layers:\n    - {match: 'model.layers.*.mlp.*', device: pim0}\n"
                 "    - {match: 'model.layers.1.*', device: pim1}\n")
    m = load_mapping(f)
    o = ops(["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj", "model.layers.1.self_attn.q_proj"])
    res = Simulator(A, m, catalog()).predict(o, batch_size=4)
    ca, cb = cost_op(o[0], A), cost_op(o[1], B)
    assert ca.memory_s == pytest.approx(4_227_072 / 100e9)
    assert cb.memory_s == pytest.approx(4_227_072 / 1000e9)
    assert res.ttft_s == pytest.approx(ca.time_s + 2 * cb.time_s)
    dyn = ca.dynamic_energy_j + 2 * cb.dynamic_energy_j
    assert res.phases["prefill"].energy_j == pytest.approx(dyn + (10 + 2 + 2) * res.ttft_s)
    devs = {d.name: d for d in res.devices}
    assert devs["gpu"].weight_bytes == devs["pim0"].weight_bytes == devs["pim1"].weight_bytes == 4_194_304
    assert devs["gpu"].fits_in_memory and not devs["pim0"].fits_in_memory  # 1 MB capacity
    assert not res.fits_in_memory
    assert {(l.name, l.device) for l in res.layers} == {
        ("model.layers.0.self_attn.q_proj", "gpu"), ("model.layers.0.mlp.up_proj", "pim0"),
        ("model.layers.1.self_attn.q_proj", "pim1")}


def test_bad_mapping_named(tmp_path: Path) -> None:
    with pytest.raises(MappingError, match=r"layers.0.transfer"):
        parse_mapping({"layers": [{"match": "x", "device": "a", "transfer": "q"}]})
    with pytest.raises(MappingError, match="default: .*not in devices"):
        parse_mapping({"devices": {"a": "dev-a"}, "default": "b"})
    with pytest.raises(MappingError, match="neither in devices nor a hardware profile"):
        Simulator(A, parse_mapping({"layers": [{"match": "x", "device": "ghost"}]}), catalog())

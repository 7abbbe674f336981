"""Simulating ``s.forward`` steps of a plain ``nn.Module``: two Linear layers on a PIM chip, each
behind a ``t`` transfer point, checked against the roofline computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import perfsdk
from perfsdk.hardware import get_profile
from perfsdk.plugins import hookimpl

PIM_FILE = str(Path(__file__).resolve().parents[1] / "examples" / "pim_architectures.yaml")
MAPPING = {"linear1": "PIM-AI-1chip,t", "linear2": "PIM-AI-1chip,t"}

# PIM_AI_1chip in examples/pim_architectures.yaml
H2D_GBS, H2D_PJ, D2H_GBS, D2H_PJ = 22, 200, 88, 50
MEM_GBS, MEM_PJ, TFLOPS, PJ_PER_TFLOP = 409.6, 0.95, 20, 0.4e12


class TinyModel(nn.Module):
    """Two Linear layers, a ReLU between them and a softmax at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(100, 200)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(200, 10)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.linear2(self.activation(self.linear1(x))))


def hand_linear(batch: int, k: int, n: int) -> dict[str, float]:
    """Roofline of ``y = x W^T + b`` in float32 on the chip, with a ``t`` transfer point:
    x comes from the host, y goes back to it."""
    s = 4  # bytes per float32
    flops = 2 * batch * k * n
    read = s * (batch * k + n * k + n)  # input, weight, bias
    written = s * batch * n
    h2d, d2h = s * batch * k, s * batch * n
    compute_s = flops / (TFLOPS * 1e12)
    memory_s = (read + written) / (MEM_GBS * 1e9)
    transfer_s = h2d / (H2D_GBS * 1e9) + d2h / (D2H_GBS * 1e9)
    energy = (flops * (PJ_PER_TFLOP / 1e12) * 1e-12 + (read + written) * 8 * MEM_PJ * 1e-12
              + (h2d * 8 * H2D_PJ + d2h * 8 * D2H_PJ) * 1e-12)
    bound = ("transfer" if transfer_s > max(compute_s, memory_s) else
             "compute" if compute_s >= memory_s else "memory")
    return {"compute_s": compute_s, "memory_s": memory_s, "transfer_s": transfer_s,
            "time_s": max(compute_s, memory_s) + transfer_s, "energy_j": energy, "bound": bound}


def run_two_linear(cfg_sim: dict, batch: int = 1, plugins: list | None = None) -> dict:
    torch.manual_seed(0)
    model = TinyModel().eval()
    x = torch.rand(batch, 100)
    with perfsdk.session({"collectors": {"simulation": cfg_sim}}, store=None, plugins=plugins) as s:
        s.load(model=model)
        with s.warmup():
            s.forward(model, x)
        y = s.forward(model, x)
    assert y.shape == (batch, 10)
    return s.result.collectors["simulation"]


def test_two_linear_on_pim_matches_hand_roofline() -> None:
    res = run_two_linear({"targets": [PIM_FILE], "mapping": MAPPING, "top_n": 10}, batch=4)
    assert res["status"] == "ok", res
    assert res["step_kind"] == "forward" and res["captured_step"] == 1  # the warm-up is not simulated
    assert res["captured_ops"] == 4  # linear, relu, linear, softmax
    assert res["input_tokens"] is None and res["output_tokens"] is None
    pred = res["predictions"][PIM_FILE]
    # the file's devices sit next to the host, which runs what is not mapped
    assert pred["hardware"] == "host-cpu, PIM-AI-1chip"
    layers = {l["name"]: l for l in pred["top_layers"]}
    assert set(layers) == {"linear1", "activation", "linear2", "softmax"}
    assert {l["phase"] for l in layers.values()} == {"forward"}
    for name, (k, n) in (("linear1", (100, 200)), ("linear2", (200, 10))):
        got, want = layers[name], hand_linear(4, k, n)
        assert got["device"] == "PIM-AI-1chip"
        # exact: the same formulas, in the same order, as the cost model
        assert got["compute_s"] == want["compute_s"]
        assert got["memory_s"] == want["memory_s"]
        assert got["transfer_s"] == want["transfer_s"]
        assert got["time_s"] == want["time_s"]
        assert got["energy_j"] == want["energy_j"]
        assert got["bound"] == want["bound"]
    # linear1 reads 80.8 kB of weights on the chip; linear2 has few weights, and its 3.2 kB of
    # input crossing the 22 GB/s host link take longer than its compute and memory
    assert (layers["linear1"]["bound"], layers["linear2"]["bound"]) == ("memory", "transfer")
    assert layers["activation"]["device"] == "host-cpu" and layers["activation"]["transfer_s"] == 0
    # the forward pass: every layer, plus the host's per-forward-pass overhead
    host = get_profile("host-cpu")
    total = sum(l["time_s"] for l in layers.values()) + host.step_overhead_s
    assert pred["forward_s"] == pytest.approx(total, rel=1e-12)
    assert pred["ttft_s"] is None and pred["output_tokens_per_s"] is None
    assert pred["energy_j_per_forward"] > sum(layers[n]["energy_j"] for n in ("linear1", "linear2"))
    effs = {d["name"]: d for d in pred["devices"]}
    assert effs["PIM-AI-1chip"]["peak_assumed"] is True and effs["host-cpu"]["peak_assumed"] is False
    assert effs["host-cpu"]["compute_efficiency"] == host.compute_efficiency
    assert pred["fits_in_memory"] is None  # the file states no capacity
    # the measured device: predicted vs measured for the forward step
    assert set(res["comparison"]) == {"forward"}
    fwd = res["comparison"]["forward"]
    assert fwd["measured_s"] > 0 and fwd["predicted_s"] == res["predictions"]["host-cpu"]["forward_s"]


def test_device_as_target_runs_every_layer() -> None:
    res = run_two_linear({"targets": ["PIM_AI_1chip"], "hardware_files": [PIM_FILE], "mapping": MAPPING,
                          "top_n": 10})
    assert res["status"] == "ok", res
    pred = res["predictions"]["PIM_AI_1chip"]
    layers = {l["name"]: l for l in pred["top_layers"]}
    # the rules name the target's own profile: one device, whatever the spelling
    assert {l["device"] for l in layers.values()} == {"pim-ai-1chip"}
    assert [d["name"] for d in pred["devices"]] == ["pim-ai-1chip"]
    want = hand_linear(1, 100, 200)
    assert layers["linear1"]["time_s"] == want["time_s"]
    # softmax at 0.1 ns per element on the chip (10 outputs), no transfer point
    assert layers["softmax"]["compute_s"] == 10 * 0.1 * 1e-9 and layers["softmax"]["transfer_s"] == 0


def test_summary_tables_for_forward() -> None:
    from rich.console import Console

    from perfsdk.collectors.simulation import SimulationCollector, SimulationCollectorResult

    res = run_two_linear({"targets": [PIM_FILE], "mapping": MAPPING})
    tables = SimulationCollector.summary_tables(SimulationCollectorResult.model_validate(res))
    con = Console(record=True, width=220)
    for t in tables:
        con.print(t)
    text = con.export_text()
    assert "ops of forward step 1" in text and "J/forward" in text
    assert "PIM-AI-1chip: peak" in text and "host-cpu: 0.50 compute, 0.70 memory" in text
    assert f"Layers on {PIM_FILE}" in text and "linear1" in text


def test_plugin_profiles_reach_the_collector_and_entry_points_load_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.plugins as plugins

    calls = []
    real = plugins._load_entry_points
    monkeypatch.setattr(plugins, "_load_entry_points", lambda pm, allow: (calls.append(1), real(pm, allow))[1])

    class Hardware:
        @hookimpl
        def perfsdk_register_hardware(self, register):  # type: ignore[no-untyped-def]
            register({"name": "plugin-chip", "kind": "pim", "variant": "v", "source": "s",
                      "host_to_device_gbs": 1, "host_to_device_pj_per_bit": 1, "device_to_host_gbs": 1,
                      "device_to_host_pj_per_bit": 1, "memory_bandwidth_gbs": 100, "memory_pj_per_bit": 1,
                      "peak_tflops": {"fp32": 1}, "compute_pj_per_flop": 1})

    res = run_two_linear({"targets": ["plugin-chip"], "mapping": {"linear1": "plugin-chip,t"}},
                         plugins=[Hardware()])
    assert res["status"] == "ok" and not res["errors"], res
    layers = {l["name"]: l for l in res["predictions"]["plugin-chip"]["top_layers"]}
    assert layers["linear1"]["memory_s"] == 4 * (100 + 200 * 100 + 200 + 200) / 100e9
    assert len(calls) == 1  # the session's plugin manager, not a second one


def test_no_step_is_unavailable_and_bad_mapping_device_is_reported() -> None:
    with perfsdk.session({"collectors": {"simulation": {}}}, store=None) as s:
        pass
    res = s.result.collectors["simulation"]
    assert res["status"] == "unavailable" and "no measured generate or forward step" in res["reason"]
    res = run_two_linear({"targets": [PIM_FILE], "mapping": {"linear1": "PIM-AI-2chip,t"}})
    assert "PIM-AI-2chip" in res["errors"][PIM_FILE]


def test_overrides_do_not_apply_to_forward_steps() -> None:
    res = run_two_linear({"targets": [PIM_FILE], "mapping": MAPPING, "num_key_value_heads": 1})
    assert res["status"] == "ok" and res["overrides"] == {}
    assert "generate steps only" in res["notes"][0]

"""Map the layers of a plain nn.Module onto a processing-in-memory chip and predict each one.

Two Linear layers run on a PIM chip described in a device-keyed hardware file
(examples/pim_architectures.yaml, loaded as it is); each has a ``t`` transfer point: its input
comes from the host and its output goes back to it. The ReLU and the softmax stay on the host.
The script measures the model with ``s.forward``, lets the ``simulation`` collector predict the
step on the file's devices, and prints each Linear layer's predicted compute, memory and
transfer times next to the roofline formulas computed here by hand.

    python examples/pim_two_linear.py
    perfsdk layers <run id> --log          # the time-ordered module calls of the measured step
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml
from torch import nn

import perfsdk
import perfsdk.hardware

HARDWARE = Path(__file__).resolve().parent / "pim_architectures.yaml"
MAPPING = {"linear1": "PIM-AI-1chip,t", "linear2": "PIM-AI-1chip,t"}


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(100, 200)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(200, 10)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.linear2(self.activation(self.linear1(x))))


def hand_roofline(dev: dict[str, float], batch: int, k: int, n: int, elem: int = 4) -> dict[str, float]:
    """A float32 Linear layer (k -> n, with bias) on ``dev``, its input sent from the host and
    its output sent back: compute = FLOPs / peak, memory = bytes / bandwidth, transfer = bytes
    over the host link each way; time = max(compute, memory) + transfer."""
    flops = 2 * batch * k * n
    moved = elem * (batch * k + k * n + n) + elem * batch * n  # input, weight, bias read; output written
    compute = flops / (dev["tflops"] * 1e12)
    memory = moved / (dev["mem_bw_GBs"] * 1e9)
    transfer = elem * batch * k / (dev["host_to_device_bw_GBs"] * 1e9) + elem * batch * n / (
        dev["device_to_host_bw_GBs"] * 1e9)
    return {"compute_s": compute, "memory_s": memory, "transfer_s": transfer,
            "time_s": max(compute, memory) + transfer}


def ns(v: float) -> str:
    return f"{v * 1e9:10.3f} ns"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="perfsdk-results")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = TinyModel().eval()
    x = torch.rand(args.batch, 100)
    cfg = {
        "name": "pim-two-linear",
        "collectors": {
            "simulation": {"targets": [str(HARDWARE)], "mapping": MAPPING, "top_n": 10},
            "layers": {"log_events": True},
        },
    }
    with perfsdk.session(cfg, store=args.store) as s:
        s.load(model=model)
        with s.warmup():
            s.forward(model, x)
        s.forward(model, x)
    r = s.result
    sim = r.collectors["simulation"]
    pred = sim["predictions"][str(HARDWARE)]
    host = perfsdk.hardware.get_profile(sim["measured_profile"])
    print(f"run {r.run_id}: forward step {sim['captured_step']} simulated on {pred['hardware']}, "
          f"predicted {pred['forward_s'] * 1e6:.3f} us per forward pass (of which {host.name}'s fixed cost per "
          f"forward pass: {host.step_overhead_s * 1e6:.0f} us)")
    device = yaml.safe_load(HARDWARE.read_text(encoding="utf-8"))["PIM_AI_1chip"]
    layers = {row["name"]: row for row in pred["top_layers"]}
    for name, (k, n) in (("linear1", (100, 200)), ("linear2", (200, 10))):
        got, hand = layers[name], hand_roofline(device, args.batch, k, n)
        same = all(got[key] == hand[key] for key in hand)
        print(f"{name} on {got['device']} ({got['bound']}-bound):")
        for key in ("compute_s", "memory_s", "transfer_s", "time_s"):
            print(f"  {key[:-2]:9s} predicted {ns(got[key])}   by hand {ns(hand[key])}")
        print(f"  equal to the hand formulas: {'yes' if same else 'NO'}")
    for row in pred["top_layers"]:
        if row["name"] not in MAPPING:
            print(f"{row['name']} stays on {row['device']}: {row['time_s'] * 1e6:.3f} us")


if __name__ == "__main__":
    main()

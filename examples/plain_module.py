"""Measure any torch.nn.Module (not only transformers models) with s.forward.

    python examples/plain_module.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import perfsdk


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(8), nn.Flatten(),
        nn.Linear(16 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    ).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="perfsdk-results")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    model = build_model()
    images = torch.randn(8, 3, 32, 32)
    with perfsdk.session({"name": "plain-module"}, store=args.store) as s:
        s.load(model=model)  # adopt the object you built: parameters, bytes and dtype are recorded
        with s.warmup():
            s.forward(model, images)
        for _ in range(args.steps):
            logits = s.forward(model, images)
    r = s.result
    fwd = r.collectors["latency"]["forward_s"]
    print(f"run {r.run_id}: {fwd['count']} forward steps, p50 {fwd['p50'] * 1e3:.3f} ms, "
          f"{r.collectors['latency']['requests_per_s']:.0f} images/s, {r.model.parameters} parameters, "
          f"logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()

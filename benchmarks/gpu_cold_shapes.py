"""What a batch's first run costs on CUDA, and which attention backend it comes from.

A 0.5 B-parameter Llama shape (random weights, bf16) generates 32 tokens for a short batch (warm-up),
then twice for each of two longer batches it has not seen. Each SDPA setting runs in a fresh
process (CUDA's per-shape caches live as long as the process): torch's default backend choice,
cuDNN attention switched off, and flash attention only. Prints, per setting and batch, the time
per output token of the first and the second run.

Usage: ``python benchmarks/gpu_cold_shapes.py [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

SETTINGS = ("default", "no-cudnn", "flash-only")


def child(setting: str) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    b = torch.backends.cuda
    if setting == "no-cudnn":
        b.enable_cudnn_sdp(False)
    elif setting == "flash-only":
        b.enable_cudnn_sdp(False)
        b.enable_mem_efficient_sdp(False)
        b.enable_math_sdp(False)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                      num_key_value_heads=4, head_dim=128, vocab_size=4096, max_position_embeddings=2048,
                      pad_token_id=3, eos_token_id=2, bos_token_id=1)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()

    def run(length: int) -> float:
        ids = torch.randint(5, 4000, (8, length), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                       do_sample=False)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 32

    run(8)
    run(8)
    out: dict[str, Any] = {"setting": setting, "enabled": {
        "cudnn": b.cudnn_sdp_enabled(), "flash": b.flash_sdp_enabled(), "mem_efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled()}}
    for length in (120, 300):
        first, second = run(length), run(length)
        out[f"len{length}"] = {"first_ms_per_token": first * 1e3, "second_ms_per_token": second * 1e3,
                               "ratio": first / second}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child)))
        return 0
    rows = []
    for setting in SETTINGS:
        p = subprocess.run([sys.executable, __file__, "--child", setting], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            rows.append({"setting": setting, "error": p.stderr.strip().splitlines()[-1:]})
            continue
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    for r in rows:
        if "error" in r:
            print(f"{r['setting']:>10}: failed: {r['error']}")
            continue
        cells = "  ".join(f"len {k[3:]}: first {v['first_ms_per_token']:.2f} ms/token, then {v['second_ms_per_token']:.2f}"
                          f" ({v['ratio']:.2f}x)" for k, v in r.items() if k.startswith("len"))
        print(f"{r['setting']:>10}: {cells}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

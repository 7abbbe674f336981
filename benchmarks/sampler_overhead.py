"""Sampler overhead and end-to-end overhead of the default collector set.

1. Sampler cost: a session whose only sampled collector is ``utilization`` (``memory``'s RSS
   probe off, energy without power sampling on this machine) runs a generate loop
   for ``--duration`` seconds at 10 Hz and at 50 Hz; the sampler thread's own CPU time
   (``time.thread_time``) per second of run is reported (``sampler_cpu_s_per_s``).
2. End to end: the same generate loop bare and inside ``perfsdk.session`` with the default
   collectors, alternating bare/session runs ``--pairs`` times; the medians of the per-pair
   ratios of tokens/s and of process CPU seconds per token (all threads; less sensitive to
   other load on the machine), session / bare, are the overhead figures.

Usage: ``PYTHONPATH=src python benchmarks/sampler_overhead.py [--device cpu|cuda] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import perfsdk  # noqa: E402


def build(device: str, big: bool) -> tuple[Any, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if big:
        cfg = LlamaConfig(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                          intermediate_size=2816, vocab_size=32000, max_position_embeddings=1024)
    else:
        cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=256, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval().to(device)
    if device.startswith("cuda"):
        model = model.to(torch.bfloat16)
    ids = torch.randint(3, cfg.vocab_size - 5, (4, 16), device=device)
    return model, ids, torch.ones_like(ids)


def gen_kwargs(ids: torch.Tensor, mask: torch.Tensor, new: int) -> dict[str, Any]:
    return dict(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bare_loop(model: Any, kw: dict[str, Any], iters: int, device: str) -> tuple[float, float]:
    """Tokens per second of ``iters`` generate calls, and process CPU seconds per token."""
    sync(device)
    t0 = time.perf_counter()
    c0 = time.process_time()
    tokens = 0
    with torch.inference_mode():
        for _ in range(iters):
            out = model.generate(**kw)
            tokens += (out.shape[1] - kw["input_ids"].shape[1]) * out.shape[0]
    sync(device)
    return tokens / (time.perf_counter() - t0), (time.process_time() - c0) / tokens


def session_loop(model: Any, kw: dict[str, Any], iters: int, device: str,
                 cfg: dict[str, Any] | None = None) -> tuple[float, float, perfsdk.Session, float]:
    """Tokens/s and CPU s/token of the same loop inside a session (set-up/finalize timed apart)."""
    t_setup = time.perf_counter()
    with perfsdk.session(cfg or {}, store=None) as s:
        s.load(model=model, tokenizer=None)
        sync(device)
        t0 = time.perf_counter()
        c0 = time.process_time()
        tokens = 0
        for _ in range(iters):
            out = s.generate(model, **kw)
            tokens += (out.shape[1] - kw["input_ids"].shape[1]) * out.shape[0]
        sync(device)
        dt = time.perf_counter() - t0
        cpu = (time.process_time() - c0) / tokens
    total = time.perf_counter() - t_setup
    return tokens / dt, cpu, s, total - dt


def sampler_cost(model: Any, kw: dict[str, Any], device: str, hz: float, duration_s: float) -> dict[str, Any]:
    # memory's own RSS probe is switched off so that the figure is the utilization probe's
    cfg = {"collectors": {"utilization": {"interval_s": 1.0 / hz}, "energy": {"codecarbon": {"enabled": False}},
                          "memory": False}}
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=model, tokenizer=None)
        t_end = time.perf_counter() + duration_s
        while time.perf_counter() < t_end:
            s.generate(model, **kw)
    u = s.result.collectors["utilization"]
    return {"hz": hz, "samples": u["samples"], "run_s": round(u["sampler_run_s"], 3),
            "sampler_cpu_time_s": round(u["sampler_cpu_time_s"], 5),
            "sampler_cpu_s_per_s": round(u["sampler_cpu_s_per_s"], 5),
            "cpu_ms_per_sample": round(1000 * u["sampler_cpu_time_s"] / max(1, u["samples"]), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--big", action="store_true", help="a 1024-wide, 8-layer Llama (for GPUs)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per sampler-rate run")
    ap.add_argument("--pairs", type=int, default=6, help="bare/session pairs for the end-to-end figure")
    ap.add_argument("--iters", type=int, default=4, help="generate calls per loop")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    a = ap.parse_args(argv)
    model, ids, mask = build(a.device, a.big)
    kw = gen_kwargs(ids, mask, a.new_tokens)
    bare_loop(model, kw, 1, a.device)  # warm-up (allocator, kernels)

    rates = [sampler_cost(model, kw, a.device, hz, a.duration) for hz in (10.0, 50.0)]

    bare, sess, setup, bare_cpu, sess_cpu = [], [], [], [], []
    collectors: list[str] = []
    for _ in range(a.pairs):
        tps, cpu = bare_loop(model, kw, a.iters, a.device)
        bare.append(tps)
        bare_cpu.append(cpu)
        tps, cpu, s, fixed = session_loop(model, kw, a.iters, a.device)
        sess.append(tps)
        sess_cpu.append(cpu)
        setup.append(fixed)
        collectors = sorted(s.collectors)
    ratios = [x / y for x, y in zip(sess, bare)]
    cpu_ratios = [x / y for x, y in zip(sess_cpu, bare_cpu)]
    report = {
        "device": a.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "model": "llama 1024x8" if a.big else "llama 64x2",
        "batch": int(ids.shape[0]), "new_tokens": a.new_tokens, "iters_per_loop": a.iters,
        "sampler": rates,
        "end_to_end": {
            "collectors": collectors, "pairs": a.pairs,
            "bare_tokens_per_s_median": round(statistics.median(bare), 2),
            "session_tokens_per_s_median": round(statistics.median(sess), 2),
            "median_ratio_session_over_bare": round(statistics.median(ratios), 4),
            "ratios": [round(r, 4) for r in ratios],
            "median_cpu_s_per_token_ratio_session_over_bare": round(statistics.median(cpu_ratios), 4),
            "cpu_ratios": [round(r, 4) for r in cpu_ratios],
            "session_setup_and_finalize_s_median": round(statistics.median(setup), 4),
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

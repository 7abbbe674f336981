"""Measure a Hugging Face causal LM in your own code.

    python examples/hf_model.py                      # the embedded tiny model
    python examples/hf_model.py --model ./my-model   # a local checkpoint folder (or a hub id)
"""

from __future__ import annotations

import argparse

import perfsdk

PROMPTS = [
    "Explain what a key-value cache does during text generation.",
    "Write a haiku about memory bandwidth.",
    "List three reasons a benchmark can be misleading.",
    "Why does batching raise throughput but also latency?",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny-llama")
    ap.add_argument("--store", default="perfsdk-results")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()

    cfg = perfsdk.Config(name="hf-example", model={"id": args.model}, store=args.store)
    with perfsdk.session(cfg) as s:
        model, tok = s.load()
        batch = s.tokenize(tok, PROMPTS)
        with s.warmup():  # excluded from the statistics, but counted
            s.generate(model, **batch, max_new_tokens=4)
        for _ in range(3):
            out = s.generate(model, **batch, max_new_tokens=args.max_new_tokens, do_sample=False)
    lat = s.result.collectors["latency"]
    print(f"run {s.result.run_id}: status {s.result.status}")
    print(f"TTFT p50 {lat['ttft_s']['p50'] * 1e3:.2f} ms, TPOT p50 {lat['tpot_s']['p50'] * 1e3:.2f} ms, "
          f"{lat['output_tokens_per_s']:.1f} output tokens/s over {lat['output_tokens']} tokens")
    print("first completion:", tok.decode(out[0][batch["input_ids"].shape[1]:], skip_special_tokens=True)[:80])


if __name__ == "__main__":
    main()

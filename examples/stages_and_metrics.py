"""Time your own pipeline stages and store your own metrics with the run.

A vision-language-style pipeline: preprocessing and an "encoder" stage around generation,
plus an accuracy figure recorded with s.record.

    python examples/stages_and_metrics.py
"""

from __future__ import annotations

import argparse

import torch

import perfsdk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="perfsdk-results")
    args = ap.parse_args()

    cfg = {"name": "stages-example", "store": args.store}
    with perfsdk.session(cfg) as s:
        model, tok = s.load()
        answers = []
        for question in ["What is 2 + 2?", "Name a prime number.", "What colour is the sky?"]:
            with s.stage("preprocess"):
                prompt = f"Question: {question}\nAnswer:"
            with s.stage("vision_encoder"):
                # stand-in for an image encoder: a fixed matmul workload
                feats = torch.randn(64, 256) @ torch.randn(256, 256)
            batch = s.tokenize(tok, [prompt])
            out = s.generate(model, **batch, max_new_tokens=8)
            answers.append(tok.decode(out[0][batch["input_ids"].shape[1]:], skip_special_tokens=True))
        # a random-weight model answers nothing right; a real one would be scored here
        s.record("accuracy", sum(a.strip() != "" for a in answers) / len(answers) * 0.0, unit="ratio")
        s.record("encoder_feature_norm", float(feats.norm()), unit="l2")
    r = s.result
    stages = r.collectors["latency"]["stages"]
    for name, st in stages.items():
        print(f"stage {name}: {st['count']} calls, mean {st['mean'] * 1e3:.3f} ms")
    print("records:", {rec.name: rec.value for rec in r.records})


if __name__ == "__main__":
    main()

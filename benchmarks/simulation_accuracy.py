"""How wrong is the simulation? Calibrate a host profile, then predict configurations not used
for fitting and compare with measurement.

Protocol
--------
1. Calibrate (``perfsdk.simulation.calibration``, as ``perfsdk calibrate`` does): the
   ``builtin:tiny-llama-medium`` configuration (hidden 512) at 8, 4, 2 and 1 layers and narrowed
   to width 64 at 8 and 2 layers, on a grid of batch sizes and prompt lengths in
   ``--calibration-passes`` round-robin passes, plus three micro-kernels (a 1024^3 matmul, a
   3 x 64 MiB add, a chain of tiny kernels).
2. Predict, with the calibrated profile and the analytic op generator (no timing information),
   families the fit never sees (``FAMILY_MODELS``: GPT-2, Qwen2 with tied embeddings, Phi-3, a
   small Mixtral with a sliding window, built from their ``transformers`` config classes) and three
   other Llama sizes (``tiny-llama-small``, ``tiny-llama``, ``tiny-llama-large``) x batch sizes
   {1, 4} x output lengths {8, 32} at a 32-token prompt (``--models`` picks the sets).
3. Measure the same configurations (TTFT = generate start to first token, TPOT = decode time
   / (output tokens - 1)). Each is measured ``--repeats`` times (after one warm-up) in each of
   ``--passes`` round-robin passes over all configurations, and the fastest time is kept (each
   decode step's fastest): on a shared machine load comes and goes, and spreading the repeats
   over time lets each configuration meet a quiet moment. The measurement passes alternate with
   the ``--calibrations`` calibrations (measure, calibrate, measure, calibrate, measure), so that
   a drift of the machine's speed over minutes hits both sides alike. Report the signed error ``(predicted - measured) / measured``
   and the median and worst absolute error over the other families.

Run: ``PYTHONPATH=src python benchmarks/simulation_accuracy.py [--threads 1] [--repeats 3]
[--json out.json] [--markdown out.md]``. Random weights, nothing downloaded; about 75 s on two
cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TEST_MODELS = ["builtin:tiny-llama-small", "builtin:tiny-llama", "builtin:tiny-llama-large"]
# families the calibration never sees: plain MLP + LayerNorm + GELU + biases + fused QKV (GPT-2),
# biased QKV + tied embeddings (Qwen2), fused QKV and gate/up (Phi-3), experts + sliding window (Mixtral)
FAMILY_MODELS = ["family:gpt2", "family:qwen2-tied", "family:phi3", "family:mixtral-swa"]
# more families (``--models extra``): per-head query/key norms (Qwen3), offset norms and GeGLU
# (Gemma), four norms per layer and capped eager attention (Gemma 2), parallel residual with
# partial rotary (GPT-NeoX), biased plain MLP with GQA (StarCoder2), full query/key norms (OLMo 2),
# scaled residuals (Granite), shared expert with a gate (Qwen2-MoE)
EXTRA_FAMILY_MODELS = ["family:qwen3", "family:gemma", "family:gemma2", "family:gpt-neox", "family:starcoder2",
                       "family:olmo2", "family:granite", "family:qwen2-moe"]


def family_config(name: str) -> object:
    """A small configuration of another family, built from its transformers config class."""
    import transformers as t
    from transformers import GPT2Config, MixtralConfig, Phi3Config, Qwen2Config

    common = dict(vocab_size=8192, max_position_embeddings=512)
    if name == "qwen3":
        return t.Qwen3Config(hidden_size=384, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=6,
                             num_key_value_heads=2, head_dim=64, **common)
    if name == "gemma":
        return t.GemmaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=1, head_dim=64, **common)
    if name == "gemma2":
        return t.Gemma2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=64, sliding_window=16, **common)
    if name == "gpt-neox":
        return t.GPTNeoXConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=6,
                               **common)
    if name == "starcoder2":
        return t.Starcoder2Config(hidden_size=384, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=6,
                                  num_key_value_heads=2, **common)
    if name == "olmo2":
        return t.Olmo2Config(hidden_size=320, intermediate_size=896, num_hidden_layers=5, num_attention_heads=5,
                             pad_token_id=0, **common)
    if name == "granite":
        return t.GraniteConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=6,
                               num_key_value_heads=2, **common)
    if name == "qwen2-moe":
        return t.Qwen2MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                                shared_expert_intermediate_size=512, num_experts=4, num_experts_per_tok=2,
                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, **common)

    if name == "gpt2":
        return GPT2Config(n_embd=384, n_layer=4, n_head=6, vocab_size=8192, n_positions=512)
    if name == "qwen2-tied":
        return Qwen2Config(hidden_size=384, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=6,
                           num_key_value_heads=2, vocab_size=16384, tie_word_embeddings=True,
                           max_position_embeddings=512)
    if name == "phi3":
        return Phi3Config(hidden_size=320, intermediate_size=896, num_hidden_layers=5, num_attention_heads=5,
                          num_key_value_heads=5, vocab_size=8192, max_position_embeddings=512,
                          original_max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "mixtral-swa":
        return MixtralConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=8192,
                             sliding_window=16, max_position_embeddings=512)
    raise ValueError(f"unknown family {name!r}")


def build_model(spec: str) -> object:
    """``builtin:NAME`` via the calibration's builder, ``family:NAME`` from :func:`family_config`."""
    from perfsdk.simulation.calibration import build_random_model

    if not spec.startswith("family:"):
        return build_random_model(spec)
    import torch
    from transformers import AutoModelForCausalLM

    cfg = family_config(spec.removeprefix("family:"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
    return model
BATCHES = [1, 4]
OUTPUTS = [8, 32]
INPUT_TOKENS = 32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: least sensitive to a shared machine)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--calibration-passes", type=int, default=3, help="round-robin passes of the calibration (perfsdk calibrate's default)")
    ap.add_argument("--calibration-repeats", type=int, default=3,
                    help="repeats per configuration and pass of the calibration (perfsdk calibrate's default)")
    ap.add_argument("--min-time", type=float, default=0.2,
                    help="seconds each configuration is timed for at least, per pass, in the calibration and the "
                         "measurement (cheap configurations get more repeats)")
    ap.add_argument("--calibrations", type=int, default=2,
                    help="independent calibrations, one after the other: the table uses the first, and their "
                         "predictions are compared (reproducibility)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu",
                    help="cpu: process CPU time (with 1 thread, immune to other processes holding the cores)")
    ap.add_argument("--models", choices=["all", "llama", "families", "extra"], default="all",
                    help="which predicted models: the llama sizes, the four other families, both (all), or "
                         "eight more families (extra)")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--markdown", help="write the table as Markdown here")
    ap.add_argument("--profile-out", help="write the calibrated profile YAML here")
    args = ap.parse_args(argv)

    import torch

    from perfsdk.hardware.profile import profile_to_yaml
    from perfsdk.simulation.calibration import (DEFAULT_CALIBRATION_MODELS, Measurement, calibrate_here,
                                                measure_generate, profile_from_fit)
    from perfsdk.simulation.predictor import simulate_model
    from perfsdk.models.arch import architecture_from_config

    torch.set_num_threads(args.threads)
    t0 = time.time()
    specs = {"all": TEST_MODELS + FAMILY_MODELS, "llama": TEST_MODELS, "families": FAMILY_MODELS,
             "extra": EXTRA_FAMILY_MODELS}[args.models]
    models = {spec: build_model(spec) for spec in specs}
    configs = [(spec, b, o) for spec in specs for b in BATCHES for o in OUTPUTS]
    best: dict[tuple[str, int, int], Measurement] = {}

    def measure_pass(p: int) -> None:
        for spec, b, o in configs:
            m = measure_generate(models[spec], b, INPUT_TOKENS, o, repeats=args.repeats, label=spec, seed=p,
                                 clock=args.clock, min_time_s=args.min_time)
            prev = best.get((spec, b, o))
            best[(spec, b, o)] = m if prev is None else prev.merged(m)
        print(f"measurement pass {p + 1}/{args.passes} done at {time.time() - t0:.0f} s", file=sys.stderr,
              flush=True)

    def calibrate(k: int) -> None:
        tc = time.time()
        fit, _ = calibrate_here(list(DEFAULT_CALIBRATION_MODELS), repeats=args.calibration_repeats,
                                threads=args.threads, clock=args.clock, passes=args.calibration_passes,
                                min_time_s=args.min_time)
        fits.append(fit)
        profiles.append(profile_from_fit(fit, name="host-calibrated", note="benchmarks/simulation_accuracy.py"))
        print(f"calibration {k + 1} in {time.time() - tc:.0f} s: {json.dumps(fit.coefficients)}, "
              f"matmul_half_rows {fit.matmul_half_rows:.2f}, pack_rows {fit.pack_rows}, "
              f"cache {fit.cache_bytes / 1e6:g} MB, passes {fit.drift_pct or 0:.1f} % apart", file=sys.stderr)
        print("in-sample errors %: " + ", ".join(f"{k}: {v:+.1f}" for k, v in fit.errors_pct.items()),
              file=sys.stderr)

    # measurement passes and calibrations alternate (measure, calibrate, measure, calibrate,
    # measure …): this machine's speed drifts over minutes, and alternating lets both sides see
    # the same moments instead of the calibration one period and the measurement the next
    profiles, fits = [], []
    p = 0
    for k in range(max(args.calibrations, args.passes)):
        if p < args.passes:
            measure_pass(p)
            p += 1
        if k < args.calibrations:
            calibrate(k)
    while p < args.passes:
        measure_pass(p)
        p += 1
    fit, profile = fits[0], profiles[0]
    if args.profile_out:
        with open(args.profile_out, "w", encoding="utf-8") as fh:
            fh.write(profile_to_yaml(profile))
    rows = []
    for spec, b, o in configs:
        shape = architecture_from_config(models[spec].config)
        preds = [simulate_model(shape, prof, name=spec, batch_size=b, input_tokens=INPUT_TOKENS, output_tokens=o,
                                dtype="float32") for prof in profiles]
        pred = preds[0]
        ttft, tpot = best[(spec, b, o)].ttft_s, best[(spec, b, o)].tpot_s or 0.0
        row = {
            "model": spec.split(":", 1)[-1], "family": spec.startswith("family:"), "batch": b, "input_tokens": INPUT_TOKENS, "output_tokens": o,
            "ttft_measured_ms": ttft * 1e3, "ttft_predicted_ms": pred.ttft_s * 1e3,
            "ttft_error_pct": 100 * (pred.ttft_s - ttft) / ttft,
            "tpot_measured_ms": tpot * 1e3, "tpot_predicted_ms": (pred.tpot_s or 0) * 1e3,
            "tpot_error_pct": 100 * ((pred.tpot_s or 0) - tpot) / tpot,
            # every calibration's predictions, and their largest relative difference
            "ttft_predicted_ms_each": [q.ttft_s * 1e3 for q in preds],
            "tpot_predicted_ms_each": [(q.tpot_s or 0) * 1e3 for q in preds],
            "ttft_error_pct_each": [100 * (q.ttft_s - ttft) / ttft for q in preds],
            "tpot_error_pct_each": [100 * ((q.tpot_s or 0) - tpot) / tpot for q in preds],
        }
        row["calibration_spread_pct"] = max(
            100 * (max(v) / min(v) - 1) for v in (row["ttft_predicted_ms_each"], row["tpot_predicted_ms_each"]))
        rows.append(row)
        print(f"{row['model']:18s} b{b} out{o:<3d} TTFT {row['ttft_measured_ms']:8.2f} ms pred "
              f"{row['ttft_predicted_ms']:8.2f} ({row['ttft_error_pct']:+6.1f}%)  TPOT "
              f"{row['tpot_measured_ms']:7.2f} ms pred {row['tpot_predicted_ms']:7.2f} "
              f"({row['tpot_error_pct']:+6.1f}%)  calibrations differ by {row['calibration_spread_pct']:.1f}%",
              file=sys.stderr, flush=True)

    errs = [abs(r[k]) for r in rows for k in ("ttft_error_pct", "tpot_error_pct")]
    fam_rows = [r for r in rows if r["family"]]
    fam = [abs(r[k]) for r in fam_rows for k in ("ttft_error_pct", "tpot_error_pct")]
    per_cal = []
    for k in range(len(profiles)):
        e = [abs(r[f"{x}_error_pct_each"][k]) for r in fam_rows for x in ("ttft", "tpot")]
        per_cal.append({"family_median_abs_error_pct": statistics.median(e) if e else None,
                        "family_max_abs_error_pct": max(e) if e else None})
    summary = {"family_median_abs_error_pct": statistics.median(fam) if fam else None,
               "family_max_abs_error_pct": max(fam) if fam else None,"median_abs_error_pct": statistics.median(errs), "max_abs_error_pct": max(errs),
               "ttft_median_abs_error_pct": statistics.median(abs(r["ttft_error_pct"]) for r in rows),
               "tpot_median_abs_error_pct": statistics.median(abs(r["tpot_error_pct"]) for r in rows),
               "per_calibration": per_cal,
               "family_calibration_spread_pct": max((r["calibration_spread_pct"] for r in fam_rows), default=None),
               "calibration_spread_pct": max(r["calibration_spread_pct"] for r in rows),
               "threads": args.threads, "repeats": args.repeats, "passes": args.passes, "clock": args.clock,
               "calibration_drift_pct": [f.drift_pct for f in fits],
               "wall_s": time.time() - t0, "calibration": {**fit.coefficients,
                                                          "matmul_half_rows": fit.matmul_half_rows,
                                                          "pack_rows": fit.pack_rows, "cache_bytes": fit.cache_bytes}}
    lines = ["| model | batch | out | TTFT meas. ms | TTFT pred. ms | TTFT err % | TPOT meas. ms | TPOT pred. ms | TPOT err % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['output_tokens']} | {r['ttft_measured_ms']:.2f} | "
                     f"{r['ttft_predicted_ms']:.2f} | {r['ttft_error_pct']:+.1f} | {r['tpot_measured_ms']:.2f} | "
                     f"{r['tpot_predicted_ms']:.2f} | {r['tpot_error_pct']:+.1f} |")
    lines.append("")
    lines.append(f"Median |error| {summary['median_abs_error_pct']:.1f}% (TTFT {summary['ttft_median_abs_error_pct']:.1f}%, "
                 f"TPOT {summary['tpot_median_abs_error_pct']:.1f}%), worst {summary['max_abs_error_pct']:.1f}%.")
    if fam:
        lines.append(f"Other families: median |error| {statistics.median(fam):.1f}%, worst {max(fam):.1f}%.")
    if len(profiles) > 1:
        lines.append("Each calibration, other families: " + "; ".join(
            f"median {c['family_median_abs_error_pct']:.1f}%, worst {c['family_max_abs_error_pct']:.1f}%"
            for c in per_cal if c["family_median_abs_error_pct"] is not None) + ".")
        lines.append(f"Calibrations' predictions differ by at most {summary['calibration_spread_pct']:.1f}% "
                     f"(other families {summary['family_calibration_spread_pct'] or 0:.1f}%).")
    lines.append("Each calibration's slowest pass over its fastest (median over configurations): " + ", ".join(
        f"+{d:.1f}%" for d in summary["calibration_drift_pct"] if d is not None) + ".")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "summary": summary}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

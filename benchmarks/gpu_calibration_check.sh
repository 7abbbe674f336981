#!/usr/bin/env bash
# A calibration of a GPU from stored runs, judged on families it never saw (part of gpu_check.sh).
#
#   benchmarks/gpu_calibration_check.sh OUTDIR [PYTHON]
#
# 1. `perfsdk sweep`: the four built-in Llama sizes (hidden 128-768, 2-12 layers) and a 4-layer cut
#    of the largest (model.config_overrides), batch 1 and 8, builtin:mixed prompts (several prompt
#    lengths per run), 16 new tokens, stored with the latency collector only;
# 2. `perfsdk calibrate --from-store`: the GPU's fitted profile, with its bootstrap refits and
#    held-out errors (what the intervals are drawn from);
# 3. random-weight checkpoints of three families the fit never saw (Qwen2 with grouped-query
#    attention and biased QKV, GPT-2, OPT), measured by `perfsdk sweep` at batch 1 and 8 with the
#    simulation collector predicting the measured device from that profile (`host:`): each
#    prefill and TPOT predicted, measured and judged inside or outside the 90 % interval.
# GPU_CHECK_SMOKE=1 runs the same steps on the CPU (float32, small shapes).
set -u
OUT=${1:?usage: benchmarks/gpu_calibration_check.sh OUTDIR [PYTHON]}
PY=${2:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
WORK=$(mktemp -d)
if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then DEV=cpu; DT=float32; NP=4; SIZES="tiny-llama-small tiny-llama"; else
  DEV=cuda; DT=bfloat16; NP=8; SIZES="tiny-llama-small tiny-llama tiny-llama-medium tiny-llama-large"; fi
ids=""; for s in $SIZES; do ids="$ids, \"builtin:$s\""; done
cat > "$WORK/cal-sweep.yaml" <<YAML
name: gpu-calibration
base:
  name: gpu-cal
  model: {id: "builtin:tiny-llama-small", dtype: $DT, device: $DEV}
  workload: {prompts: "builtin:mixed", num_prompts: $NP, generate: {max_new_tokens: 16, min_new_tokens: 16},
             warmup_runs: 1, min_iterations: 2}
  collectors: {latency: {}, energy: false, utilization: false}
  exporters: []
axes:
  model.id: [${ids#, }]
  workload.batching.batch_size: [1, 8]
YAML
# the largest size cut to 4 layers as well: a second depth of one width
sed -e 's/^name: gpu-calibration/name: gpu-calibration-depth/' -e "s/model.id: .*/model.id: [\"builtin:${SIZES##* }\"]\n  model.config_overrides.num_hidden_layers: [2]/" \
  "$WORK/cal-sweep.yaml" > "$WORK/cal-sweep-depth.yaml"
echo "=== calibration runs ($(date -u +%H:%M:%S))"
timeout 200 "$PY" -m perfsdk sweep "$WORK/cal-sweep.yaml" --store "$WORK/cal-store" -q; echo "exit $?"
timeout 60 "$PY" -m perfsdk sweep "$WORK/cal-sweep-depth.yaml" --store "$WORK/cal-store" -q; echo "exit $?"
echo "=== calibrate --from-store ($(date -u +%H:%M:%S))"
timeout 240 "$PY" -m perfsdk calibrate --from-store "$WORK/cal-store" --name gpu-calibrated -o "$OUT/gpu-calibrated.yaml" \
  2> "$OUT/calibrate.err"; echo "exit $?"
tail -n 12 "$OUT/calibrate.err"

echo "=== checkpoints of three other families ($(date -u +%H:%M:%S))"
timeout 60 "$PY" - "$WORK" "$DEV" <<'PY'
import shutil, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from perfsdk.models.tiny import ensure_tiny_llama
work, dev = sys.argv[1], sys.argv[2]
tok = ensure_tiny_llama("tiny-llama")
common = dict(vocab_size=4096, bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
families = {
    "qwen2": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=2048, **common),
    "gpt2": dict(n_embd=512, n_layer=6, n_head=8, n_positions=2048, **common),
    "opt": dict(hidden_size=512, ffn_dim=2048, num_hidden_layers=6, num_attention_heads=8,
                max_position_embeddings=2048, word_embed_proj_dim=512, **common),
}
for name, kw in families.items():
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(name, **kw)
    m = AutoModelForCausalLM.from_config(cfg)
    m.save_pretrained(f"{work}/{name}")
    for f in tok.iterdir():
        if "token" in f.name:
            shutil.copy(f, f"{work}/{name}")
    print(name, sum(p.numel() for p in m.parameters()), "parameters")
PY
cat > "$WORK/held-sweep.yaml" <<YAML
name: gpu-held-out
base:
  name: gpu-held-out
  model: {id: "$WORK/qwen2", dtype: $DT, device: $DEV}
  workload: {prompts: "builtin:mixed", num_prompts: $NP, generate: {max_new_tokens: 16, min_new_tokens: 16},
             warmup_runs: 1, min_iterations: 2}
  collectors: {latency: {}, energy: false, utilization: false,
               simulation: {targets: [], host: "$OUT/gpu-calibrated.yaml"}}
  exporters: []
axes:
  model.id: ["$WORK/qwen2", "$WORK/gpt2", "$WORK/opt"]
  workload.batching.batch_size: [1, 8]
YAML
echo "=== families the fit never saw, predicted with their interval ($(date -u +%H:%M:%S))"
timeout 200 "$PY" -m perfsdk sweep "$WORK/held-sweep.yaml" --store "$WORK/held-store" -q; echo "exit $?"
"$PY" - "$WORK/held-store" "$OUT/held-out.json" <<'PY'
import json, sys
from perfsdk.store import Store
st = Store(sys.argv[1])
rows = []
for rid in st.run_ids():
    run = st.get(rid)
    sim = run.collector_result("simulation")
    comp = getattr(sim, "comparison", None) or {}
    lat = run.collector_result("latency")
    row = {"model": run.model.model_id.rsplit("/", 1)[-1], "batch": run.config["workload"]["batching"]["batch_size"],
           "status": run.status}
    for ph in ("prefill", "tpot"):
        c = comp.get(ph) if isinstance(comp, dict) else getattr(comp, ph, None)
        if c is None:
            continue
        c = c if isinstance(c, dict) else c.model_dump()
        row[ph] = {k: c.get(k) for k in ("measured_s", "predicted_s", "predicted_low_s", "predicted_high_s",
                                          "error_pct", "inside_interval", "compared_steps")}
    rows.append(row)
    def f(c):
        if not c:
            return "-"
        lo, hi = c["predicted_low_s"], c["predicted_high_s"]
        band = f" ({lo * 1e3:.2f}-{hi * 1e3:.2f})" if lo is not None else " (no interval)"
        return (f"{c['measured_s'] * 1e3:.2f} ms, {c['predicted_s'] * 1e3:.2f}{band} {c['error_pct']:+.1f} % "
                f"{'inside' if c['inside_interval'] else 'OUTSIDE' if c['inside_interval'] is False else ''}")
    print(f"{row['model']:>18} b{row['batch']}: prefill {f(row.get('prefill'))} | TPOT {f(row.get('tpot'))}")
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
# both stores, for a look at the runs afterwards (perfsdk runs / export --store)
tar -czf "$OUT/stores.tgz" -C "$WORK" cal-store held-store

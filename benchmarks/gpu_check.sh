#!/usr/bin/env bash
# The GPU check in one go, for a machine with one NVIDIA GPU (and no network).
#
#   benchmarks/gpu_check.sh OUTDIR [PYTHON]
#
# 1. the GPU, driver and library versions, and `perfsdk doctor`;
# 2. benchmarks/gpu_energy_check.py: NVML energy per phase, power, utilization, CUDA memory, the
#    validity verdict (clocks, throttle reasons) and the session's step times against CUDA events;
# 3. benchmarks/gpu_cold_shapes.py: what a batch's first run costs, per attention backend;
# 4. `perfsdk run benchmarks/gpu_run.yaml` on a local bf16 checkpoint of a 0.5 B-parameter Llama
#    shape (random weights, written first), as bf16, float8 (e4m3), bitsandbytes 8-bit and 4-bit:
#    latency, memory, energy, utilization, FLOPs/MFU and the simulation of the GPU it runs on;
#    bf16 once more with the warm-up left to warmup_runs alone (bf16-cold);
# 5. the stored runs exported as CSV, and the store packed as one archive;
# 6. benchmarks/gpu_calibration_check.sh: the GPU calibrated from stored runs of four Llama sizes,
#    and three families it never saw predicted with their 90 % interval (part "calibration").
# GPU_CHECK_PARTS (default: info,energy,cold,runs,calibration) and GPU_CHECK_VARIANTS (default: bf16 fp8
# bnb-8bit bnb-4bit bf16-cold) choose what runs.
# Each part has its own time limit; one that fails is reported and the others still run.
# GPU_CHECK_SMOKE=1 runs the same steps on the CPU with a small shape (to try the script itself).
set -u
OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR [PYTHON]}
PY=${2:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PERFSDK_CACHE_DIR=${PERFSDK_CACHE_DIR:-/tmp/perfsdk-cache}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
STORE=$(mktemp -d)/store
CKPT=$(mktemp -d)/llama-0.5b-bf16
PARTS=",${GPU_CHECK_PARTS:-info,energy,cold,runs,calibration},"
VARIANTS=${GPU_CHECK_VARIANTS:-bf16 fp8 bnb-8bit bnb-4bit bf16-cold}
want() { case "$PARTS" in *",$1,"*) return 0;; *) return 1;; esac; }
SMOKE=${GPU_CHECK_SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  ENERGY_ARGS="--device cpu --batch 2 --input-tokens 16 --new-tokens 8 --steps 2 --forward-steps 3"
  SHAPE="hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4, head_dim=64"
  RUN_ARGS="--set model.device=cpu --set model.dtype=float32 --set workload.num_prompts=4 --set workload.min_iterations=1"
else
  ENERGY_ARGS=""
  SHAPE="hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16, head_dim=128"
  RUN_ARGS=""
fi
part() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

if want info; then
part "GPU and libraries"
[ "$SMOKE" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,clocks.sm,temperature.gpu,pstate --format=csv
"$PY" - <<'PY'
import importlib
for name in ("torch", "transformers", "tokenizers", "pydantic", "pynvml", "bitsandbytes", "codecarbon"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')}")
    except Exception as exc:
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
import torch
if torch.cuda.is_available():
    print("cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
PY

part "perfsdk doctor"
timeout 40 "$PY" -m perfsdk doctor
fi

if want energy; then
part "energy, utilization, memory, validity, CUDA events (gpu_energy_check.py)"
timeout 140 "$PY" benchmarks/gpu_energy_check.py $ENERGY_ARGS --json "$OUT/energy.json" > /dev/null 2> "$OUT/energy.err"
echo "exit $?"
"$PY" - "$OUT/energy.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no energy.json:", exc); sys.exit(0)
e, v = d["energy"], d.get("validity") or {}
print("status", d["status"], "errors", d["errors"])
print("energy status", e["status"], "key", e["key"], "J/token", e["j_per_output_token"], "low-confidence windows",
      e["low_confidence_windows"], "of", e["windows"])
for ph, x in (e["per_phase"] or {}).items():
    print(f"  {ph}: {x}")
print("J per output token per phase", e.get("j_per_output_token_per_phase"))
print("notes", e.get("notes"))
print("validity", v.get("verdict"), v.get("reasons"))
print("NVML refresh", d.get("nvml_refresh"))
print("clock check", d.get("clock_check"))
print("memory", {k: (d["memory"] or {}).get(k) for k in ("cuda_peak_allocated_bytes", "cuda_peak_reserved_bytes", "kv_cache_bytes", "kv_cache_source", "weights_bytes")})
PY

fi

if want cold && [ "$SMOKE" != 1 ]; then
part "first runs of new shapes, per attention backend (gpu_cold_shapes.py)"
timeout 200 "$PY" benchmarks/gpu_cold_shapes.py --json "$OUT/cold.json"
echo "exit $?"
fi

if want runs; then
part "a local bf16 checkpoint (random weights)"
timeout 60 "$PY" - "$CKPT" "$SHAPE" <<'PY'
import shutil, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from perfsdk.models.tiny import ensure_tiny_llama
src = ensure_tiny_llama("tiny-llama")
torch.manual_seed(0)
shape = dict((k.strip(), int(v)) for k, v in (x.split("=") for x in sys.argv[2].split(",")))
cfg = LlamaConfig(**shape, num_key_value_heads=4, vocab_size=4096, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(sys.argv[1])
for f in src.iterdir():
    if "token" in f.name or f.name == "special_tokens_map.json":
        shutil.copy(f, sys.argv[1])
print(sys.argv[1], sum(p.numel() for p in m.parameters()), "parameters")
PY

for name in $VARIANTS; do
  case "$name" in
    bf16) extra="";;
    fp8) extra="--set model.dtype=float8_e4m3fn";;
    bnb-8bit) extra="--set model.quantization=bnb-8bit";;
    bnb-4bit) extra="--set model.quantization=bnb-4bit";;
    bf16-cold) extra="--set workload.warmup_every_batch=false";;
    *) echo "unknown variant $name"; continue;;
  esac
  part "perfsdk run ($name)"
  # shellcheck disable=SC2086
  timeout 65 "$PY" -m perfsdk run benchmarks/gpu_run.yaml --set model.id="$CKPT" --set name="gpu-$name" $extra $RUN_ARGS \
    --store "$STORE" > "$OUT/run.log" 2>&1
  echo "exit $?"
  { echo "=== $name"; cat "$OUT/run.log"; } >> "$OUT/runs.log"
  grep -E -A6 "error|validity:|Predicted vs measured|Summary" "$OUT/run.log" | grep -v MatMul8bitLt | head -n 30
done

part "stored runs"
"$PY" -m perfsdk runs --store "$STORE"
"$PY" -m perfsdk export --format csv --store "$STORE" --output "$OUT/runs.csv"
tar -czf "$OUT/store.tgz" -C "$(dirname "$STORE")" store
rm -f "$OUT/run.log"
fi
if want calibration; then
part "a calibration from stored runs, judged on other families (gpu_calibration_check.sh)"
timeout 540 bash benchmarks/gpu_calibration_check.sh "$OUT/calibration" "$PY"
echo "exit $?"
fi
ls -la "$OUT"

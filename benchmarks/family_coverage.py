"""Which families of the installed ``transformers`` ``perfsdk flops`` and ``perfsdk simulate`` handle.

For every model type ``transformers`` maps to a causal-LM or sequence-to-sequence class (or those
named with ``--families``), a small config is made from the family's own defaults: its widths,
depths, head counts, expert counts and vocabulary shrunk to a few units (a config whose layers
differ keeps up to eight of them, so that each kind of layer stays), and written to a folder. Both
commands then run on that folder in this process, as a user runs them (``flops -b 2 -t 8 -g 4
--json``, ``simulate --hardware h100-sxm`` at the same shape), and each outcome is sorted:

- ``ok``: exit 0;
- ``error``: a clear error (exit 1 or 2 with a ``perfsdk: error:`` line, no traceback): a family
  whose code cannot run without real tensor values, one that does not generate text from token ids,
  or a config ``transformers`` rejects;
- ``crash``: anything else (an uncaught exception): a bug.

The shrinking is generic, so some ``error`` outcomes are of the small config and not of the family
(a default config whose sub-configs disagree once shrunk, a token id beyond the small vocabulary
kept, a field left ``None`` in the defaults that real checkpoints set); ``--show`` prints each
message to tell them apart. Nothing is timed.

Usage: ``PYTHONPATH=src python benchmarks/family_coverage.py [--families llama,olmoe] [--show]
[--json OUT]``; about two minutes for every family on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections import Counter
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=256,
             head_dim=16, moe_intermediate_size=32, n_routed_experts=4, num_experts=4, num_local_experts=4,
             num_experts_per_tok=2, n_embd=64, n_head=4, d_model=64, n_positions=256, encoder_layers=2,
             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, d_ff=128, num_heads=4, d_kv=16, ffn_dim=128, n_inner=128,
             max_position_embeddings=256, shared_expert_intermediate_size=64, first_k_dense_replace=1,
             n_shared_experts=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
             v_head_dim=16, num_decoder_layers=2, word_embed_proj_dim=64, rotary_dim=8, intermediate_size_mlp=128,
             hidden_dim=64)
DEPTH = ("num_hidden_layers", "n_layer", "num_layers")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "start_token_id",
             "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")


def shrink(d: dict[str, Any]) -> None:
    """Shrink a config dict (and its sub-configs) in place."""
    depth = next((d[k] for k in DEPTH if isinstance(d.get(k), int)), None)
    kinds = d.get("layer_types") or d.get("layers_block_type")
    mixed = isinstance(kinds, list) and len(set(map(str, kinds))) > 1
    keep = min(depth, 8) if mixed and depth else 2
    for k, v in d.items():
        if isinstance(v, int) and not isinstance(v, bool):
            if k in DEPTH:
                d[k] = keep
            elif k in SMALL:
                d[k] = SMALL[k]
            elif k in TOKEN_IDS and v >= 200:
                d[k] = 1
    for k, v in list(d.items()):
        if isinstance(v, list) and depth and len(v) == depth and depth != keep:
            d[k] = v[:keep]
        elif isinstance(v, dict) and any(x in v for x in ("hidden_size", *DEPTH)):
            shrink(v)


def small_config(model_type: str, root: str) -> str:
    from transformers import AutoConfig

    d = AutoConfig.for_model(model_type).to_dict()
    shrink(d)
    folder = tempfile.mkdtemp(prefix=f"{model_type}-", dir=root)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(d, f, default=str)
    return folder


class _TimedOut(Exception):
    pass


def outcome(args: list[str], timeout_s: int) -> tuple[str, str]:
    """(``ok`` | ``error`` | ``crash`` | ``timeout``, the last line a user sees or the exception)."""
    import traceback

    from click.testing import CliRunner

    from perfsdk.cli.main import cli

    def alarm(*_: Any) -> None:
        raise _TimedOut()

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout_s)
    try:
        r = CliRunner().invoke(cli, args, catch_exceptions=True)
    except _TimedOut:
        return "timeout", f"over {timeout_s} s"
    finally:
        signal.alarm(0)
    exc = r.exc_info[1] if r.exc_info else None
    if exc is not None and not isinstance(exc, SystemExit):
        return "crash", traceback.format_exception_only(exc)[-1].strip()
    if r.exit_code == 0:
        return "ok", ""
    lines = [x for x in r.output.splitlines() if x.startswith("perfsdk: error:")]
    return ("error", lines[-1]) if lines else ("crash", (r.output.strip().splitlines() or ["(no output)"])[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", help="comma-separated model types (default: every causal-LM and seq2seq one)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per command and family")
    ap.add_argument("--show", action="store_true", help="print each error's message")
    ap.add_argument("--json", dest="json_out", help="write every outcome here")
    a = ap.parse_args()

    import transformers
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)

    from perfsdk.cli.main import register_plugin_commands

    register_plugin_commands()
    families = a.families.split(",") if a.families else sorted(
        set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES))
    shape = ["-b", "2", "-t", "8", "-g", "4"]
    sim_shape = ["--batch-size", "2", "--input-tokens", "8", "--output-tokens", "4"]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as root:
        for t in families:
            try:
                folder = small_config(t, root)
            except Exception as exc:  # transformers' own defaults, shrunk, rejected
                results[t] = {"config": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                print(f"{t:28s} config not made: {results[t]['config']}", flush=True)
                continue
            res = {"flops": outcome(["flops", folder, *shape, "--json"], a.timeout),
                   "simulate": outcome(["simulate", "--model", folder, "--hardware", "h100-sxm", *sim_shape,
                                        "--json"], a.timeout)}
            results[t] = res
            line = f"{t:28s} flops {res['flops'][0]:8s} simulate {res['simulate'][0]:8s}"
            shown = {m for _, m in res.values() if m}
            if a.show or any(k in ("crash", "timeout") for k, _ in res.values()):
                line += "  " + " | ".join(sorted(shown))[:400]
            print(line, flush=True)
    made = {t: r for t, r in results.items() if "config" not in r}
    for cmd in ("flops", "simulate"):
        c = Counter(r[cmd][0] for r in made.values())
        print(f"{cmd}: " + ", ".join(f"{c[k]} {k}" for k in ("ok", "error", "crash", "timeout") if c[k])
              + f" of {len(made)} families (transformers {transformers.__version__}; "
              f"{len(results) - len(made)} more whose shrunk config was not made)")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"transformers": transformers.__version__, "results": results}, f, indent=1)
    sys.exit(0)


if __name__ == "__main__":
    main()

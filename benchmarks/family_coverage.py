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

``--against-full-depth`` checks, besides, the depth rule on every family whose layers repeat
(all alike, or kinds in a pattern, after a lead of other layers or none: see docs/flops.md,
"Depth"): the count from two shallow copies against the count of every layer
(``full_depth=True``), and the simulator's capture from the second copy against the capture of
every layer (operations in order, FLOPs, bytes, KV cache), printing ``period P [after L] of N:
same`` or what differs. ``--mixed-layers N`` keeps up to N layers of a
config whose layers differ (default 8), so that patterns of longer periods repeat; ``--layers N``
keeps N layers of any other config (default 2, which the rule leaves alone: give 5 or more to
check it on families whose layers are all alike).

Usage: ``PYTHONPATH=src python benchmarks/family_coverage.py [--families llama,olmoe] [--show]
[--against-full-depth] [--mixed-layers N] [--layers N] [--json OUT]``; about two minutes for every family on
two cores (about four times that with ``--against-full-depth``).
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


def shrink(d: dict[str, Any], mixed_layers: int = 8, layers: int = 2) -> None:
    """Shrink a config dict (and its sub-configs) in place."""
    depth = next((d[k] for k in DEPTH if isinstance(d.get(k), int)), None)
    kinds = d.get("layer_types") or d.get("layers_block_type")
    mixed = isinstance(kinds, list) and len(set(map(str, kinds))) > 1
    keep = min(depth, mixed_layers) if mixed and depth else min(depth or layers, layers)
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
            shrink(v, mixed_layers, layers)


def small_config(model_type: str, root: str, mixed_layers: int = 8, layers: int = 2) -> str:
    from transformers import AutoConfig

    d = AutoConfig.for_model(model_type).to_dict()
    shrink(d, mixed_layers, layers)
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


def against_full_depth(folder: str) -> str:
    """The depth rule on ``folder``'s config against every layer: count and capture."""
    from perfsdk.flops import meta
    from perfsdk.models.resolve import resolve_config

    cfg = resolve_config(folder)[0]
    try:
        model = meta.meta_model(cfg)
    except Exception as exc:  # the commands fell back on an analytic description
        return f"not built on the meta device ({type(exc).__name__})"
    plan = meta.layer_plan(cfg, model)
    if plan is None:
        return "no repeat (every layer counted)"
    fast, full = meta.count_config(cfg, 2, 8, 4), meta.count_config(cfg, 2, 8, 4, full_depth=True)
    if full.method.startswith("analytic"):
        return "not run on the meta device (its code fails there: counted analytically)"
    counted = any("replicated over all" in n for n in fast.notes)
    count_same = (fast.flops_prefill, fast.flops_decode, fast.macs_total, fast.modules, fast.forwards) == (
        full.flops_prefill, full.flops_decode, full.macs_total, full.modules, full.forwards)

    def ops(c: Any) -> list[Any]:
        return [(o.phase, o.step, o.module_path, o.op, o.flops, o.bytes_read, o.bytes_written) for o in c.ops]

    try:
        grown = meta.capture_generation_ops(cfg, 2, 8, 4, [1, 2, 3])
    except ValueError:  # the commands fell back on an analytic description
        return "not run on the meta device (its code fails there: captured analytically)"
    captured = any("repeated over all" in n for n in grown.notes)
    rule = meta.layer_plan
    meta.layer_plan = lambda config, model: None  # type: ignore[assignment]
    try:
        every = meta.capture_generation_ops(cfg, 2, 8, 4, [1, 2, 3])
    finally:
        meta.layer_plan = rule  # type: ignore[assignment]
    capture_same = ops(grown) == ops(every) and grown.kv_cache_bytes == every.kv_cache_bytes
    used = ", ".join(x for x, y in (("count", counted), ("capture", captured)) if y) or "neither"
    kind = f"period {plan.period}{f' after {plan.lead}' if plan.lead else ''} of {plan.full}"
    if count_same and capture_same:
        return f"{kind}: same (copies used by {used})"
    return (f"{kind}: DIFFERS (count {'same' if count_same else 'differs'}, "
            f"capture {'same' if capture_same else 'differs'}; copies used by {used})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", help="comma-separated model types (default: every causal-LM and seq2seq one)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per command and family")
    ap.add_argument("--show", action="store_true", help="print each error's message")
    ap.add_argument("--json", dest="json_out", help="write every outcome here")
    ap.add_argument("--against-full-depth", action="store_true",
                    help="check the depth rule against every layer, count and capture")
    ap.add_argument("--mixed-layers", type=int, default=8, help="layers kept of a config whose layers differ")
    ap.add_argument("--layers", type=int, default=2, help="layers kept of any other config")
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
                folder = small_config(t, root, a.mixed_layers, a.layers)
            except Exception as exc:  # transformers' own defaults, shrunk, rejected
                results[t] = {"config": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                print(f"{t:28s} config not made: {results[t]['config']}", flush=True)
                continue
            res = {"flops": outcome(["flops", folder, *shape, "--json"], a.timeout),
                   "simulate": outcome(["simulate", "--model", folder, "--hardware", "h100-sxm", *sim_shape,
                                        "--json"], a.timeout)}
            if a.against_full_depth and res["flops"][0] == res["simulate"][0] == "ok":
                try:
                    res["depth"] = ("checked", against_full_depth(folder))
                except Exception as exc:
                    res["depth"] = ("crash", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            results[t] = res
            line = f"{t:28s} flops {res['flops'][0]:8s} simulate {res['simulate'][0]:8s}"
            if "depth" in res:
                line += f" depth: {res['depth'][1]}"
            shown = {m for k, (_, m) in res.items() if m and k != "depth"}
            if a.show or any(k in ("crash", "timeout") for k, _ in res.values()):
                line += "  " + " | ".join(sorted(shown))[:400]
            print(line, flush=True)
    made = {t: r for t, r in results.items() if "config" not in r}
    if a.against_full_depth:
        depth = [r["depth"] for r in made.values() if "depth" in r]
        same = [m for k, m in depth if k == "checked" and ": same" in m]
        print(f"depth rule: {len(same)} families counted and captured as at full depth "
              f"({sum(not m.startswith('period 1 ') for m in same)} of them of layer kinds in a pattern, "
              f"{sum(' after ' in m.split(':')[0] for m in same)} after a lead of other layers), "
              f"{sum('DIFFERS' in m for _, m in depth)} differing, {sum(k == 'crash' for k, _ in depth)} crashed, "
              f"{sum('no repeat' in m for _, m in depth)} with no repeat, "
              f"{sum('not built' in m or 'not run' in m for _, m in depth)} not run on the meta device")
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

"""perfsdk beside GuideLLM on the same local server: TTFT, ITL and throughput ratios.

Starts ``transformers serve`` on the embedded tiny model (one torch thread), writes one JSONL
prompt file both tools read, and for each repetition and concurrency runs perfsdk's openai
backend and GuideLLM (``--guidellm``, the executable of an environment where it is installed),
alternating which goes first. Compared per run (medians over requests):

- TTFT: perfsdk ``ttft_s.p50`` against GuideLLM ``time_to_first_token_ms``;
- ITL: perfsdk ``tpot_s.p50`` against GuideLLM ``inter_token_latency_ms`` (both
  (e2e - TTFT) / (tokens - 1) per request; perfsdk's pooled every-gap ``itl_s.p50`` is printed too);
- output tokens/s: perfsdk ``output_tokens_per_s`` against GuideLLM ``output_tokens_per_second``.

Run it with nothing else busy on the machine:

    python benchmarks/serving_peer.py --guidellm /path/to/venv/bin/guidellm --repeats 3 \\
        --concurrency 1 4 --requests 16 --max-tokens 16 --json peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_perfsdk(url: str, model_dir: str, prompts: Path, requests: int, max_tokens: int, concurrency: int,
                store: Path) -> dict[str, float]:
    import perfsdk
    from perfsdk.models.runner import run_workload

    cfg = {"name": f"peer-c{concurrency}",
           "model": {"endpoint": url, "id": model_dir},
           "workload": {"prompts": str(prompts), "num_prompts": requests, "warmup_runs": 1,
                        "sort_by_length": False, "generate": {"max_new_tokens": max_tokens},
                        "load": {"mode": "concurrency", "concurrency": concurrency}},
           "collectors": {"utilization": False, "energy": False}}
    with perfsdk.session(cfg, store=str(store)) as s:
        run_workload(s)
    lat = s.result.collectors["latency"]  # type: ignore[union-attr]
    return {"ttft_ms": lat["ttft_s"]["p50"] * 1e3, "itl_ms": lat["tpot_s"]["p50"] * 1e3,
            "gap_ms": lat["itl_s"]["p50"] * 1e3, "output_tok_s": lat["output_tokens_per_s"],
            "requests": lat["requests"], "errors": lat["errors"], "verdict": s.result.validity.verdict}  # type: ignore[union-attr]


def run_guidellm(exe: str, url: str, model_dir: str, prompts: Path, requests: int, max_tokens: int,
                 concurrency: int, out_dir: Path) -> dict[str, float]:
    base = url.removesuffix("/v1")
    profile = "kind=synchronous" if concurrency == 1 else f"kind=concurrent,streams={concurrency}"
    cmd = [exe, "run",
           "--backend", f"kind=openai_http,target={base},model={model_dir},request_format=/v1/completions,"
                        f"max_tokens={max_tokens}",
           "--tokenizer", f"kind=hf_auto,model={model_dir}",
           "--data", f"kind=json_file,path={prompts}",
           "--profile", profile, "--constraint", f"kind=max_requests,count={requests}",
           "--output", f"kind=json,path={out_dir / 'benchmarks.json'}", "--disable-console-interactive"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out_dir, timeout=600)
    found = list(out_dir.rglob("benchmarks.json"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"guidellm failed ({proc.returncode}): {proc.stderr[-2000:] or proc.stdout[-2000:]}")
    data = json.loads(found[0].read_text())
    m = data["benchmarks"][0]["metrics"]

    def med(name: str) -> float:
        return float(m[name]["successful"]["median"])

    return {"ttft_ms": med("time_to_first_token_ms"), "itl_ms": med("inter_token_latency_ms"),
            "output_tok_s": float(m["output_tokens_per_second"]["successful"]["mean"]),
            "requests": float(m["request_totals"]["successful"]) if "request_totals" in m else float("nan")}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guidellm", required=True, help="the guidellm executable")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from perfsdk.backends.local_server import TransformersServe
    from perfsdk.models.prompts import load_examples
    from perfsdk.models.tiny import ensure_tiny_llama

    model_dir = str(ensure_tiny_llama("tiny-llama"))
    work = Path(tempfile.mkdtemp(prefix="perfsdk-peer-"))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": e.prompt}) + "\n"
                               for e in load_examples("builtin:mixed", args.requests, 42)))
    server = TransformersServe(Path(model_dir))
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeats):
            for c in args.concurrency:
                order = ["perfsdk", "guidellm"] if rep % 2 == 0 else ["guidellm", "perfsdk"]
                got: dict[str, dict[str, float]] = {}
                for tool in order:
                    t0 = time.strftime("%H:%M:%S")
                    if tool == "perfsdk":
                        got[tool] = run_perfsdk(server.url, model_dir, prompts, args.requests, args.max_tokens, c,
                                                work / "store")
                    else:
                        out = work / f"g-{rep}-{c}"
                        out.mkdir()
                        got[tool] = run_guidellm(args.guidellm, server.url, model_dir, prompts, args.requests,
                                                 args.max_tokens, c, out)
                    got[tool]["start"] = t0  # type: ignore[assignment]
                p, g = got["perfsdk"], got["guidellm"]
                row = {"repeat": rep, "concurrency": c, "order": "/".join(order), "perfsdk": p, "guidellm": g,
                       "ttft_ratio": p["ttft_ms"] / g["ttft_ms"], "itl_ratio": p["itl_ms"] / g["itl_ms"],
                       "throughput_ratio": p["output_tok_s"] / g["output_tok_s"]}
                rows.append(row)
                print(f"rep {rep} c={c} ({row['order']}): perfsdk TTFT {p['ttft_ms']:.2f} ms ITL {p['itl_ms']:.3f} ms "
                      f"(gaps {p['gap_ms']:.3f}) {p['output_tok_s']:.1f} tok/s [{p['verdict']}] | GuideLLM TTFT "
                      f"{g['ttft_ms']:.2f} ms ITL {g['itl_ms']:.3f} ms {g['output_tok_s']:.1f} tok/s | ratios "
                      f"TTFT {row['ttft_ratio']:.3f} ITL {row['itl_ratio']:.3f} tok/s {row['throughput_ratio']:.3f}",
                      flush=True)
    finally:
        server.stop()
    print("\nratio perfsdk / GuideLLM: median (min–max) over repetitions")
    for c in args.concurrency:
        mine = [r for r in rows if r["concurrency"] == c]
        print(f"concurrency {c}: TTFT p50 {spread([r['ttft_ratio'] for r in mine])}, ITL p50 "
              f"{spread([r['itl_ratio'] for r in mine])}, output tokens/s {spread([r['throughput_ratio'] for r in mine])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

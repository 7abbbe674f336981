"""How much load perfsdk's client sustains, against a local server that answers at once.

A minimal streaming responder (raw asyncio, in its own process) answers ``/v1/models`` and
streams ``--tokens`` tokens per ``/v1/completions`` request immediately, with ``usage`` on the
last event. perfsdk's openai backend then offers open-loop constant rates, doubling from
``--start`` requests/s, each for about ``--seconds`` seconds, and for each rate prints:

- the achieved requests/s and streamed tokens/s;
- the p99 lag of each send behind its schedule and of the event loop (the client's own delay);
- the client's CPU time per streamed token (``client_cpu_s_per_token``: this process's CPU time
  over the measured requests, per streamed token).

A rate is *sustained* when the send lag's p99 is under 1 ms, no request failed and the achieved
rate is at least 95 % of the offered one. With ``--guidellm EXE`` GuideLLM runs against the same
responder at the same rates (constant profile), alternating with perfsdk, and its achieved rate
is printed beside; its highest rate reaching 95 % of the offered one gives the ratio. With
``--replay`` the same rates are also sent as a trace (``mode: replay``) and the replay's send
lag is printed.

Run it with nothing else busy on the machine:

    python benchmarks/client_capacity.py --start 50 --max 3200 --seconds 3 --tokens 16 \\
        --guidellm /path/to/venv/bin/guidellm --replay --json capacity.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Pause after each GuideLLM run: its processes outlive its command for a moment, and a
#: measurement beside them is no longer alone on the machine.
SETTLE_S = 5.0


# -- the responder ---------------------------------------------------------------------------------


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def responder(port: int, tokens: int, ready: Any) -> None:
    """Serve until killed: HTTP/1.1 keep-alive, chunked SSE answers sent at once."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if path.endswith("/models"):
                    payload = json.dumps({"object": "list", "data": [{"id": "responder"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                    await writer.drain()
                    continue
                req = json.loads(body or b"{}")
                n = int(req.get("max_tokens") or tokens)
                parts = [_event({"choices": [{"index": 0, "text": " tok"}]}) for _ in range(n)]
                parts.append(_event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                     "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}))
                parts.append(b"data: [DONE]\n\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for p in parts:
                    writer.write(f"{len(p):x}\r\n".encode() + p + b"\r\n")
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# -- perfsdk at one rate -----------------------------------------------------------------------------


def run_perfsdk(url: str, rate: float, seconds: float, tokens: int, store: Path, replay: Path | None = None) -> dict[str, Any]:
    import perfsdk
    from perfsdk.models.runner import run_workload

    n = max(20, int(rate * seconds))
    load: dict[str, Any] = {"mode": "rate", "rate_per_s": rate, "arrival": "constant"}
    if replay is not None:
        replay.write_text("".join(json.dumps({"time_s": k / rate, "input_tokens": 8, "output_tokens": tokens}) + "\n"
                                  for k in range(n)))
        load = {"mode": "replay", "trace": str(replay)}
    cfg = {"name": "capacity", "model": {"endpoint": url, "id": "responder", "request_timeout_s": 30},
           "workload": {"num_prompts": n, "warmup_runs": 2, "generate": {"max_new_tokens": tokens}, "load": load},
           "collectors": {"utilization": False, "energy": False}}
    with perfsdk.session(cfg, store=str(store)) as s:
        run_workload(s)
    lat = s.result.collectors["latency"]  # type: ignore[union-attr]
    return {"offered": rate, "requests": lat["requests"], "errors": lat["errors"],
            "achieved": lat["requests_per_s"], "tokens_per_s": lat["output_tokens_per_s"],
            "send_lag_p99_ms": (lat["client_send_lag_s"]["p99"] or 0) * 1e3,
            "loop_lag_p99_ms": (lat["client_loop_lag_s"]["p99"] or 0) * 1e3,
            "cpu_us_per_token": (lat["client_cpu_s_per_token"] or 0) * 1e6}


def sustained(r: dict[str, Any]) -> bool:
    return r["send_lag_p99_ms"] < 1.0 and r["errors"] == 0 and r["achieved"] >= 0.95 * r["offered"]


def run_guidellm(exe: str, url: str, rate: float, seconds: float, tokens: int, work: Path) -> dict[str, Any]:
    n = max(20, int(rate * seconds))
    prompts = work / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text("".join(json.dumps({"prompt": "hello there how are you"}) + "\n" for _ in range(64)))
    out = work / f"g-{rate:g}"
    out.mkdir(exist_ok=True)
    cmd = [exe, "run", "--backend", f"kind=openai_http,target={url.removesuffix('/v1')},model=responder,"
                                    f"request_format=/v1/completions,max_tokens={tokens}",
           "--tokenizer", f"kind=hf_auto,model={tokenizer_dir()}", "--data", f"kind=json_file,path={prompts}",
           "--profile", f"kind=constant,rate={rate:g}", "--constraint", f"kind=max_requests,count={n}",
           "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-console-interactive"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out, timeout=900)
    time.sleep(SETTLE_S)  # its worker processes wind down before the next measurement
    found = list(out.rglob("benchmarks.json"))
    if proc.returncode != 0 or not found:
        return {"offered": rate, "error": (proc.stderr or proc.stdout)[-500:]}
    m = json.loads(found[0].read_text())["benchmarks"][0]["metrics"]
    return {"offered": rate, "achieved": float(m["requests_per_second"]["successful"]["mean"]),
            "tokens_per_s": float(m["output_tokens_per_second"]["successful"]["mean"])}


def tokenizer_dir() -> str:
    from perfsdk.models.tiny import ensure_tiny_llama

    return str(ensure_tiny_llama("tiny-llama"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=float, default=50.0)
    ap.add_argument("--max", type=float, default=3200.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--guidellm", default=None)
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from perfsdk.backends.local_server import free_port

    port = free_port()
    ready = mp.get_context("spawn").Event()
    proc = mp.get_context("spawn").Process(target=responder, args=(port, args.tokens, ready), daemon=True)
    proc.start()
    ready.wait(30)
    url = f"http://127.0.0.1:{port}/v1"
    work = Path(tempfile.mkdtemp(prefix="perfsdk-capacity-"))
    rows: list[dict[str, Any]] = []
    try:
        rate, k = args.start, 0
        while rate <= args.max:
            order = ["perfsdk", "guidellm"] if k % 2 == 0 else ["guidellm", "perfsdk"]
            row: dict[str, Any] = {"offered": rate, "start": time.strftime("%H:%M:%S")}
            for tool in order:
                if tool == "perfsdk":
                    row["perfsdk"] = run_perfsdk(url, rate, args.seconds, args.tokens, work / "store")
                elif args.guidellm:
                    row["guidellm"] = run_guidellm(args.guidellm, url, rate, args.seconds, args.tokens, work)
            if args.replay:
                row["replay"] = run_perfsdk(url, rate, args.seconds, args.tokens, work / "store", work / "trace.jsonl")
            p = row["perfsdk"]
            line = (f"{rate:8.0f}/s: perfsdk achieved {p['achieved']:.1f}/s, {p['tokens_per_s']:.0f} tok/s, send lag p99 "
                    f"{p['send_lag_p99_ms']:.3f} ms, loop lag p99 {p['loop_lag_p99_ms']:.3f} ms, "
                    f"{p['cpu_us_per_token']:.1f} µs CPU/token, errors {p['errors']}"
                    f" {'sustained' if sustained(p) else 'NOT sustained'}")
            if "guidellm" in row:
                g = row["guidellm"]
                line += (f" | GuideLLM achieved {g['achieved']:.1f}/s" if "achieved" in g else f" | GuideLLM failed: {g['error']}")
            if "replay" in row:
                line += f" | replay send lag p99 {row['replay']['send_lag_p99_ms']:.3f} ms"
            print(line, flush=True)
            rows.append(row)
            rate *= 2
            k += 1
    finally:
        proc.kill()
    best = max((r["offered"] for r in rows if sustained(r["perfsdk"])), default=None)
    print(f"\nperfsdk sustains up to {best} requests/s (send lag p99 < 1 ms, no errors, >= 95 % achieved)")
    if args.guidellm:
        g_best = max((r["offered"] for r in rows if r.get("guidellm", {}).get("achieved", 0) >= 0.95 * r["offered"]),
                     default=None)
        print(f"GuideLLM reaches 95 % of the offered rate up to {g_best} requests/s")
        if best and g_best:
            print(f"ratio perfsdk / GuideLLM: {best / g_best:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

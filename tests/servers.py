"""Servers for the served-model tests: a real ``transformers serve`` on the embedded tiny model,
and a small fake OpenAI-compatible server for faults a real one does not produce."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving_available() -> str | None:
    """Why ``transformers serve`` cannot run here (None when it can)."""
    import importlib.util

    for mod in ("fastapi", "uvicorn"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install 'transformers[serving]')"
    return None


class TransformersServe:
    """``transformers serve`` on a model folder, on a free loopback port; ``stop()`` kills it."""

    def __init__(self, model_dir: Path, startup_s: float = 120.0) -> None:
        self.model_dir = str(model_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        exe = Path(sys.executable).parent / "transformers"
        cmd = [str(exe), "serve", self.model_dir, "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"transformers-serve-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"transformers serve did not answer within {startup_s:g} s: see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()


Handler = Callable[[dict[str, Any], Any], Any]


class FakeServer:
    """An aiohttp server in a thread answering ``/v1/models`` and streaming ``/v1/completions``
    and ``/v1/chat/completions`` as ``events(body)`` says: a list of (delay_s, raw SSE text)."""

    def __init__(self, events: Callable[[dict[str, Any]], list[tuple[float, str]]], *,
                 header_delay_s: float = 0.0, require_key: str | None = None,
                 metrics: Callable[[int], str] | None = None) -> None:
        self.events = events
        self.metrics = metrics
        self.header_delay_s = header_delay_s
        self.require_key = require_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _serve(self) -> None:
        from aiohttp import web

        async def models(request: Any) -> Any:
            return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

        async def complete(request: Any) -> Any:
            self.auth.append(request.headers.get("Authorization"))
            if self.require_key and request.headers.get("Authorization") != f"Bearer {self.require_key}":
                return web.json_response({"error": "bad key"}, status=401)
            body = await request.json()
            self.requests.append(body)
            if self.header_delay_s:
                await asyncio.sleep(self.header_delay_s)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for delay, raw in self.events(body):
                if delay:
                    await asyncio.sleep(delay)
                await resp.write(raw.encode())
            await resp.write_eof()
            return resp

        async def metrics(request: Any) -> Any:
            if self.metrics is None:
                return web.Response(status=404, text="no metrics")
            return web.Response(text=self.metrics(len(self.requests)), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", complete)
        app.router.add_post("/v1/chat/completions", complete)
        runner = web.AppRunner(app, access_log=None)
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        async def down() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as JSON (or ``[DONE]``)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def completion_events(texts: list[str], usage: int | None, *, gap_s: float = 0.01, chat: bool = False,
                      prompt_tokens: int = 5) -> list[tuple[float, str]]:
    """A stream of ``texts`` (one event each), a finishing event with optional usage, ``[DONE]``."""
    out: list[tuple[float, str]] = []
    if chat:  # the chat API opens with a role-only event: no token
        out.append((0.0, sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
    for t in texts:
        choice = {"index": 0, "delta": {"content": t}} if chat else {"index": 0, "text": t}
        out.append((gap_s, sse({"choices": [choice]})))
    last: dict[str, Any] = {"choices": [{"index": 0, "finish_reason": "length",
                                         **({"delta": {}} if chat else {"text": ""})}]}
    if usage is not None:
        last["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": usage,
                         "total_tokens": prompt_tokens + usage}
    out.append((0.0, sse(last)))
    out.append((0.0, sse("[DONE]")))
    return out

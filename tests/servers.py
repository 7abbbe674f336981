"""Servers for the served-model tests: a real ``transformers serve`` on the embedded tiny model,
and a small fake OpenAI-compatible server for faults a real one does not produce."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from perfsdk.backends.local_server import TransformersServe, free_port, serving_available  # noqa: F401


Handler = Callable[[dict[str, Any], Any], Any]


class FakeServer:
    """An aiohttp server in a thread answering ``/v1/models`` and streaming ``/v1/completions``
    and ``/v1/chat/completions`` as ``events(body)`` says: a list of (delay_s, raw SSE text)."""

    def __init__(self, events: Callable[[dict[str, Any]], list[tuple[float, str]]], *,
                 header_delay_s: float = 0.0, require_key: str | None = None,
                 metrics: Callable[[int], str] | None = None, serial_s: float = 0.0) -> None:
        self.events = events
        self.serial_s = serial_s  # > 0: one request at a time, each holding the server this long
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
            if self.serial_s:  # a server of one slot: requests queue for it
                async with self._slot:
                    await asyncio.sleep(self.serial_s)
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

        self._slot = asyncio.Lock()
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

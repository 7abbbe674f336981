"""A local ``transformers serve`` for tests and benchmarks: the embedded tiny model (or any model
folder) behind a real OpenAI-compatible server on a free loopback port.

``transformers serve`` needs the ``serving`` extra of ``transformers`` (FastAPI, uvicorn):
``pip install "perfsdk[serving]"``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
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
    """``transformers serve`` on a model folder, on a free loopback port; ``stop()`` kills it.

    Its output goes to a log file in the temporary directory (named in every error; removed by a
    ``stop()`` after the server ran, kept where it failed to start). One torch thread, so that it
    and a client on the same machine do not fight over the cores.
    """

    def __init__(self, model_dir: Path, startup_s: float = 120.0) -> None:
        self.model_dir = str(model_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        exe = Path(sys.executable).parent / "transformers"
        cmd = [str(exe), "serve", self.model_dir, "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
        self.log = open(Path(tempfile.gettempdir()) / f"transformers-serve-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"transformers serve exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop(keep_log=True)
        raise RuntimeError(f"transformers serve did not answer within {startup_s:g} s: see {self.log.name}")

    def stop(self, keep_log: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()
        if not keep_log:
            Path(self.log.name).unlink(missing_ok=True)

"""Two CPU ranks under ``torchrun`` (gloo) for the tests that need a real launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(args: list[str], cwd: Path, timeout: int = 50) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node 2 ARGS`` in ``cwd`` (the
    test's folder, which also takes torchrun's own scratch folders), offline, one thread a rank,
    perfsdk from this checkout, no rank variables inherited from the caller."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PERFSDK_DIST_TIMEOUT_S="40",
               TMPDIR=str(cwd), PYTHONPATH=str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

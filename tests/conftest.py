"""Shared test set-up: offline, quiet, deterministic."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def load_benchmark() -> Iterator[Callable[[str], ModuleType]]:
    """Loads a script of ``benchmarks/`` by name as a module, with that folder on ``sys.path``
    (the scripts import one another) until the requesting test module is done."""
    added = str(BENCHMARKS) not in sys.path
    if added:
        sys.path.insert(0, str(BENCHMARKS))

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    yield load
    if added:
        sys.path.remove(str(BENCHMARKS))

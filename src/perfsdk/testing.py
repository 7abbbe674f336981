"""A pytest plugin for perfsdk and for authors of perfsdk plugins.

Installed with perfsdk (entry point ``pytest11``). Fixtures:

- ``perfsdk_store``: an empty result store folder in ``tmp_path``.
- ``perfsdk_cli``: invoke the ``perfsdk`` CLI in-process, plugin commands included:
  ``result = perfsdk_cli(["run", "--store", str(perfsdk_store)])``.
- ``tiny_causal_lm``: a 2-layer Llama model with random weights (fixed seed), for fast tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def perfsdk_store(tmp_path: Path) -> Path:
    """An empty result store folder."""
    path = tmp_path / "perfsdk-results"
    path.mkdir()
    return path


@pytest.fixture
def perfsdk_cli() -> Callable[..., Any]:
    """Call the CLI in-process with click's CliRunner; returns the click Result."""
    from click.testing import CliRunner

    from perfsdk.cli import cli, register_plugin_commands

    register_plugin_commands()
    runner = CliRunner()

    def invoke(args: list[str], **kwargs: Any) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return runner.invoke(cli, args, catch_exceptions=False, **kwargs)

    return invoke


def build_tiny_causal_lm(seed: int = 0, **overrides: Any) -> Any:
    """A small Llama causal LM with random weights from ``seed`` (not the embedded model)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=256, max_position_embeddings=256,
               bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.update(overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    return model


@pytest.fixture
def tiny_causal_lm() -> Any:
    """A small Llama causal LM (2 layers, hidden 64, vocab 256), fixed seed."""
    return build_tiny_causal_lm()

"""A pytest plugin for perfsdk and for authors of perfsdk plugins.

Installed with perfsdk (entry point ``pytest11``). Fixtures:

- ``perfsdk_store``: an empty result store folder in ``tmp_path``.
- ``perfsdk_cli``: invoke the ``perfsdk`` CLI in-process, plugin commands included:
  ``result = perfsdk_cli(["run", "--store", str(perfsdk_store)])``.
- ``tiny_causal_lm``: a 2-layer Llama model with random weights (fixed seed), for fast tests.
- ``perfsdk_plugin_installer`` (session scope): a :class:`PluginInstaller` that installs a plugin
  package (a folder with a ``pyproject.toml``) into a temporary folder, never into the running
  environment, and makes it importable only while active::

      @pytest.fixture(scope="module")
      def installed(perfsdk_plugin_installer):
          with perfsdk_plugin_installer.activate("plugins/perfsdk-myplugin") as folder:
              yield folder

The helpers (:func:`build_tiny_causal_lm`, :class:`PluginInstaller`) work without pytest, which
only the ``dev`` extra installs: the fixtures are defined when pytest is importable, so a script
of the default install (``examples/distributed_session.py``) may import this module.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import pytest
except ImportError:  # the default install: helpers only, no fixtures
    pytest = None  # type: ignore[assignment]


class PluginInstaller:
    """Installs plugin packages with ``pip install --target`` into folders under ``root``.

    Each package is installed once (from a copy of its source folder, so the source tree gets no
    build leftovers) and made visible with :meth:`activate`: the folder goes first on
    ``sys.path`` (``importlib.metadata`` then sees the package's ``*.dist-info`` and its entry
    points) and on ``PYTHONPATH`` (for subprocesses); leaving the block takes both back and
    forgets the modules imported from it. Nothing is written into the running environment.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.installed: dict[Path, Path] = {}

    def install(self, source: str | os.PathLike[str]) -> Path:
        """Install the package in ``source`` (no dependencies, no index) and return its folder."""
        src = Path(source).resolve()
        if src in self.installed:
            return self.installed[src]
        work = self.root / src.name
        copy, target = work / "src", work / "site"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "--no-deps", "--no-index", "--no-build-isolation", "--target", str(target), str(copy)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"could not install {src} into {target}:\n{proc.stdout}{proc.stderr}")
        self.installed[src] = target
        return target

    @contextmanager
    def activate(self, source: str | os.PathLike[str]) -> Iterator[Path]:
        """Install ``source`` if needed and make it importable (and its entry points visible)
        inside the block only."""
        target = self.install(source)
        folder = str(target)
        saved_env = os.environ.get("PYTHONPATH")
        sys.path.insert(0, folder)
        os.environ["PYTHONPATH"] = folder + (os.pathsep + saved_env if saved_env else "")
        _forget_modules(_top_level_names(target))  # a copy imported earlier from elsewhere
        importlib.invalidate_caches()
        try:
            yield target
        finally:
            while folder in sys.path:
                sys.path.remove(folder)
            if saved_env is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved_env
            _forget_modules(_top_level_names(target))
            importlib.invalidate_caches()


def _top_level_names(folder: Path) -> set[str]:
    """Importable top-level names in an install folder (packages and modules)."""
    names = set()
    for p in folder.iterdir():
        if p.name.endswith((".dist-info", ".egg-info")) or p.name in ("bin", "__pycache__"):
            continue
        if p.is_dir() and p.name.isidentifier():
            names.add(p.name)
        elif p.suffix == ".py":
            names.add(p.stem)
    return names


def _forget_modules(names: set[str]) -> None:
    for name in list(sys.modules):
        if name.split(".", 1)[0] in names:
            del sys.modules[name]


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


if pytest is not None:  # the pytest plugin's fixtures

    @pytest.fixture(scope="session")
    def perfsdk_plugin_installer(tmp_path_factory: pytest.TempPathFactory) -> PluginInstaller:
        """Install plugin packages into a temporary folder for the tests that use them."""
        return PluginInstaller(tmp_path_factory.mktemp("perfsdk-plugins"))

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

    @pytest.fixture
    def tiny_causal_lm() -> Any:
        """A small Llama causal LM (2 layers, hidden 64, vocab 256), fixed seed."""
        return build_tiny_causal_lm()

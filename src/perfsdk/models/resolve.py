"""What a user types after ``MODEL`` / ``--model``, resolved to a ``transformers`` config.

One resolver for ``perfsdk flops``, ``perfsdk simulate`` and the calibration: ``builtin:<name>``
(an embedded model, or a bundled config of that name), a folder holding ``config.json`` or the
file itself, a bundled config of a well-known architecture (``perfsdk/flops/configs/<name>.json``,
see :func:`bundled_names`), or a Hugging Face id already in the local cache (nothing is
downloaded). Dict configs are checked for the fields the architecture depends on before
``transformers`` fills its defaults (:func:`perfsdk.models.arch.config_from_dict`).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from perfsdk.models.arch import Architecture, UnsupportedArchitecture, architecture_from_config, config_from_dict


class UnknownModel(ValueError):
    """The model name is not a folder, a config file, a built-in or a bundled config."""


def bundled_names() -> list[str]:
    """Names of the bundled architecture configs (``gpt2``, ``llama-3-8b``, ``tiny-llava`` …)."""
    root = resources.files("perfsdk.flops") / "configs"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def bundled_config(name: str) -> dict[str, Any]:
    """The ``config.json`` dict of a bundled architecture (``perfsdk/flops/configs/<name>.json``)."""
    if name not in bundled_names():
        raise UnknownModel(f"no bundled config {name!r} (available: {', '.join(bundled_names())})")
    data: dict[str, Any] = json.loads((resources.files("perfsdk.flops") / "configs" / f"{name}.json").read_text())
    return data


def resolve_config(model: str) -> tuple[Any, str]:
    """The ``transformers`` config that ``model`` names, and where it came from.

    Tried in order: ``builtin:<name>`` (an embedded model, or a bundled config of that name), a
    folder holding ``config.json`` or the file itself, a bundled config of a well-known
    architecture (:func:`bundled_names`), a Hugging Face id already in the local cache (no
    network). Raises :class:`UnknownModel`, or :class:`UnsupportedArchitecture` for a config of a
    family (or with a missing field) the reader does not describe.
    """
    if model.startswith("builtin:"):
        name = model.split(":", 1)[1]
        try:
            from perfsdk.models.tiny import tiny_llama_config

            return tiny_llama_config(name), "builtin"
        except KeyError as exc:
            if name in bundled_names():
                return config_from_dict(bundled_config(name)), "builtin"
            raise UnknownModel(str(exc.args[0]) if exc.args else str(exc)) from exc
        except ImportError as exc:
            raise UnknownModel(f"{model}: the embedded models are not available ({exc})") from exc
    path = Path(os.path.expanduser(model))
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UnknownModel(f"{model}: cannot read config ({exc})") from exc
        if not isinstance(data, dict):
            raise UnknownModel(f"{model}: not a config (a JSON object is expected)")
        try:
            return config_from_dict(data), f"file:{path}"
        except UnsupportedArchitecture as exc:
            raise type(exc)(f"{path}: {exc}") from None
    key = model.lower().replace("_", "-")
    if key in bundled_names():
        return config_from_dict(bundled_config(key)), f"bundled:{key}"
    if "/" in model and not model.startswith((".", "/", "~")):
        try:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(model, local_files_only=True), f"hf-cache:{model}"
        except Exception:
            pass
    raise UnknownModel(
        f"unknown model {model!r}: not a folder with config.json, a config file, builtin:<name>, a Hugging Face id "
        f"in the local cache, or one of the bundled configs ({', '.join(bundled_names())})"
    )


def resolve_architecture(model: str) -> Architecture:
    """:func:`resolve_config` then :func:`architecture_from_config`."""
    return architecture_from_config(resolve_config(model)[0])


__all__ = ["UnknownModel", "bundled_config", "bundled_names", "resolve_architecture", "resolve_config"]

"""Reading YAML files: one helper, so every file-reading error names the file the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: str | Path, *, what: str = "file", error: type[Exception] = ValueError) -> Any:
    """Parse the YAML file at ``path`` (``yaml.safe_load``; an empty file gives ``None``).

    A missing file, invalid YAML or a file that is not UTF-8 text raises ``error`` with a
    message that starts with the path: ``<path>: <what> not found``, ``<path>: not valid YAML:
    ...``, ``<path>: not a UTF-8 text file``.
    """
    p = Path(path)
    if not p.is_file():
        raise error(f"{p}: {what} not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{p}: not a UTF-8 text file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise error(f"{p}: not valid YAML: {err}") from None


__all__ = ["read_yaml"]

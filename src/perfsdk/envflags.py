"""The ``PERFSDK_*`` environment switches, read in one place.

=================================== ===========================================================
``PERFSDK_DISABLE_PLUGIN_AUTOLOAD`` ``1``: do not load entry-point plugins
``PERFSDK_PLUGINS``                 ``a,b``: load only these entry-point plugins
``PERFSDK_TRACE_HOOKS``             ``1``: log every hook call
``PERFSDK_LOG_LEVEL``               ``DEBUG`` / ``INFO`` / ``WARNING`` ...
``PERFSDK_DISTRIBUTED``             ``0``: every process of a launcher job is its own run
``PERFSDK_DIST_TIMEOUT_S``          seconds a rank waits for the others (default 600)
``PERFSDK_HOOK_BUDGET_S``           per-call budget of measured-path hooks (default 0.05)
``PERFSDK_SERIES_MAX_ROWS``         row cap of every stored series
``PERFSDK_CACHE_DIR``               where embedded models are built (default ``~/.cache/perfsdk``)
=================================== ===========================================================
"""

from __future__ import annotations

import os

import structlog

log = structlog.get_logger("perfsdk.env")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(name: str) -> bool:
    """True when the variable is set to 1/true/yes/on (any case)."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def flag_off(name: str) -> bool:
    """True when the variable is set to 0/false/no/off (any case)."""
    return os.environ.get(name, "").strip().lower() in _FALSE


def text(name: str) -> str | None:
    """The stripped value, or ``None`` when unset or blank."""
    raw = os.environ.get(name)
    return raw.strip() if raw is not None and raw.strip() else None


def number(name: str, default: float) -> float:
    """A float value; unset or unparsable gives ``default`` (the latter with a warning)."""
    raw = text(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        log.warning("ignoring environment variable: not a number", variable=name, value=raw)
        return default


def integer(name: str, default: int) -> int:
    """An integer value; unset or unparsable gives ``default`` (the latter with a warning)."""
    raw = text(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        log.warning("ignoring environment variable: not an integer", variable=name, value=raw)
        return default

"""Quiet-by-default logging through structlog.

If the application has not configured structlog itself, perfsdk installs a configuration that
writes to standard error and drops everything below WARNING (``PERFSDK_LOG_LEVEL`` changes the
level; ``PERFSDK_TRACE_HOOKS=1`` lowers it to INFO so hook calls show).
"""

from __future__ import annotations

import logging
import os
import sys

import structlog


def default_level() -> int:
    from perfsdk.envflags import flag, text

    name = (text("PERFSDK_LOG_LEVEL") or "").upper()
    if name and hasattr(logging, name):
        return int(getattr(logging, name))
    if flag("PERFSDK_TRACE_HOOKS"):
        return logging.INFO
    return logging.WARNING


def configure_default(level: int | None = None, force: bool = False) -> None:
    """Configure structlog unless the application already did (or ``force``)."""
    if structlog.is_configured() and not force:
        return
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(default_level() if level is None else level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )

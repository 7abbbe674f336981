"""perfsdk — measure and simulate PyTorch / transformers inference.

Public surface::

    import perfsdk
    cfg = perfsdk.load_config("bench.yaml")
    with perfsdk.session(cfg) as s:
        model, tok = s.load()
        out = s.generate(model, **s.tokenize(tok, prompts), max_new_tokens=64)
    s.result  # validated perfsdk.RunResult
"""

from __future__ import annotations

__version__ = "0.1.0"

from perfsdk.logs import configure_default as _configure_logging  # noqa: E402

_configure_logging()

from perfsdk.collector import (  # noqa: E402
    Collector,
    CollectorConfig,
    CollectorResult,
    Exporter,
    RankShare,
    ReportFigure,
    ReportSection,
)
from perfsdk.config import Config, ConfigError, load_config  # noqa: E402
from perfsdk.backends.base import Backend  # noqa: E402
from perfsdk.events import LoadEvent, Step, TokenizeEvent, Window  # noqa: E402
from perfsdk.plugins import DEFAULT_PLUGINS, hookimpl, register_plugin, unregister_plugin  # noqa: E402
from perfsdk.hookspecs import hookspec  # noqa: E402
from perfsdk.schemas import RunResult  # noqa: E402
from perfsdk.session import Session, session  # noqa: E402
from perfsdk.stats import Stats, summarize  # noqa: E402
from perfsdk.store import Store  # noqa: E402


def load_runs(store: str = "perfsdk-results", **filters: object) -> "object":
    """Stored runs as a pandas DataFrame, flattened like the CSV export (needs pandas)."""
    from perfsdk.experiments.frame import load_runs as _load_runs

    return _load_runs(store, **filters)


__all__ = [
    "Backend",
    "Collector",
    "CollectorConfig",
    "CollectorResult",
    "Config",
    "ConfigError",
    "DEFAULT_PLUGINS",
    "Exporter",
    "LoadEvent",
    "RankShare",
    "ReportFigure",
    "ReportSection",
    "RunResult",
    "Session",
    "Stats",
    "Step",
    "Store",
    "TokenizeEvent",
    "Window",
    "__version__",
    "hookimpl",
    "hookspec",
    "load_config",
    "load_runs",
    "register_plugin",
    "session",
    "summarize",
    "unregister_plugin",
]

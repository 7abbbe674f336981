"""The backend contract and how a config picks its backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


class Backend:
    """Runs a config's workload and turns each request into steps of the session.

    Subclasses set ``name`` (what ``model.backend`` names), ``description`` and ``in_process``
    (False when the model runs in another process: collectors that need the model object then
    report ``unavailable: the model runs in another process``). ``handles(config)`` says whether
    the backend is the default for a config that names none.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    in_process: ClassVar[bool] = True

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def handles(cls, config: Any) -> bool:
        """Whether this backend runs ``config`` when ``model.backend`` is not set."""
        return False

    def check(self) -> None:
        """Check what the run needs before anything runs or is stored; raise ``ConfigError``."""

    def load(self, session: Any) -> tuple[Any, Any]:
        """``(model, tokenizer)`` for ``session.load()`` when the model is not in this process."""
        raise NotImplementedError

    def model_info(self) -> Any:
        """What is known of the model behind an out-of-process backend (a ``ModelInfo``)."""
        return None

    def run_workload(self, session: Any, progress: Callable[[int, int], None] | None = None) -> None:
        """Run the config's workload in ``session``."""
        raise NotImplementedError


def backend_for(config: Any, registry: Any = None) -> Backend:
    """The backend ``config`` runs on: ``model.backend`` when set, else the first registered
    backend that ``handles`` it (``openai`` when ``model.endpoint`` is set), else ``transformers``."""
    from perfsdk.config import ConfigError
    from perfsdk.plugins import installed_registry
    from perfsdk.suggest import did_you_mean

    reg = registry if registry is not None else installed_registry()
    backends: dict[str, type[Backend]] = reg.backends
    wanted = getattr(config.model, "backend", None)
    if wanted:
        cls = backends.get(wanted)
        if cls is None:
            raise ConfigError(f"model.backend: unknown backend {wanted!r}{did_you_mean(wanted, backends)} "
                              f"(available: {', '.join(sorted(backends))})")
        return cls(config)
    for name in sorted(backends, key=lambda n: n == "transformers"):
        if backends[name].handles(config):
            return backends[name](config)
    return backends["transformers"](config)

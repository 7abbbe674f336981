"""Base classes for collectors (measure) and exporters (write results out)."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from perfsdk.events import Step
    from perfsdk.schemas import RunResult


class CollectorConfig(BaseModel):
    """Base for collector settings: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class CollectorResult(BaseModel):
    """Base for collector results: immutable once produced."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Collector:
    """A measurement plugin.

    Subclasses set ``name``, ``Config`` (settings, ``extra="forbid"``), ``Result`` (what
    ``perfsdk_finalize`` returns) and ``default_enabled``, and implement lifecycle hooks as
    methods decorated with ``perfsdk.hookimpl``. The session makes one instance per run
    (``Collector(config)``) and registers it with its plugin manager for the run's lifetime, so
    all state lives on the instance.

    Raw time series go through ``session.add_series(name, rows)``; collectors never write files.

    A collector that slows the steps it looks at (operation counting, forward hooks, a profiler)
    sets ``instruments_steps = True`` and answers :meth:`wants_to_instrument`; the session then
    gives it instrumented steps of its own (see ``docs/hooks.md``, "Instrumented steps"), which
    every statistic leaves out.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[BaseModel]] = CollectorConfig
    Result: ClassVar[type[BaseModel]] = CollectorResult
    default_enabled: ClassVar[bool] = False
    description: ClassVar[str] = ""

    #: True for a collector that adds instrumentation to the steps it selects. The session asks
    #: such a collector :meth:`wants_to_instrument` before every timed step.
    instruments_steps: ClassVar[bool] = False

    def __init__(self, config: BaseModel | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def wants_to_instrument(self, session: Any, step: Step) -> bool:
        """Whether to instrument a step like ``step`` (asked only when ``instruments_steps``).

        Asked once per timed step (never for warm-up or instrumented steps), right before its
        ``perfsdk_before_generate``; ``step`` has its kind, index, batch size, inputs and
        generation settings. Answering ``True`` books an instrumented step of the same shape
        for this collector: by default the session repeats the step with the same inputs after
        the timed steps (``instrumentation.replay``). That step carries this collector's name in
        ``step.instrumented_by``; instrument in ``perfsdk_before_generate`` only when it does.
        """
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Exporter:
    """Writes a list of runs to a stream in one format.

    ``export`` returns ``True`` on success and ``False`` on failure (it logs why) instead of
    raising, so one failing exporter never loses a run.
    """

    name: ClassVar[str] = ""
    extension: ClassVar[str] = ""
    binary: ClassVar[bool] = False
    description: ClassVar[str] = ""

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:  # pragma: no cover
        raise NotImplementedError

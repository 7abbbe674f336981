"""Base classes for collectors (measure, and own their results) and exporters (write results out).

A collector owns its result from measurement to every place it appears:

- **measurement**: lifecycle hooks (``perfsdk_*`` methods) on the instance the session makes;
- **result**: ``Result`` (pydantic), returned by ``perfsdk_finalize``, re-validated whenever a
  stored run is read back while the collector is installed (:meth:`Collector.result_of`);
- **presentation**: :meth:`Collector.summary_rows` / :meth:`Collector.summary_tables` for the
  terminal, :meth:`Collector.report_section` for the HTML report, :attr:`Collector.key_columns`
  for the columns that lead CSV / markdown exports;
- **distributed runs**: :meth:`Collector.rank_payload` (what each rank ships to rank 0 besides
  its result) and :meth:`Collector.merge_ranks` (how the ranks' results combine).

Every presentation method has a generic default (scalar fields as rows, a key/value table), so a
collector that supplies none still shows up everywhere.
"""

from __future__ import annotations

import html as _html
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from perfsdk.events import Step
    from perfsdk.schemas import RunResult
    from perfsdk.store import Store


class CollectorConfig(BaseModel):
    """Base for collector settings: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class CollectorResult(BaseModel):
    """Base for collector results: immutable once produced."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass
class ReportFigure:
    """A PNG figure of an HTML report section."""

    slug: str
    title: str
    png: bytes
    caption: str = ""


class ReportSection:
    """One section of the HTML report: a heading, HTML fragments (tables), figures and notes.

    ``html`` may be given as one string or a list of fragments; it is kept as a list.
    """

    def __init__(self, title: str, html: str | list[str] | None = None, figures: list[ReportFigure] | None = None,
                 notes: list[str] | None = None, slug: str = "") -> None:
        self.title = title
        self.html: list[str] = [html] if isinstance(html, str) else list(html or [])
        self.figures: list[ReportFigure] = list(figures or [])
        self.notes: list[str] = list(notes or [])
        self.slug = slug

    def __repr__(self) -> str:
        return f"ReportSection({self.title!r}, {len(self.html)} fragments, {len(self.figures)} figures)"


@dataclass
class RankShare:
    """One rank's share of a distributed run, as :meth:`Collector.merge_ranks` receives it.

    ``result`` is the rank's typed ``Result``; ``payload`` is what the collector's
    :meth:`Collector.rank_payload` returned on that rank (``None`` if it defines none).
    """

    rank: int
    world_size: int
    hostname: str | None
    result: Any
    payload: Any = None


def scalar_items(data: Any, prefix: str = "", limit: int = 40) -> list[tuple[str, Any]]:
    """The scalar leaves of a result (numbers, short strings, bools), as dotted (path, value)."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    out: list[tuple[str, Any]] = []

    def walk(v: Any, path: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(v, dict):
            for k, sub in v.items():
                walk(sub, f"{path}.{k}" if path else str(k))
        elif isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 80):
            out.append((path, v))

    walk(data, prefix)
    return out


def html_table(headers: list[str], rows: list[list[Any]], cls: str = "", caption: str = "") -> str:
    """An escaped HTML table: floats with 4 significant digits, booleans as yes/no, ``None`` as ``-``."""

    def cell(v: Any) -> str:
        if isinstance(v, bool):
            v = "yes" if v else "no"
        elif isinstance(v, float):
            v = f"{v:.4g}"
        return _html.escape("-" if v is None else str(v))

    cap = f"<caption>{_html.escape(caption)}</caption>" if caption else ""
    head = "".join(f"<th>{_html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def rich_table_html(table: Any) -> str:
    """A ``rich`` table as an HTML table (title as a line above it, caption as a line below,
    cell text without markup)."""
    from rich.text import Text

    def text(v: Any) -> str:
        if isinstance(v, Text):
            return v.plain
        return Text.from_markup(v).plain if isinstance(v, str) else str(v)

    headers = [text(c.header) for c in table.columns]
    cells = [[text(x) for x in c._cells] for c in table.columns]
    rows = [list(r) for r in zip(*cells)] if cells else []
    title = f"<p><b>{_html.escape(text(table.title))}</b></p>" if table.title else ""
    caption = f"<p>{_html.escape(text(table.caption))}</p>" if table.caption else ""
    return title + html_table(headers, rows) + caption


#: Why a collector that needs the model object has nothing for a served model.
MODEL_ELSEWHERE = "the model runs in another process"


def model_elsewhere(session: Any) -> str | None:
    """``"the model runs in another process"`` when the session's model is served (so a
    collector that needs the model object has nothing to measure), else None."""
    return None if getattr(session, "in_process", True) else MODEL_ELSEWHERE


def host_elsewhere(session: Any) -> str | None:
    """``"endpoint on another host"`` when the session's model is served from another machine
    (this host's counters do not see it), else None."""
    if getattr(session, "in_process", True):
        return None
    backend = session.backend
    is_local = getattr(backend, "is_local", None)
    if callable(is_local) and is_local():
        return None
    return "endpoint on another host"


class Collector:
    """A measurement plugin that owns its result end to end.

    Subclasses set ``name``, ``Config`` (settings, ``extra="forbid"``), ``Result`` (what
    ``perfsdk_finalize`` returns) and ``default_enabled``, and implement lifecycle hooks as
    methods decorated with ``perfsdk.hookimpl``. The session makes one instance per run
    (``Collector(config)``) and registers it with its plugin manager for the run's lifetime, so
    all state lives on the instance.

    Raw time series go through ``session.add_series(name, rows)``; collectors never write files.

    Presentation and merging are class methods that receive the typed ``Result``; override the
    ones you need (see ``docs/hooks.md``, "The collector contract").

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
    #: Dotted paths inside ``Result`` that lead CSV / markdown exports, in this order, as
    #: ``collectors.<name>.<path>`` columns (absent ones are skipped).
    key_columns: ClassVar[tuple[str, ...]] = ()
    #: Title of this collector's summary block and report section (defaults to ``name``).
    title: ClassVar[str] = ""

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

    # -- results ------------------------------------------------------------------------------

    @classmethod
    def result_of(cls, run: RunResult) -> Any:
        """This collector's typed ``Result`` in ``run``, or ``None`` when the run has none (or
        it does not validate against ``Result``)."""
        return run.collector_result(cls.name, cls)

    # -- presentation ---------------------------------------------------------------------------

    @classmethod
    def summary_rows(cls, result: Any) -> list[tuple[str, str]]:
        """(label, value) rows for the terminal summary. Default: the result's scalar fields."""
        return [(k, _fmt_scalar(v, k)) for k, v in scalar_items(result, limit=12)]

    @classmethod
    def summary_tables(cls, result: Any) -> list[Any]:
        """Extra ``rich`` tables for the terminal summary (default: none)."""
        return []

    @classmethod
    def report_section(cls, result: Any, run: RunResult) -> ReportSection | None:
        """This collector's section of the HTML report. Default: a table of scalar fields.

        ``run`` gives context: ``run.read_series(name)`` reads a stored series of the run.
        """
        rows = [[k, v] for k, v in scalar_items(result)]
        if not rows:
            return None
        return ReportSection(cls.title or cls.name, html_table(["field", "value"], rows, "kv"))

    # -- comparisons between runs -------------------------------------------------------------

    @classmethod
    def compare_metrics(cls) -> dict[str, bool]:
        """Metrics this collector gives per-step samples for (``perfsdk compare`` bootstraps
        them): name -> whether lower is better. Default: none."""
        return {}

    @classmethod
    def metric_samples(cls, run: RunResult, metric: str) -> list[list[float]] | None:
        """Samples of one of :meth:`compare_metrics`, grouped by step (the requests of a batch
        are not independent), read from ``run`` and its stored series; ``None`` if absent."""
        return None

    @classmethod
    def metric_value(cls, result: Any, metric: str, stat: str) -> float | None:
        """The headline value of one of :meth:`compare_metrics` (``stat``: mean, p50, ...)."""
        return None

    # -- distributed runs -------------------------------------------------------------------------

    def rank_payload(self, session: Any) -> Any:
        """Extra data this rank sends to rank 0 for :meth:`merge_ranks` (picklable; default
        ``None``). Called on every rank after ``perfsdk_finalize``."""
        return None

    @classmethod
    def merge_ranks(cls, shares: list[RankShare]) -> Any:
        """Combine the ranks' results into the run's top-level result.

        Return ``NotImplemented`` (the default) when results cannot be combined: the run then
        keeps every rank's result in its ``ranks`` entries, and the top-level entry is rank 0's,
        marked ``rank0-only`` in ``collector_meta``.
        """
        return NotImplemented

    @classmethod
    def has_merge(cls) -> bool:
        return getattr(cls.merge_ranks, "__func__", None) is not Collector.merge_ranks.__func__  # type: ignore[attr-defined]


def _fmt_scalar(v: Any, key: str = "") -> str:
    from perfsdk.fmt import fmt_value

    return fmt_value(v, key)


class Exporter:
    """Writes a list of runs out in one format.

    A stream exporter (the default) implements ``export(runs, stream)``: the caller opens the
    file or standard output and writes what the exporter produced atomically. An exporter that
    sends runs to a service or a database instead (an MLflow tracking server, say) sets
    ``destination = True`` and implements ``export_to(runs, destination, store)``, where
    ``destination`` is the text the user gave as ``--output`` (a URI, a folder...) and ``store`` is
    the :class:`~perfsdk.store.Store` the runs come from (for their series and artifacts), or
    ``None`` when the runs are not stored.

    Both return ``True`` on success and ``False`` on failure (they log why) instead of raising,
    so one failing exporter never loses a run.
    """

    name: ClassVar[str] = ""
    extension: ClassVar[str] = ""
    binary: ClassVar[bool] = False
    destination: ClassVar[bool] = False
    description: ClassVar[str] = ""

    def export(self, runs: list[RunResult], stream: IO[Any]) -> bool:  # pragma: no cover
        raise NotImplementedError

    def export_to(self, runs: list[RunResult], destination: str, store: Store | None) -> bool:  # pragma: no cover
        raise NotImplementedError

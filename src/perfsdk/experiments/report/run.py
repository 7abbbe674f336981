"""The sections of a single-run report."""

from __future__ import annotations

from typing import Any

import structlog

from perfsdk.experiments.report.figures import Section, _table
from perfsdk.schemas import RunResult
from perfsdk.store import Store

log = structlog.get_logger("perfsdk.experiments.report")


def run_sections(store: Store, run: RunResult, registry: Any = None) -> list[Section]:
    """The sections of a single-run report: an overview, then one section per collector
    (each collector's own ``report_section``, or the generic table of its scalar fields)."""
    from perfsdk.collector import Collector
    from perfsdk.plugins import installed_registry, ordered_collectors
    from perfsdk.summary import headline_rows

    reg = registry or installed_registry()
    if run._store_root is None:
        run._store_root = str(store.root)
    secs: list[Section] = []
    s = Section("Summary")
    m = run.model
    info: list[list[Any]]
    info = [["run", run.run_id], ["name", run.name], ["status", run.status],
            ["model", m.model_id if m else None], ["dtype", m.dtype if m else None],
            ["parameters", m.parameters if m else None],
            ["batch size", run.workload.batch_size if run.workload else None],
            ["max new tokens", run.workload.max_new_tokens if run.workload else None],
            ["host", run.environment.hostname], ["CPU", run.environment.cpu_model],
            ["torch", run.environment.torch], ["started", run.started_at.isoformat()]]
    s.html.append(_table(["field", "value"], info, "kv"))
    s.html.append(_table(["metric", "value"], [list(r) for r in headline_rows(run, reg)], "kv"))
    secs.append(s)

    from perfsdk.validity import report_html

    secs.append(Section("Validity", html=[report_html(run.validity)]))

    for name in ordered_collectors(run.collectors, reg):
        cls: type[Collector] | None = reg.collectors.get(name)
        result = run.collector_result(name, cls) if cls is not None else None
        try:
            if cls is not None and result is not None:
                sec = cls.report_section(result, run)
            else:
                sec = Collector.report_section.__func__(type("_Stored", (Collector,), {"name": name}),  # type: ignore[attr-defined]
                                                        run.collectors[name], run)
        except Exception as exc:  # one collector's broken section never loses the report
            log.warning("report section failed", collector=name, error=repr(exc))
            sec = Section(name, notes=[f"section unavailable: {type(exc).__name__}: {exc}"])
        if sec is None:
            continue
        meta = run.collector_meta.get(name)
        if meta is not None and meta.scope == "rank0-only":
            sec.notes.insert(0, f"rank 0 only: this collector does not merge ranks (each rank's result is under ranks).")
        if meta is not None and meta.installed is False:
            sec.notes.insert(0, "collector not installed here: its stored values are shown as they are.")
        sec.slug = name
        secs.append(sec)

    if run.records:
        s = Section("Records")
        s.html.append(_table(["name", "value", "unit"], [[r.name, r.value, r.unit] for r in run.records]))
        secs.append(s)
    if run.errors:
        s = Section("Errors")
        s.html.append(_table(["source", "hook", "type", "message"], [[e.source, e.hook, e.type, e.message] for e in run.errors]))
        secs.append(s)
    return secs

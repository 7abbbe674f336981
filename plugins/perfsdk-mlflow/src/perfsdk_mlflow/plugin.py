"""The ``mlflow`` exporter: each perfsdk run becomes one MLflow run.

``perfsdk export --format mlflow --output TRACKING_URI [--run ID ...]`` logs, per run:

- params: the run's config and model description, flattened with dots (``config.workload.num_prompts``,
  ``model.parameters``);
- metrics: the numeric key columns of perfsdk's tabular exports, every statistic
  (``count, mean, std, min, p50, ..., max``) found in the collectors' results (per phase: prefill,
  decode, TTFT, ...), and the user's numeric records (``records.<name>``);
- tags: ``perfsdk.run_id``, ``perfsdk.name``, ``perfsdk.status``, ``perfsdk.version``, the other
  text key columns as ``perfsdk.<column>`` (``perfsdk.model.model_id``...) and the run's own tags;
- artifacts: ``result.json`` and, when the report dependencies are installed, ``report.html``.

The MLflow run keeps the perfsdk run's start and end times, and ends ``FINISHED`` (``ok`` and
``partial`` runs) or ``FAILED``. Exporting is idempotent: a run already in the tracking store
(tag ``perfsdk.run_id``) is left as it is; one whose earlier export stopped half-way is completed
rather than duplicated. The experiment is ``$MLFLOW_EXPERIMENT_NAME`` when set, otherwise the
perfsdk run's name.

MLflow is imported only when exporting, so ``perfsdk plugins`` and every other command stay fast.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

import perfsdk
from perfsdk.collector import Exporter
from perfsdk.exporters.flatten import flatten, key_columns, run_row
from perfsdk.schemas import RunResult
from perfsdk.stats import Stats

if TYPE_CHECKING:
    from perfsdk.store import Store

log = structlog.get_logger("perfsdk_mlflow")

#: Tag that ties an MLflow run to its perfsdk run (the idempotency key).
RUN_ID_TAG = "perfsdk.run_id"
#: Tag written last: its presence means every param, metric and artifact was logged.
EXPORT_TAG = "perfsdk.export"
EXPORT_COMPLETE = "complete"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
INSTALL_HINT = "pip install 'perfsdk-mlflow[mlflow]'"

# MLflow's limits (mlflow.utils.validation); the values of MLflow 2.x and 3.x.
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000

_STATS_FIELDS = frozenset(Stats.model_fields)
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def _key(name: str) -> str:
    """A param/metric/tag key MLflow accepts: other characters become ``_``."""
    return _BAD_KEY_CHARS.sub("_", name).strip("/") or "_"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _ms(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp() * 1000)


# -- what a run becomes ------------------------------------------------------------------------

def run_params(run: RunResult) -> dict[str, str]:
    """``config.*`` and ``model.*``, flattened with dots; values as text (lists and other
    non-strings as JSON), cut to MLflow's length limit (the full values are in ``result.json``)."""
    data: dict[str, Any] = flatten(run.config, "config")
    if run.model is not None:
        flatten(run.model.model_dump(mode="json"), "model", data)
    params: dict[str, str] = {}
    for k, v in data.items():
        text = _text(v)
        if len(text) > MAX_PARAM_VAL_LENGTH:
            log.warning("mlflow param value cut to the MLflow limit", run_id=run.run_id, param=k,
                        length=len(text), limit=MAX_PARAM_VAL_LENGTH)
            text = text[: MAX_PARAM_VAL_LENGTH - 3] + "..."
        params[_key(k)] = text
    return params


def _stats_metrics(data: Any, prefix: str, out: dict[str, float]) -> None:
    """Every group shaped like :class:`perfsdk.stats.Stats` under ``data``, as
    ``<path>.<statistic>``; ``low_sample_count`` is a flag, not a metric."""
    if not isinstance(data, dict):
        return
    if _STATS_FIELDS.issubset(data):
        for stat in Stats.model_fields:
            num = _number(data.get(stat))
            if num is not None:
                out[f"{prefix}.{stat}"] = num
        return
    for k, v in data.items():
        _stats_metrics(v, f"{prefix}.{k}", out)


def run_metrics(run: RunResult) -> dict[str, float]:
    """The numeric key columns, every statistic in the collectors' results, numeric records."""
    row = run_row(run)
    metrics: dict[str, float] = {}
    for col in [c for c in key_columns() if c in row]:
        num = _number(row.get(col))
        if num is not None:
            metrics[col] = num
    for name, result in run.collectors.items():
        _stats_metrics(result, f"collectors.{name}", metrics)
    for rec in run.records:
        num = _number(rec.value)
        if num is not None:
            metrics[f"records.{rec.name}"] = num
    return {_key(k): v for k, v in metrics.items()}


def run_tags(run: RunResult) -> dict[str, str]:
    """perfsdk's identity of the run, every text key column as ``perfsdk.<column>`` (run id, name,
    status, model id, dtype, ...), and the run's own tags (``mlflow.*``/``perfsdk.*`` keys of the
    run's tags are moved under ``perfsdk.tag.`` so they cannot overwrite reserved ones)."""
    tags = {
        RUN_ID_TAG: run.run_id,
        "perfsdk.name": run.name,
        "perfsdk.status": run.status,
        "perfsdk.version": run.perfsdk_version,
    }
    row = run_row(run)
    for col in key_columns():
        if isinstance(row.get(col), str):
            tags[_key(f"perfsdk.{col}")] = row[col]
    if run.errors:
        tags["perfsdk.errors"] = "; ".join(f"{e.source}: {e.type}: {e.message}" for e in run.errors)
    for k, v in run.tags.items():
        key = f"perfsdk.tag.{k}" if k.startswith(("mlflow.", "perfsdk.")) else k
        tags[_key(key)] = str(v)
    return {k: v if len(v) <= MAX_TAG_VAL_LENGTH else v[: MAX_TAG_VAL_LENGTH - 3] + "..." for k, v in tags.items()}


def report_html(run: RunResult, store: Store | None) -> str | None:
    """perfsdk's HTML report of the run, or ``None`` (with a warning) when it cannot be built."""
    if store is None:
        return None
    try:
        import matplotlib  # noqa: F401

        from perfsdk.experiments.report import build_report, render_html
    except ImportError:
        log.warning("no report.html artifact: reports need matplotlib: pip install 'perfsdk[report]'",
                    run_id=run.run_id)
        return None
    try:
        title, sections = build_report(store, run.run_id)
        return render_html(title, sections)
    except Exception as exc:  # a report that cannot be drawn must not keep the numbers out of MLflow
        log.warning("no report.html artifact: the report could not be built", run_id=run.run_id, error=repr(exc))
        return None


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


@contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow and its database migrations log at INFO; perfsdk is quiet unless asked."""
    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic")]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        if lg.getEffectiveLevel() < logging.WARNING:
            lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)


# -- the exporter ------------------------------------------------------------------------------

class MlflowExporter(Exporter):
    """Each run as an MLflow run in the tracking store given as ``--output`` (``sqlite:///mlflow.db``,
    ``http://host:5000``, ``databricks``...). Needs MLflow: ``pip install 'perfsdk-mlflow[mlflow]'``."""

    name = "mlflow"
    destination = True
    description = "each run as an MLflow run (--output TRACKING_URI; needs mlflow)"

    def export_to(self, runs: list[RunResult], destination: str, store: Store | None) -> bool:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            log.error(f"the mlflow exporter needs MLflow: {INSTALL_HINT}")
            return False
        ok = True
        with _quiet_mlflow():
            try:
                client = MlflowClient(tracking_uri=destination)
                tracker = _Tracker(client)
            except Exception as exc:
                log.error("cannot open the MLflow tracking store", destination=destination, error=repr(exc))
                return False
            for run in runs:
                try:
                    tracker.export(run, store)
                except Exception as exc:  # one run that fails never stops the others
                    log.error("mlflow export failed", run_id=run.run_id, destination=destination, error=repr(exc))
                    ok = False
        return ok


class _Tracker:
    """One export into one tracking store: finds, creates and fills MLflow runs."""

    def __init__(self, client: Any) -> None:
        from mlflow.entities import Metric, Param, RunTag, ViewType

        self.client = client
        self.Metric, self.Param, self.RunTag, self.ViewType = Metric, Param, RunTag, ViewType
        self.experiment_ids = self._experiment_ids()
        self.by_name: dict[str, str] = {}

    def _experiment_ids(self) -> list[str]:
        ids: list[str] = []
        token = None
        while True:
            page = self.client.search_experiments(view_type=self.ViewType.ACTIVE_ONLY, page_token=token)
            ids.extend(e.experiment_id for e in page)
            token = getattr(page, "token", None)
            if not token:
                return ids

    def find(self, run_id: str) -> Any:
        """The MLflow run already holding this perfsdk run, or ``None``."""
        if "'" in run_id or not self.experiment_ids:
            return None
        found = self.client.search_runs(self.experiment_ids, filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                                        run_view_type=self.ViewType.ACTIVE_ONLY, max_results=10)
        if not found:
            return None
        # a complete one wins, then the oldest
        found = sorted(found, key=lambda r: (r.data.tags.get(EXPORT_TAG) != EXPORT_COMPLETE, r.info.start_time or 0))
        return found[0]

    def experiment(self, name: str) -> str:
        if name in self.by_name:
            return self.by_name[name]
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            exp_id = self.client.create_experiment(name)
            self.experiment_ids.append(exp_id)
        elif exp.lifecycle_stage != "active":
            raise RuntimeError(f"MLflow experiment {name!r} is deleted: restore it, or choose another one with "
                               f"{EXPERIMENT_ENV}")
        else:
            exp_id = exp.experiment_id
        self.by_name[name] = exp_id
        return str(exp_id)

    def export(self, run: RunResult, store: Store | None) -> None:
        existing = self.find(run.run_id)
        if existing is not None and existing.data.tags.get(EXPORT_TAG) == EXPORT_COMPLETE:
            log.info("already in MLflow, left as it is", run_id=run.run_id, mlflow_run_id=existing.info.run_id)
            return
        if existing is not None:
            mlflow_id = existing.info.run_id  # an earlier export stopped half-way: complete it
        else:
            exp_id = self.experiment(os.environ.get(EXPERIMENT_ENV) or run.name or "perfsdk")
            created = self.client.create_run(exp_id, start_time=_ms(run.started_at), tags={RUN_ID_TAG: run.run_id},
                                             run_name=run.run_id)
            mlflow_id = created.info.run_id
        at = _ms(run.finished_at) or _ms(run.started_at) or 0
        # one timestamp and step 0 for every metric, so logging again adds no history points
        metrics = [self.Metric(k, v, at, 0) for k, v in run_metrics(run).items()]
        params = [self.Param(k, v) for k, v in run_params(run).items()]
        tags = [self.RunTag(k, v) for k, v in run_tags(run).items()]
        for batch in _batches(params, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(mlflow_id, params=batch)
        for batch in _batches(tags, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(mlflow_id, tags=batch)
        for batch in _batches(metrics, MAX_METRICS_PER_BATCH):
            self.client.log_batch(mlflow_id, metrics=batch)
        self._artifacts(mlflow_id, run, store)
        self.client.set_terminated(mlflow_id, status="FAILED" if run.status == "failed" else "FINISHED",
                                   end_time=_ms(run.finished_at))
        self.client.set_tag(mlflow_id, EXPORT_TAG, EXPORT_COMPLETE)

    def _artifacts(self, mlflow_id: str, run: RunResult, store: Store | None) -> None:
        with tempfile.TemporaryDirectory(prefix="perfsdk-mlflow-") as tmp:
            files: list[tuple[str, Callable[[], bytes | None]]] = [
                ("result.json", lambda: _result_bytes(run, store)),
                ("report.html", lambda: _encoded(report_html(run, store))),
            ]
            for fname, produce in files:
                data = produce()
                if data is None:
                    continue
                path = Path(tmp) / fname
                path.write_bytes(data)
                self.client.log_artifact(mlflow_id, str(path))


def _result_bytes(run: RunResult, store: Store | None) -> bytes:
    """The result file as stored (byte for byte) when there is one, else the run as JSON."""
    if store is not None:
        from perfsdk.store import RESULT_FILE

        path = store.run_dir(run.run_id) / RESULT_FILE
        if path.is_file():
            return path.read_bytes()
    return run.model_dump_json(indent=2).encode("utf-8")


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


@perfsdk.hookimpl
def perfsdk_register_exporters(register: Callable[[type], None]) -> None:
    register(MlflowExporter)

"""The sweep driver: runs a sweep's points through an executor, resumes from the store, feeds
adaptive strategies and keeps the manifest up to date."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import structlog

from perfsdk.experiments.pareto import pareto_indices
from perfsdk.experiments.strategies import OptunaStrategy, grid_size
from perfsdk.experiments.sweep.efficiency import sample_efficiency
from perfsdk.experiments.sweep.execute import DEFAULT_WORKLOAD, PointOutcome, PointTask, execute_point
from perfsdk.experiments.sweep.manifest import FINISHED, PointState, write_manifest
from perfsdk.experiments.sweep.points import _MISSING, Sweep, _axis_value, config_hash, point_id
from perfsdk.experiments.sweep.spec import ADAPTIVE, SCORE, _num
from perfsdk.store import Store

log = structlog.get_logger("perfsdk.experiments.sweep")

ProgressFn = Callable[[int, int, PointState | None], None]


class SweepRunner:
    """Runs a :class:`Sweep` through an executor, keeping the manifest up to date.

    With several strategies (``strategies: [grid, tpe]``) each runs in turn over the same space;
    a point whose configuration already has a finished run (measured for an earlier strategy,
    or stored by an earlier invocation) is answered from that run, so comparing strategies
    costs only the points no strategy tried before. Each strategy's trials, in order, are kept
    in the manifest (``trials``) with their best-so-far objective (``efficiency``).
    """

    def __init__(self, sweep: Sweep, store: str | Path, executor: Any = None, *, resume: bool = True,
                 progress: ProgressFn | None = None,
                 workload: str | Callable[[Any], Any] | None = None) -> None:
        from perfsdk.experiments.executors import LocalExecutor

        self.sweep = sweep
        self.store = Store(Path(store).resolve())
        self.executor = executor or LocalExecutor()
        self.resume = resume
        self.progress = progress
        # resolved now, not at import, so that tests can swap the module-level default
        self.workload = workload if workload is not None else (sweep.workload or DEFAULT_WORKLOAD)
        self.points: dict[str, PointState] = {}
        self._exporters: dict[str, type] | None = None
        self.trials: dict[str, list[str]] = {}
        self.status = "running"
        self.created_at = datetime.now(timezone.utc).isoformat()
        self.started = time.time()
        self._total = 0
        self._hashes: dict[str, str] = {}
        self._resolved = False

    # manifest --------------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        spec = self.sweep.spec
        primary = spec.primary()
        out = {
            "sweep_id": self.sweep.sweep_id,
            "name": self.sweep.name,
            "status": self.status,
            "created_at": self.created_at,
            "updated_at": datetime.now(timezone.utc).isoformat(),
            "source": self.sweep.source,
            "strategy": spec.strategy if not spec.compare else ",".join(spec.strategy_list),
            "strategies": spec.strategy_list,
            "budget": spec.budget,
            "seed": spec.seed,
            "executor": getattr(self.executor, "name", type(self.executor).__name__),
            "axes": spec.axes,
            "objectives": [o.model_dump() for o in spec.objectives],
            "objective": spec.objective.model_dump() if spec.objective else None,
            "primary": primary.model_dump() if primary else None,
            "constraints": [str(c) for c in spec.constraints],
            "report": spec.report.model_dump(),
            "base": self.sweep.base,
            "points": [asdict(p) for p in self.points.values()],
            "pareto": [p.point_id for p in self.points.values() if p.pareto],
            "trials": self.trials,
        }
        out.update(sample_efficiency(out))
        return out

    def save_manifest(self) -> Path:
        return write_manifest(self.store, self.sweep.sweep_id, self.manifest())

    # state from the store --------------------------------------------------------------------

    def _finished_in_store(self) -> dict[str, tuple[str, str]]:
        """point id (and ``config:<hash>``) -> (run id, status) of the best run of each point
        already stored for this sweep."""
        out: dict[str, tuple[str, str]] = {}
        if not self.store.runs_dir.is_dir():
            return out
        for run in self.store.list_runs(tags={"sweep_id": self.sweep.sweep_id}):
            for key in (run.tags.get("sweep_point"), "config:" + run.tags["config_hash"] if run.tags.get("config_hash") else None):
                if key is None:
                    continue
                prev = out.get(key)
                # a finished run wins over a failed one; among equals the latest (ids sort by time)
                rank = (run.status in FINISHED, run.run_id)
                if prev is None or rank > (prev[1] in FINISHED, prev[0]):
                    out[key] = (run.run_id, run.status)
        return out

    def _config_hash(self, values: dict[str, Any]) -> str:
        pid = point_id(values)
        h = self._hashes.get(pid)
        if h is None:
            h = config_hash(self.sweep.point_config(values))
            self._hashes[pid] = h
        return h

    def _task(self, st: PointState) -> PointTask:
        spec = self.sweep.spec
        return PointTask(sweep_id=self.sweep.sweep_id, point_id=st.point_id, values=st.values,
                         config=self.sweep.point_config(st.values), store=str(self.store.root),
                         quality=spec.quality.model_dump() if spec.quality else None, workload=self.workload,
                         ship=bool(getattr(self.executor, "remote", False)), config_hash=st.config_hash)

    def _store_bundle(self, outcome: PointOutcome) -> PointOutcome:
        """Save a run that a worker sent back; a run the driver cannot store fails its point."""
        assert outcome.bundle is not None
        if self._exporters is None:
            from perfsdk.plugins import installed_registry

            self._exporters = dict(installed_registry().exporters)
        try:
            outcome.bundle.save(self.store, self._exporters)
        except Exception as exc:
            log.error("could not store a point's run", point=outcome.point_id, run_id=outcome.run_id, error=repr(exc))
            return PointOutcome(outcome.point_id, "failed", None,
                                f"the driver could not store run {outcome.run_id}: {type(exc).__name__}: {exc}")
        return PointOutcome(outcome.point_id, outcome.status, outcome.run_id, outcome.error)

    def _record(self, outcome: PointOutcome) -> PointState:
        if outcome.bundle is not None:
            outcome = self._store_bundle(outcome)
        st = self.points[outcome.point_id]
        st.status, st.run_id, st.error = outcome.status, outcome.run_id, outcome.error
        if outcome.status in FINISHED and outcome.run_id:
            self._evaluate(st)
        self.save_manifest()
        return st

    def _evaluate(self, st: PointState) -> None:
        from perfsdk.exporters.flatten import run_row
        from perfsdk.experiments.sweep.overview import point_figures

        try:
            run = self.store.get(st.run_id)  # type: ignore[arg-type]
            row = run_row(run)
        except Exception as exc:
            log.warning("could not read point run", run_id=st.run_id, error=repr(exc))
            return
        if run.validity is not None:
            st.validity, st.validity_reasons = run.validity.verdict, list(run.validity.reasons)
        st.figures = point_figures(row)
        if not self._resolved:  # names as the user typed them -> the columns the runs have
            self.sweep.spec = self.sweep.spec.resolved(list(row))
            self._resolved = True
        spec = self.sweep.spec
        st.objectives = {f: _num(row.get(f)) for f in spec.fields()}
        if spec.objective is not None:
            st.objectives[SCORE] = spec.objective.score(row)
        checks = [c.check(row)[0] for c in spec.constraints]
        st.feasible = None if any(c is None for c in checks) else all(checks)

    def _violation(self, st: PointState) -> float:
        row = {k: v for k, v in st.objectives.items()}
        return sum(c.check(row)[1] for c in self.sweep.spec.constraints)

    def _tick(self, st: PointState | None) -> None:
        if self.progress is not None:
            done = sum(1 for p in self.points.values() if p.status != "pending" and p.status != "running")
            self.progress(done, max(self._total, done), st)

    # run -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run (or resume) the sweep; returns the final manifest."""
        known = self._finished_in_store() if self.resume else {}
        spec = self.sweep.spec
        self._total = self._estimate_total()
        try:
            for strategy in spec.strategy_list:
                self.trials[strategy] = []
                if strategy in ADAPTIVE:
                    self._run_adaptive(strategy, known)
                else:
                    self._run_static(strategy, known)
        except BaseException:
            self.status = "interrupted"
            for p in self.points.values():
                if p.status == "running":
                    p.status = "pending"
            self._finish_front()
            self.save_manifest()
            raise
        self.status = "finished"
        self._finish_front()
        self.save_manifest()
        return self.manifest()

    def _estimate_total(self) -> int:
        """Distinct points the sweep will need at most (for the progress bar)."""
        seen: set[str] = set()
        adaptive = 0
        for strategy in self.sweep.spec.strategy_list:
            if strategy in ADAPTIVE:
                adaptive = max(adaptive, self.sweep.strategy_budget(strategy) or 0)
            else:
                seen.update(point_id(v) for v in self.sweep.static_points(strategy))
        return min(grid_size(self.sweep.spec.axes), max(len(seen), adaptive))

    def _state(self, values: dict[str, Any], known: dict[str, tuple[str, str]], strategy: str) -> PointState:
        """The point's state: shared across strategies; known from the store when it ran before."""
        pid = point_id(values)
        st = self.points.get(pid)
        if st is None:
            st = PointState(pid, values, config_hash=self._config_hash(values))
            hit = known.get(pid) or known.get("config:" + (st.config_hash or ""))
            if hit is not None:
                st.run_id, st.status = hit
                if st.status in FINISHED:
                    self._evaluate(st)
                else:
                    st.status = "pending"  # a failed or interrupted point runs again
            self.points[pid] = st
        if strategy not in st.strategies:
            st.strategies.append(strategy)
        return st

    def _run_static(self, strategy: str, known: dict[str, tuple[str, str]]) -> None:
        states = [self._state(values, known, strategy) for values in self.sweep.static_points(strategy)]
        self.trials[strategy] = [st.point_id for st in states]
        todo = list({p.point_id: p for p in states if p.status == "pending"}.values())
        self.save_manifest()
        self._tick(None)
        for p in todo:
            p.status = "running"
        for outcome in self.executor.run(execute_point, [self._task(p) for p in todo]):
            self._tick(self._record(outcome))

    def _run_adaptive(self, strategy: str, known: dict[str, tuple[str, str]]) -> None:
        spec = self.sweep.spec
        tpe = OptunaStrategy(spec.axes, spec.adaptive_objectives(), seed=spec.seed,
                             n_startup_trials=spec.strategy_options.n_startup_trials)
        budget = self.sweep.strategy_budget(strategy) or 1
        trials = self.trials[strategy]
        if not spec.compare:
            # resuming a single adaptive sweep: the points that already ran seed the study
            for key, (run_id, status) in known.items():
                if key.startswith("config:") or status not in FINISHED:
                    continue
                try:
                    run = self.store.get(run_id)
                except Exception:
                    continue
                values = {k: _axis_value(spec.axes[k], run.tags.get(k)) for k in spec.axes}
                if any(v is _MISSING for v in values.values()):
                    continue
                st = self._state(values, known, strategy)
                tpe.add_known(values, self._objective_values(st), self._violation(st))
                trials.append(st.point_id)
        self.save_manifest()
        self._tick(None)
        attempts = 0
        while len(trials) < budget and attempts < budget * 20:
            attempts += 1
            number, values = tpe.ask()
            st = self._state(values, known, strategy)
            if st.point_id in trials:  # proposed again: answer from what it gave, not a new trial
                tpe.tell(number, self._objective_values(st) if st.status in FINISHED else None, self._violation(st))
                continue
            trials.append(st.point_id)
            if st.status not in FINISHED:
                st.status = "running"
                for outcome in self.executor.run(execute_point, [self._task(st)]):
                    self._record(outcome)
                self._tick(st)
            else:  # measured before (another strategy, an earlier invocation): its run answers
                self.save_manifest()
            tpe.tell(number, self._objective_values(st) if st.status in FINISHED else None, self._violation(st))

    def _objective_values(self, st: PointState) -> list[float] | None:
        vals = [st.objectives.get(o.field) for o in self.sweep.spec.adaptive_objectives()]
        if any(v is None for v in vals):
            return None
        return [float(v) for v in vals]  # type: ignore[arg-type]

    def _finish_front(self) -> None:
        objs = self.sweep.spec.objectives
        pts = list(self.points.values())
        for p in pts:
            p.pareto = False
        if not objs:
            return
        cands = [p for p in pts if p.status in FINISHED and p.feasible is not False]
        for i in pareto_indices([p.objectives for p in cands], objs):
            cands[i].pareto = True


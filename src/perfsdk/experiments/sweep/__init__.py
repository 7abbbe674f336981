"""Sweeps: many runs over a grid (or a sample) of config values, resumable, tracked in a manifest.

A sweep file has the top-level keys ``name``, ``base`` (a config, inline or a path relative to
the sweep file), ``axes`` (dotted config path -> list of values), ``strategy`` (or
``strategies`` to compare several), ``budget``, ``seed``, ``objectives``, ``objective`` (a
weighted score), ``constraints``, ``quality``, ``workload`` (a function to run at each point)
and ``report``. Every point is a normal stored run, tagged ``sweep_id``, ``sweep_point`` (a
hash of the point's values), ``config_hash`` (a hash of its whole configuration) and one tag
per axis. Strategies compared in one sweep share the measured points: a configuration measured
for one is answered from its stored run for the others.
The manifest ``<store>/sweeps/<sweep_id>.json`` (written atomically) tracks the points; the
store's tags are the source of truth, so a sweep that was interrupted resumes by skipping points
that already have a finished (``ok`` or ``partial``) run.

Only the driver writes the store. Points run by a remote executor (Ray, Slurm) measure with no
store at all and send the finished run back as a :class:`RunBundle` (result, series, artifacts),
which the driver saves: workers need no access to the store's file system, and its SQLite index
never has to live on a network file system.

The parts, by job:

- :mod:`~perfsdk.experiments.sweep.spec` — the sweep file's models and their validation
  (objectives, constraints, the weighted objective, quality, report heat maps).
- :mod:`~perfsdk.experiments.sweep.points` — :class:`Sweep` and each point's config, point and
  sweep ids, configuration hashes, the tags of a point's run.
- :mod:`~perfsdk.experiments.sweep.load` — :func:`load_sweep`: reading and checking a sweep file.
- :mod:`~perfsdk.experiments.sweep.execute` — running one point (:func:`execute_point`) and
  shipping its run back (:class:`RunBundle`).
- :mod:`~perfsdk.experiments.sweep.manifest` — reading and writing the manifest.
- :mod:`~perfsdk.experiments.sweep.runner` — :class:`SweepRunner`: the driver, resume included.
  The workload a point runs by default is ``runner.DEFAULT_WORKLOAD``, read when a runner is made.
- :mod:`~perfsdk.experiments.sweep.efficiency` — comparing strategies (best so far, trials to
  reach the optimum).
"""

from __future__ import annotations

from perfsdk.experiments.sweep.efficiency import sample_efficiency
from perfsdk.experiments.sweep.execute import (
    DEFAULT_WORKLOAD,
    PointOutcome,
    PointTask,
    RunBundle,
    execute_point,
    resolve_workload,
)
from perfsdk.experiments.sweep.load import load_sweep
from perfsdk.experiments.sweep.manifest import (
    FINISHED,
    PointState,
    list_sweeps,
    manifest_path,
    read_manifest,
    write_manifest,
)
from perfsdk.experiments.sweep.points import Sweep, config_hash, point_id, point_tags, set_path, sweep_id_for
from perfsdk.experiments.sweep.runner import ProgressFn, SweepRunner
from perfsdk.experiments.sweep.spec import (
    ADAPTIVE,
    SCORE,
    Constraint,
    Heatmap,
    PerplexitySpec,
    QualitySpec,
    ReportSpec,
    StrategyName,
    StrategyOptions,
    SweepError,
    SweepSpec,
    WeightedObjective,
)

__all__ = [
    "ADAPTIVE", "DEFAULT_WORKLOAD", "FINISHED", "SCORE", "Constraint", "Heatmap", "PerplexitySpec", "PointOutcome",
    "PointState", "PointTask", "ProgressFn", "QualitySpec", "ReportSpec", "RunBundle", "StrategyName",
    "StrategyOptions", "Sweep", "SweepError", "SweepRunner", "SweepSpec", "WeightedObjective", "config_hash",
    "execute_point", "list_sweeps", "load_sweep", "manifest_path", "point_id", "point_tags", "read_manifest",
    "resolve_workload", "sample_efficiency", "set_path", "sweep_id_for", "write_manifest",
]

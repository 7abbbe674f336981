"""Experiments: sweeps over config knobs, comparisons between runs, Pareto fronts and reports.

- :mod:`perfsdk.experiments.frame` — stored runs as a pandas DataFrame (``perfsdk.load_runs``).
- :mod:`perfsdk.experiments.sweep` — sweep files, point generation, running and resuming.
- :mod:`perfsdk.experiments.strategies` — grid, random, Latin hypercube and Optuna TPE.
- :mod:`perfsdk.experiments.executors` — where points run: in-process, Ray or Slurm (submitit).
- :mod:`perfsdk.experiments.compare` — bootstrap comparisons over per-request samples.
- :mod:`perfsdk.experiments.pareto` — non-dominated points for two or more objectives.
- :mod:`perfsdk.experiments.report` — self-contained HTML reports with inline PNG figures.
- :mod:`perfsdk.experiments.quality` — exact match, accuracy, macro F1, perplexity.
"""

"""HTML reports for a run or a sweep: one self-contained page (PNG figures inline as base64)
plus the same PNGs in a folder next to it (``<name>_files/``).

Figures are drawn with matplotlib's Agg canvas (no display, no global pyplot state). Every
figure and table is optional: what a run did not measure is left out with a note, never drawn
as zeros.

The parts, by job:

- :mod:`~perfsdk.experiments.report.figures` — drawing helpers and a run's figures (latency CDF,
  per-token latency, utilization over time, bar charts), which collectors use for their sections.
- :mod:`~perfsdk.experiments.report.run` — the sections of a single-run report.
- :mod:`~perfsdk.experiments.report.sweep` — the sections of a sweep report (batch-size and
  vision-token panels, Pareto front, sample efficiency, heat maps).
- :mod:`~perfsdk.experiments.report.page` — the HTML page: :func:`render_html`,
  :func:`build_report`, :func:`write_report`.
"""

from __future__ import annotations

from perfsdk.experiments.report.figures import (
    PALETTE,
    PHASE_COLORS,
    Figure,
    ReportError,
    Section,
    bar_figure,
    latency_cdf,
    per_token_latency,
    request_samples,
    utilization_over_time,
)
from perfsdk.experiments.report.page import CSS, build_report, render_html, write_report
from perfsdk.experiments.report.run import run_sections
from perfsdk.experiments.report.sweep import (
    MAX_PANELS,
    PANELS_PER_COLLECTOR,
    vision_panels,
    vision_x_columns,
    batch_size_panels,
    default_objectives,
    efficiency_figure,
    heatmap_figure,
    metric_panels,
    pareto_plot,
    sweep_sections,
    vision_token_panels,
)

__all__ = [
    "CSS", "MAX_PANELS", "PALETTE", "PANELS_PER_COLLECTOR", "PHASE_COLORS", "vision_panels", "vision_x_columns", "Figure",
    "ReportError", "Section", "bar_figure", "batch_size_panels", "build_report", "default_objectives",
    "efficiency_figure", "heatmap_figure", "latency_cdf", "metric_panels", "pareto_plot", "per_token_latency",
    "render_html", "request_samples", "run_sections", "sweep_sections", "utilization_over_time",
    "vision_token_panels", "write_report",
]

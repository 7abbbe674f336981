"""Metric names as users type them, resolved against what stored runs actually contain.

``perfsdk compare --metric``, ``perfsdk runs --metric`` and a sweep's objectives and
constraints all name a metric the same ways, resolved in this order:

1. a sampled metric of an installed collector (``ttft_s``, ``output_tokens_per_s``; see
   ``Collector.compare_metrics``), also as ``latency.ttft_s`` or ``collectors.latency.ttft_s``;
2. a flattened result column, whole (``collectors.gencount.output_tokens``,
   ``records.perplexity``, ``validity.verdict``);
3. a collector's own name for one of its fields: ``gencount.output_tokens`` is
   ``collectors.gencount.output_tokens``;
4. an unambiguous suffix: ``output_tokens_per_s.p50`` or ``perplexity``; suffixes inside a
   collector's result are tried before the rest of the run.

A name that matches nothing, or a suffix that matches several columns, raises
:class:`MetricNameError` with "did you mean" suggestions or the candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from perfsdk.suggest import close_matches


class MetricNameError(ValueError):
    """An unknown or ambiguous metric name; the message lists suggestions or candidates."""


def sampled_owners() -> dict[str, str]:
    """Sampled metric -> the name of the installed collector that declares it."""
    from perfsdk.plugins import installed_registry, ordered_collectors

    reg = installed_registry()
    out: dict[str, str] = {}
    for name in ordered_collectors(reg.collectors, reg):
        for metric in reg.collectors[name].compare_metrics():
            out.setdefault(metric, name)
    return out


def run_columns(runs: Iterable[Any]) -> list[str]:
    """Every flattened column of ``runs`` (the CSV export's columns), in first-seen order."""
    from perfsdk.exporters.flatten import run_row

    cols: dict[str, None] = {}
    for run in runs:
        cols.update(dict.fromkeys(run_row(run)))
    return list(cols)


def _short(column: str) -> str:
    """``collectors.latency.ttft_s.p50`` -> ``latency.ttft_s.p50`` (a collector's own name)."""
    return column.split(".", 1)[1] if column.startswith("collectors.") and column.count(".") >= 2 else column


def resolve_metric(name: str, columns: Sequence[str], sampled: Mapping[str, str] | None = None) -> str:
    """The metric ``name`` stands for among ``columns`` (flattened result columns) and
    ``sampled`` (sampled metric -> owning collector): a sampled metric name or a full column.

    Raises :class:`MetricNameError` for an unknown name (with suggestions) or a suffix that
    matches several columns (listing them).
    """
    sampled = dict(sampled or {})
    text = name.strip()
    if text in sampled:
        return text
    parts = text.removeprefix("collectors.").split(".")
    if len(parts) == 2 and sampled.get(parts[1]) == parts[0]:
        return parts[1]
    cols = list(dict.fromkeys(columns))
    if text in cols:
        return text
    if "collectors." + text in cols:
        return "collectors." + text
    tail = "." + text
    hits = [c for c in cols if c.endswith(tail)]
    own = [c for c in hits if c.startswith("collectors.")]
    for group in (own, hits):
        if len(group) == 1:
            return group[0]
        if len(group) > 1:
            shown = ", ".join(group[:8]) + (f" and {len(group) - 8} more" if len(group) > 8 else "")
            raise MetricNameError(f"metric {text!r} is ambiguous: it matches {shown}; give more of the name")
    raise MetricNameError(f"unknown metric {text!r}" + _suggestions(text, cols, sampled))


def _suggestions(text: str, columns: Sequence[str], sampled: Mapping[str, str]) -> str:
    """`` (did you mean ...?)`` from the runs' metrics, or the fields of a collector the name
    starts with, or a pointer to where the names are listed."""
    choices: dict[str, None] = dict.fromkeys(sampled)
    choices.update(dict.fromkeys(_short(c) for c in columns))
    found = close_matches(text, choices, n=3)
    if not found:  # the last part alone: "ttft_ss" against "ttft_s", "gencount.bogs" against "bogus"
        last = {c.rsplit(".", 1)[-1]: c for c in choices}
        found = [last[m] for m in close_matches(text.rsplit(".", 1)[-1], last, n=3)]
    if found:
        return " (did you mean " + " or ".join(repr(f) for f in found) + "?)"
    head = text.removeprefix("collectors.").split(".", 1)[0]
    fields = [_short(c).split(".", 1)[1] for c in columns
              if c.startswith(f"collectors.{head}.")]
    if fields:
        shown = ", ".join(fields[:10]) + (", ..." if len(fields) > 10 else "")
        return f"; collector {head} has: {shown}"
    return "; 'perfsdk runs --json' or 'perfsdk export' show the runs' fields"


def resolve_metrics(names: Iterable[str], runs: Iterable[Any], *, sampled: bool = True) -> list[str]:
    """:func:`resolve_metric` for each of ``names`` against ``runs``; duplicates dropped."""
    cols = run_columns(runs)
    owners = sampled_owners() if sampled else {}
    return list(dict.fromkeys(resolve_metric(n, cols, owners) for n in names))

"""CLI commands of the experiments package: ``perfsdk sweep``, ``perfsdk compare``, ``perfsdk report``.

Registered through ``perfsdk_register_commands`` like any third-party command.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from perfsdk.plugins import hookimpl
from perfsdk.terminal import echo_wrapped, echo_error, fail, make_console

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: ``perfsdk compare --fail-if-slower``: a baseline or candidate run is ``invalid``, so (part of)
#: the comparison passed no judgement; nothing judged was slower.
EXIT_NOT_JUDGED = 3


def _usage(message: str) -> None:
    fail(message, EXIT_USAGE)


def resolve_ident(store: Any, ident: str) -> str:
    """A run id, a unique prefix of one, or ``latest`` -> the full run id; a sweep id is kept.
    ``latest`` names the most recent sweep when the most recent run belongs to one.

    A damaged run, or a prefix that matches several runs, is a usage error that says so.
    """
    from perfsdk.experiments.sweep import manifest_path
    from perfsdk.store import AmbiguousRunId, RunNotFound, StoreError

    try:
        rid = store.resolve_run_id(ident)
    except RunNotFound:
        return ident  # perhaps a sweep id
    except AmbiguousRunId as err:
        if manifest_path(store, ident).is_file():
            return ident
        _usage(f"{err}; give more of the id")
        return ident
    try:
        run = store.get(rid)
    except StoreError as err:
        _usage(str(err))
        return rid
    if ident == "latest" and run.tags.get("sweep_id") and manifest_path(store, run.tags["sweep_id"]).is_file():
        return run.tags["sweep_id"]  # the most recent run belongs to a sweep: latest names the sweep
    return rid


from perfsdk.fmt import fmt_cell as _fmt  # noqa: E402


class _SweepProgress:
    """A rich progress bar with ETA on a terminal; one line per point otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _SweepProgress:
        if self.enabled and self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("sweep points"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}"),
                                console=Console(stderr=True))
            self.bar.start()
        return self

    def __call__(self, done: int, total: int, point: Any) -> None:
        label = ""
        if point is not None:
            vals = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.values.items())
            label = f"{point.status} ({vals})"
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task("", total=total, completed=done)
            self.bar.update(self.task, completed=done, total=total, description=label)
        elif self.enabled and point is not None:
            click.echo(f"point {done}/{total} {label}" + (f": {point.error}" if point.error else ""), err=True)

    def __exit__(self, *a: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def print_sweep_summary(manifest: dict[str, Any], console: Console) -> None:
    """The sweep's points with objective values, records and quality figures, validity,
    feasibility and the Pareto front; then the sweep's validity and what each constraint
    removed from the front."""
    from perfsdk.experiments.sweep.overview import constraint_lines, figure_fields, validity_line
    axes = list(manifest["axes"])
    objs = manifest.get("objectives") or []
    fields = [o["field"] for o in objs]
    for c in manifest.get("constraints") or []:
        f = c.split()[0]
        if f not in fields:
            fields.append(f)
    t = Table(title=f"sweep {manifest['sweep_id']} ({manifest['status']})", show_edge=False)
    for a in axes:
        t.add_column(a.rsplit(".", 1)[-1])
    t.add_column("status")
    if manifest.get("objective"):
        fields = fields + [f for f in manifest["objective"]["weights"] if f not in fields] + ["score"]
    for f in fields:
        t.add_column(".".join(f.split(".")[-2:]), justify="right")
    extra = figure_fields(manifest["points"], exclude=fields)
    for f in extra:
        t.add_column(f.removeprefix("collectors."), justify="right")
    t.add_column("validity")
    if manifest.get("constraints"):
        t.add_column("feasible")
    if objs:
        t.add_column("pareto")
    t.add_column("run", no_wrap=True)
    for p in manifest["points"]:
        row = [str(p["values"].get(a)) for a in axes] + [p["status"]]
        row += [_fmt(p["objectives"].get(f)) for f in fields]
        row += [_fmt((p.get("figures") or {}).get(f)) for f in extra]
        row.append(p.get("validity") or "-")
        if manifest.get("constraints"):
            row.append({True: "yes", False: "no", None: "-"}[p["feasible"]])
        if objs:
            row.append("*" if p["pareto"] else "")
        row.append(p["run_id"] or "-")
        t.add_row(*row)
    console.print(t)
    if manifest.get("objective"):
        w = manifest["objective"]
        terms = " + ".join(f"{wt:g} × {f}" + (f" / {w['scale'][f]:g}" if f in (w.get("scale") or {}) else "")
                           for f, wt in w["weights"].items())
        console.print(f"score = {terms}")
    failed = [p for p in manifest["points"] if p["status"] == "failed"]
    for p in failed:
        console.print(f"[red]failed[/] {p['values']}: {p['error']}")
    n_ok = sum(1 for p in manifest["points"] if p["status"] in ("ok", "partial"))
    console.print(f"{n_ok}/{len(manifest['points'])} points finished, {len(failed)} failed", highlight=False)
    for line in [validity_line(manifest["points"]), *constraint_lines(manifest)]:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def print_efficiency(manifest: dict[str, Any], console: Console) -> None:
    """Best-so-far objective per strategy against the trial count, and the trials each needed
    to reach the grid's optimum (only when the sweep compared strategies)."""
    eff = manifest.get("efficiency") or {}
    if len(eff) < 2 or not manifest.get("primary"):
        return
    primary = manifest["primary"]
    label = "score" if primary["field"] == "score" else ".".join(primary["field"].split(".")[-2:])
    t = Table(title=f"sample efficiency: best {label} so far ({primary['direction']})", show_edge=False)
    t.add_column("trial", justify="right")
    names = list(eff)
    for n in names:
        t.add_column(n, justify="right")
    longest = max(len(e["best_so_far"]) for e in eff.values())
    for k in range(longest):
        t.add_row(str(k + 1), *[_fmt(eff[n]["best_so_far"][k]) if k < len(eff[n]["best_so_far"]) else "" for n in names])
    source = "the grid's optimum" if manifest.get("optimum_source") == "grid" else "the best point found"
    t.add_section()
    t.add_row(f"to reach {source} ({_fmt(manifest.get('optimum'))})",
              *[str(eff[n]["trials_to_optimum"]) if eff[n]["trials_to_optimum"] is not None else "never" for n in names])
    console.print(t)
    measured = sum(1 for p in manifest["points"] if p["status"] in ("ok", "partial"))
    trials = sum(e["trials"] for e in eff.values())
    console.print(f"{trials} trials over {len(names)} strategies needed {measured} measured points "
                  "(a configuration is measured once and shared)")


def _sigterm_as_interrupt() -> Any:
    """A scheduler's SIGTERM stops the sweep like Ctrl-C: the current run is stored as failed
    and the manifest marked interrupted, so that the sweep resumes cleanly."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"interrupted by {signal.Signals(signum).name}")

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


@click.command("sweep")
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--store", "store_dir", default=None, help="Result store folder (default: the base config's store field).")
@click.option("--executor", type=click.Choice(["local", "ray", "submitit"]), default="local", show_default=True,
              help="Where points run.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Skip points that already have a finished run in the store.")
@click.option("--compare-strategies", "compare", default=None, metavar="A,B",
              help="Run these strategies over the same space (e.g. grid,tpe) and compare their sample efficiency.")
@click.option("--json", "as_json", is_flag=True, help="Print the final manifest as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress, only the sweep id.")
def sweep_cmd(sweep_file: str, store_dir: str | None, executor: str, resume: bool, compare: str | None,
              as_json: bool, quiet: bool) -> None:
    """Run a sweep: every point of SWEEP_FILE's axes is a stored run tagged with the sweep id."""
    from perfsdk.experiments.executors import ExecutorUnavailable, get_executor
    from perfsdk.experiments.strategies import StrategyUnavailable
    from perfsdk.experiments.sweep import SweepError, SweepRunner, load_sweep

    strategies = [x.strip() for x in compare.split(",") if x.strip()] if compare else None
    try:
        sweep = load_sweep(sweep_file, strategies=strategies)
    except SweepError as err:
        _usage(str(err))
        return
    store = store_dir or sweep.base.get("store") or "perfsdk-results"
    try:
        ex = get_executor(executor, sweep.spec.executor_options, workdir=Path(store) / "sweeps" / sweep.sweep_id)
    except ExecutorUnavailable as err:
        _usage(str(err))
        return
    if not quiet and not as_json:
        click.echo(f"sweep {sweep.sweep_id}: {', '.join(sweep.spec.strategy_list)}, store {store}", err=True)
    previous = _sigterm_as_interrupt()
    try:
        with _SweepProgress(not quiet and not as_json) as progress:
            runner = SweepRunner(sweep, store, ex, resume=resume, progress=progress)
            manifest = runner.run()
    except KeyboardInterrupt:
        echo_error(f"sweep {sweep.sweep_id} interrupted; run the same command again to resume")
        sys.exit(130)
    except (StrategyUnavailable, SweepError) as err:
        _usage(str(err))
        return
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(manifest, indent=2, default=str))
    elif quiet:
        click.echo(sweep.sweep_id)
    else:
        console = make_console()
        print_sweep_summary(manifest, console)
        print_efficiency(manifest, console)
    failed = any(p["status"] == "failed" for p in manifest["points"])
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _pairs(store: Any, results: list[Any]) -> list[tuple[str, str, list[Any]]]:
    """(baseline, candidate, differences) of each pair of runs compared."""
    from perfsdk.experiments.likeness import differences

    pairs = dict.fromkeys((c.baseline, c.candidate) for c in results)
    return [(a, b, differences(store.get(a), store.get(b))) for a, b in pairs]


def _differences(store: Any, results: list[Any]) -> dict[str, list[str]]:
    """Each difference between compared runs, once, with the candidates that show it."""
    out: dict[str, list[str]] = {}
    for _, cand, diffs in _pairs(store, results):
        for d in diffs:
            out.setdefault(str(d), []).append(cand)
    return out


def _differences_json(store: Any, results: list[Any]) -> list[dict[str, Any]]:
    return [{"baseline_run": a, "candidate_run": b, **d.to_dict()} for a, b, diffs in _pairs(store, results)
            for d in diffs]


def _why_unjudgeable(c: Any) -> str:
    if c.baseline_value is None or c.candidate_value is None:
        missing = [rid for rid, v in ((c.baseline, c.baseline_value), (c.candidate, c.candidate_value)) if v is None]
        return f"no value in {', '.join(missing)}"
    if c.samples is None:
        return "the field has no per-step samples, so no confidence interval"
    return c.note or "no confidence interval"


@click.command("compare")
@click.argument("ids", nargs=-1, required=True)
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--metric", "metrics", multiple=True,
              help="Metric to compare (repeatable): ttft_s, tpot_s, e2e_s, output_tokens_per_s, or any result "
                   "field, whole (collectors.gencount.output_tokens), by its collector's name (gencount.output_tokens) "
                   "or by an unambiguous suffix. Default: the first four.")
@click.option("--stat", default="mean", show_default=True, help="Statistic compared: mean, p50, p90, p95, p99.")
@click.option("--fail-if-slower", "fail_if_slower", default=None, metavar="PCT",
              help="Exit 1 when a candidate is significantly worse than the baseline by more than PCT (e.g. 5%); "
                   "exit 3 when nothing was worse but a run involved is invalid (not judged); exit 2 when a metric "
                   "has no samples to judge.")
@click.option("--allow-different", "allow_different", is_flag=True,
              help="Compare runs whose workloads, models or hardware differ without listing the differences "
                   "(and let --fail-if-slower judge them).")
@click.option("--bootstrap", "n_boot", default=2000, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", default=0, show_default=True, help="Seed of the bootstrap.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def compare_cmd(ids: tuple[str, ...], store_dir: str, metrics: tuple[str, ...], stat: str, fail_if_slower: str | None,
                allow_different: bool, n_boot: int, seed: int, as_json: bool) -> None:
    """Compare runs or sweeps with the first one: relative change and significance.

    Differences in workload, model or hardware between the runs compared are listed before the
    table; with --fail-if-slower they are an error unless --allow-different is given.

    IDS are run ids, unique prefixes of run ids, 'latest', or sweep ids.
    """
    from perfsdk.experiments.compare import (
        DEFAULT_METRICS,
        CompareError,
        compare,
        estimator_notes,
        parse_threshold,
        slower_than,
        unjudgeable,
        validity_notes,
    )
    from perfsdk.store import Store

    if not Path(store_dir).is_dir():
        _usage(f"--store {store_dir}: no such result store")
    store = Store(store_dir)
    ids = tuple(resolve_ident(store, i) for i in ids)
    try:
        threshold = parse_threshold(fail_if_slower) if fail_if_slower is not None else None
        results = compare(store, ids, list(metrics) or list(DEFAULT_METRICS), stat=stat, n_boot=n_boot,
                          seed=seed)
    except CompareError as err:
        _usage(str(err))
        return
    unlike = _differences(store, results)
    if unlike and not allow_different and not as_json:
        echo_wrapped("the runs compared did not measure the same thing (--allow-different: compare anyway, "
                     "quietly):")
        for text, cands in unlike.items():
            echo_wrapped(f"  {cands[0] if len(cands) == 1 else f'{len(cands)} candidates'}: {text}", indent="    ")
    if unlike and threshold is not None and not allow_different:
        _usage("--fail-if-slower judges like with like; these runs differ as listed (pass --allow-different "
               "when the difference is what you compare)")
    if threshold is not None:
        blind = unjudgeable(results)
        if blind:
            for c in blind:
                echo_error(f"--fail-if-slower cannot judge {c.metric} of {c.candidate} against {c.baseline}: "
                           + _why_unjudgeable(c))
            _usage("a gate on a metric it cannot judge never passes; compare other metrics or drop --fail-if-slower")
    failing = slower_than(results, threshold) if threshold is not None else []
    not_judged = sorted({rid for c in results for rid, v in ((c.baseline, c.baseline_verdict),
                                                              (c.candidate, c.candidate_verdict)) if v == "invalid"})
    store = Store(store_dir)
    involved = {c.baseline for c in results} | {c.candidate for c in results}
    notes = validity_notes([store.get(rid) for rid in sorted(involved)])
    if as_json:
        click.echo(json.dumps({"baseline": ids[0], "stat": stat, "comparisons": [c.to_dict() for c in results],
                               "fail_if_slower": threshold, "failed": bool(failing), "validity": notes,
                               "not_judged": not_judged, "differences": _differences_json(store, results)},
                              indent=2, default=str))
    else:
        t = Table(title=f"{stat}: candidates vs baseline {ids[0]}", show_edge=False)
        has_point = any(c.point for c in results)
        cols = (["point"] if has_point else []) + ["candidate", "metric", "baseline", "candidate value", "change",
                                                   "95% CI", "verdict"]
        for col in cols:
            t.add_column(col, justify="right" if col in ("baseline", "candidate value", "change", "95% CI") else "left",
                         no_wrap=col == "candidate")
        for c in results:
            ci = f"[{c.ci_low * 100:+.1f}%, {c.ci_high * 100:+.1f}%]" if c.ci_low is not None and c.ci_high is not None else "-"
            change = f"{c.change * 100:+.1f}%" if c.change is not None else "-"
            style = {"slower": "red", "faster": "green"}.get(c.verdict)
            verdict = f"[{style}]{c.verdict}[/]" if style else c.verdict
            if not c.judged:
                verdict += " [red](not judged)[/]"
            row = ([c.point or ""] if has_point else []) + [c.candidate, c.metric, _fmt(c.baseline_value),
                                                            _fmt(c.candidate_value), change, ci, verdict]
            t.add_row(*row)
        make_console().print(t)
        for line in estimator_notes(results, stat):
            echo_wrapped(line)
        for note in notes:
            echo_wrapped(f"validity: {note}", err=True)
        if failing:
            worst = max(failing, key=lambda c: c.slowdown or 0)
            echo_wrapped(f"FAIL: {worst.candidate} {worst.metric} is {worst.slowdown * 100:.1f}% worse than "  # type: ignore[operator]
                         f"{worst.baseline} (limit {threshold * 100:.1f}%)", err=True)  # type: ignore[operator]
        elif threshold is not None and not_judged:
            echo_wrapped(f"NOT JUDGED: invalid run(s) {', '.join(not_judged)}: --fail-if-slower passes no judgement "
                         "on them (exit 3)", err=True)
    if failing:
        sys.exit(EXIT_FAILED)
    sys.exit(EXIT_NOT_JUDGED if threshold is not None and not_judged else EXIT_OK)


@click.command("report")
@click.argument("ident")
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--output", "-o", default=None,
              help="HTML file; the PNGs go to a folder next to it (<name>_files/). Default: "
                   "<store>/reports/<id>.html, never the current folder.")
@click.option("--heatmap", "heatmaps", multiple=True, metavar="x=AXIS,y=AXIS,metric=FIELD",
              help="Sweeps: a heat map of FIELD over two axes (repeatable; axes by path or last part).")
def report_cmd(ident: str, store_dir: str, output: str | None, heatmaps: tuple[str, ...]) -> None:
    """Write an HTML report (figures inline) for a run or a sweep, plus its PNGs.

    IDENT is a run id, a unique prefix of one, 'latest', or a sweep id.
    """
    from perfsdk.experiments.report import ReportError, write_report
    from perfsdk.experiments.sweep import Heatmap
    from perfsdk.store import Store

    if not Path(store_dir).is_dir():
        _usage(f"--store {store_dir}: no such result store")
    store = Store(store_dir)
    ident = resolve_ident(store, ident)
    try:
        maps = [Heatmap.parse(h) for h in heatmaps]
    except ValueError as err:
        _usage(f"--heatmap {err}")
        return
    if output is None:
        output = str(store.root / "reports" / f"{ident}.html")
    try:
        path, pngs = write_report(store, ident, output, heatmaps=maps)
    except ReportError as err:
        _usage(str(err))
        return
    click.echo(f"wrote {path} ({len(pngs)} figures in {Path(path).with_suffix('').name}_files/)")


@hookimpl
def perfsdk_register_commands(cli: Any) -> None:
    cli.add_command(sweep_cmd)
    cli.add_command(compare_cmd)
    cli.add_command(report_cmd)

"""The collector contract end to end: a collector defined here, and the installable package in
plugins/, reach the terminal summary, the HTML report and the leading CSV columns; stored results
come back typed; results of collectors that are not installed are kept and marked; under
torchrun a collector's merge combines the ranks and one without a merge is marked rank-0-only."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import perfsdk
from perfsdk.collector import html_table
from perfsdk.exporters.flatten import RUN_KEY_COLUMNS, key_columns
from perfsdk.store import Store

from launcher import torchrun

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SMALL_RUN = ["--set", "workload.num_prompts=4", "--set", "workload.batching.batch_size=2",
             "--set", "workload.generate.max_new_tokens=3", "--set", "workload.generate.min_new_tokens=3",
             "--set", "workload.warmup_runs=1", "--set", "workload.min_iterations=1",
             "--set", "collectors.energy=false"]


class CallsResult(perfsdk.CollectorResult):
    generate_calls: int
    output_tokens_seen: int


class CallsCollector(perfsdk.Collector):
    """Counts timed generate calls; supplies its own summary rows, report section, key columns."""

    name = "calls"
    title = "Call counter"
    Result = CallsResult
    key_columns = ("generate_calls",)

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.calls = 0
        self.tokens = 0

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        if not step.warmup and step.kind == "generate":
            self.calls += 1
            self.tokens += sum(step.output_tokens or [])

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> CallsResult:
        return CallsResult(generate_calls=self.calls, output_tokens_seen=self.tokens)

    @classmethod
    def summary_rows(cls, result: CallsResult) -> list[tuple[str, str]]:
        return [("timed generate calls", str(result.generate_calls))]

    @classmethod
    def report_section(cls, result: CallsResult, run: Any) -> perfsdk.ReportSection:
        return perfsdk.ReportSection(cls.title, html_table(["timed generate calls", "tokens"],
                                                           [[result.generate_calls, result.output_tokens_seen]]))


class BareResult(perfsdk.CollectorResult):
    widgets: int = 7
    ratio: float = 0.25


class BareCollector(perfsdk.Collector):
    """No presentation at all: the generic rendering shows it."""

    name = "bare"
    Result = BareResult

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> BareResult:
        return BareResult()


class _Plugin:
    @perfsdk.hookimpl
    def perfsdk_register_collectors(self, register: Any) -> None:
        register(CallsCollector)
        register(BareCollector)


PLUGIN = _Plugin()


@pytest.fixture()
def registered() -> Any:
    perfsdk.register_plugin(PLUGIN)
    try:
        yield PLUGIN
    finally:
        perfsdk.unregister_plugin(PLUGIN)


def _dom(page: Path, tmp: Path) -> str:
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",  # type: ignore[list-item]
                          "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _plain(text: str) -> str:
    """Table text with the column rules taken out, so "label | value" reads "label value"."""
    return re.sub(r"[│┃║|]", " ", text)


def test_collector_defined_here_reaches_summary_report_and_csv(registered: Any, perfsdk_cli: Any,
                                                               tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = perfsdk_cli(["run", "--store", str(store), *SMALL_RUN, "--set", "collectors.calls={}",
                     "--set", "collectors.bare={}"])
    assert r.exit_code == 0, r.output
    run = Store(str(store)).list_runs()[-1]
    typed = CallsCollector.result_of(run)
    assert isinstance(typed, CallsResult)
    lat = run.collector_result("latency")
    # 4 prompts in batches of 2, one timed pass: 2 timed calls of 2 x 3 tokens
    assert (typed.generate_calls, typed.output_tokens_seen) == (lat.steps, lat.output_tokens) == (2, 12)
    assert run.collector_meta["calls"].installed and run.collector_meta["calls"].validated
    # terminal summary: the collector's own rows, and the generic rows of the bare one
    out = _plain(r.output)
    assert "Call counter" in out and re.search(r"timed generate calls\s+2\b", out)
    assert re.search(r"widgets\s+7\b", out) and re.search(r"ratio\s+0\.25\b", out)

    # CSV: run-level key columns, then each collector's declared key columns, then the rest
    csv_text = perfsdk_cli(["export", "--format", "csv", "--store", str(store)]).output
    header = next(csv.reader(io.StringIO(csv_text)))
    keys = [c for c in key_columns() if c in header]
    assert header[:len(keys)] == keys
    assert "collectors.calls.generate_calls" in keys and "collectors.bare.widgets" not in keys
    assert keys.index("collectors.calls.generate_calls") > keys.index("collectors.latency.output_tokens_per_s")
    assert [c for c in keys if not c.startswith("collectors.")] == [c for c in RUN_KEY_COLUMNS if c in header]
    row = next(csv.DictReader(io.StringIO(csv_text)))
    assert row["collectors.calls.generate_calls"] == "2" and row["collectors.bare.widgets"] == "7"
    md = perfsdk_cli(["export", "--format", "markdown", "--store", str(store)]).output
    assert "collectors.calls.generate_calls" in md.splitlines()[0]

    # HTML report: the collector's own section and the generic one
    page = tmp_path / "report.html"
    r = perfsdk_cli(["report", run.run_id, "--store", str(store), "-o", str(page)])
    assert r.exit_code == 0, r.output
    html = page.read_text(encoding="utf-8")
    assert "<h2>Call counter</h2>" in html and "<td>2</td><td>12</td>" in html
    assert "<h2>bare</h2>" in html and "<td>widgets</td><td>7</td>" in html
    if CHROMIUM:
        dom = _dom(page, tmp_path)
        assert "<h2>Call counter</h2>" in dom and "<h2>bare</h2>" in dom and "<h2>Latency</h2>" in dom


def test_results_of_collectors_not_installed_are_kept_and_marked(registered: Any, tmp_path: Path) -> None:
    from rich.console import Console

    from perfsdk.summary import print_summary

    with perfsdk.session({"collectors": {"calls": {}, "energy": False, "utilization": False}}, store=tmp_path) as s:
        s.record("x", 1)
    rid = s.run_id
    perfsdk.unregister_plugin(PLUGIN)
    run = Store(str(tmp_path)).get(rid)
    assert run.collectors["calls"] == {"generate_calls": 0, "output_tokens_seen": 0}
    assert run.collector_meta["calls"].installed is False and run.collector_result("calls") is None
    assert run.collector_meta["latency"].installed is True
    con = Console(record=True, width=200)
    print_summary(run, con)
    text = _plain(con.export_text())
    assert "collector not installed here" in text and re.search(r"generate_calls\s+0\b", text)


def test_stored_result_that_no_longer_validates_is_named(registered: Any, tmp_path: Path) -> None:
    import json

    with perfsdk.session({"collectors": {"calls": {}, "energy": False, "utilization": False}}, store=tmp_path) as s:
        pass
    path = tmp_path / "runs" / s.run_id / "result.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["collectors"]["calls"] = {"generate_calls": "many"}
    path.write_text(json.dumps(data), encoding="utf-8")
    run = Store(str(tmp_path)).get(s.run_id)
    meta = run.collector_meta["calls"]
    assert meta.installed is True and meta.validated is False and "generate_calls" in (meta.validation_error or "")
    assert run.collector_result("calls") is None and run.collectors["calls"] == {"generate_calls": "many"}


@pytest.fixture(scope="module")
def pyruntime_path(perfsdk_plugin_installer: Any) -> Path:
    """The plugin package installed into a temporary folder (never into this environment)."""
    return perfsdk_plugin_installer.install(ROOT / "plugins" / "perfsdk-pyruntime")


def _cli(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "perfsdk", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_installed_package_reaches_summary_report_and_csv(pyruntime_path: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = _cli(["run", "--store", str(store), *SMALL_RUN, "--set", "collectors.pyruntime={}"], pyruntime_path, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = _plain(r.stdout)
    assert "Python runtime" in out and re.search(r"GC collections \(gen 0/1/2\)\s+\d+ \(\d+/\d+/\d+\)", out)
    assert re.search(r"threads \(peak\)\s+\d+", out)
    r = _cli(["export", "--format", "csv", "--store", str(store)], pyruntime_path, tmp_path)
    assert r.returncode == 0, r.stderr
    header = next(csv.reader(io.StringIO(r.stdout)))
    i_lat = header.index("collectors.latency.output_tokens_per_s")
    i_pause, i_gcs = header.index("collectors.pyruntime.gc_pause_s"), header.index("collectors.pyruntime.gc_collections")
    # declared key columns: right after the built-ins' key columns, before any other column
    assert i_lat < i_pause < i_gcs and i_gcs < header.index("collectors.pyruntime.threads_peak")
    assert i_gcs < header.index("config.name")
    rid = Store(str(store)).run_ids()[-1]
    page = tmp_path / "r.html"
    r = _cli(["report", rid, "--store", str(store), "-o", str(page)], pyruntime_path, tmp_path)
    assert r.returncode == 0, r.stderr
    html = page.read_text(encoding="utf-8")
    assert "<h2>Python runtime</h2>" in html and "<td>gc_pause_s</td>" in html
    if CHROMIUM:
        assert "<h2>Python runtime</h2>" in _dom(page, tmp_path)


TORCHRUN_SCRIPT = textwrap.dedent('''
    import os, sys
    import torch
    import perfsdk
    from perfsdk.testing import build_tiny_causal_lm

    class CallsResult(perfsdk.CollectorResult):
        generate_calls: int

    class Counting(perfsdk.Collector):
        Result = CallsResult
        def __init__(self, config=None):
            super().__init__(config)
            self.n = 0
        @perfsdk.hookimpl
        def perfsdk_after_generate(self, session, step):
            self.n += 1
        @perfsdk.hookimpl
        def perfsdk_finalize(self, session):
            return CallsResult(generate_calls=self.n)

    class Summed(Counting):
        name = "summed"
        @classmethod
        def merge_ranks(cls, shares):
            return CallsResult(generate_calls=sum(s.result.generate_calls for s in shares))

    class Plain(Counting):
        name = "plain"

    torch.set_num_threads(1)
    model = build_tiny_causal_lm()
    rank = int(os.environ["RANK"])
    cfg = {"collectors": {"energy": False, "utilization": False, "memory": False}}
    with perfsdk.session(cfg, store=sys.argv[1], collectors=[Summed, Plain]) as s:
        s.load(model=model)
        for k in range(2 + rank):  # rank 0: 2 calls, rank 1: 3 calls
            ids = torch.randint(3, 250, (1, 5))
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                       min_new_tokens=2, do_sample=False)
''')


def test_torchrun_merges_through_the_collector_and_marks_the_rest(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT, encoding="utf-8")
    store = tmp_path / "store"
    proc = torchrun([str(script), str(store)], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rid,) = Store(str(store)).run_ids()
    run = Store(str(store)).get(rid)
    assert run.ranks is not None and [r.collectors["summed"]["generate_calls"] for r in run.ranks] == [2, 3]
    # a per-rank counter with a merge sums the ranks
    assert run.collectors["summed"] == {"generate_calls": 5}
    assert run.collector_meta["summed"].scope == "merged" and run.collector_meta["summed"].ranks == 2
    # without a merge: rank 0's value at the top, marked, and every rank's own value kept
    assert run.collectors["plain"] == {"generate_calls": 2}
    assert run.collector_meta["plain"].scope == "rank0-only"
    assert [r.collectors["plain"]["generate_calls"] for r in run.ranks] == [2, 3]
    # the built-in latency collector merges too: 5 requests over both ranks
    assert run.collectors["latency"]["requests"] == 5 and run.collector_meta["latency"].scope == "merged"
    from perfsdk.exporters.flatten import run_row

    row = run_row(run)
    assert row["collector_meta.plain.scope"] == "rank0-only" and "collector_meta.latency.scope" in row

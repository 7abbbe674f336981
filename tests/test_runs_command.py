"""``perfsdk runs`` lists stored runs; ``compare`` and ``report`` take a unique id prefix or
``latest``; damaged runs are named as damaged."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

import perfsdk
from perfsdk.exporters.flatten import run_row
from perfsdk.fmt import fmt_bare
from perfsdk.store import AmbiguousRunId, DamagedRun, RunNotFound, Store
from perfsdk.cli.store import parse_since

IDS = ["20260101T090000-aaaa00000001", "20260101T100000-aaaa00000002", "20260102T080000-bbbb00000003"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, request) -> Path:
    """Three real runs of a tiny model: two named 'base' (tag variant=a / b), one 'fast'."""
    from perfsdk.testing import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("runs-store")
    model = build_tiny_causal_lm()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    for rid, name, variant in zip(IDS, ["base", "base", "fast"], ["a", "b", "a"]):
        cfg = {"name": name, "tags": {"variant": variant}, "collectors": {"energy": False}}
        with perfsdk.session(cfg, store=root, run_id=rid) as s:
            s.load(model=model, tokenizer=None)
            for _ in range(3):
                s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                           min_new_tokens=3)
    return root


def _json(perfsdk_cli, *args: str) -> list[dict]:
    r = perfsdk_cli(["runs", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_json_lists_every_run_with_its_headline_metrics(store, perfsdk_cli):
    rows = _json(perfsdk_cli, "--store", str(store))
    assert [r["run_id"] for r in rows] == IDS  # oldest first
    assert [r["name"] for r in rows] == ["base", "base", "fast"]
    assert [r["validity"] for r in rows] == [Store(store).get(i).validity.verdict for i in IDS]  # type: ignore[union-attr]
    assert {r["status"] for r in rows} == {"ok"}
    assert {r["model"] for r in rows} == {"LlamaForCausalLM"}
    st = Store(store)
    for r in rows:
        run = st.get(r["run_id"])
        assert r["started_at"] == run.started_at.isoformat() and r["tags"] == run.tags
        flat = run_row(run)
        # the metrics are the collectors' key export columns, with the exported values
        assert r["metrics"]["collectors.latency.output_tokens_per_s"] == flat["collectors.latency.output_tokens_per_s"]
        assert r["metrics"]["collectors.latency.ttft_s.p50"] == flat["collectors.latency.ttft_s.p50"]
        assert r["metrics"]["collectors.memory.rss_peak_bytes"] == flat["collectors.memory.rss_peak_bytes"]
        assert all(k.startswith("collectors.") for k in r["metrics"])


def test_filters(store, perfsdk_cli):
    ids = lambda *a: [r["run_id"] for r in _json(perfsdk_cli, "--store", str(store), *a)]  # noqa: E731
    assert ids("--name", "base") == IDS[:2]
    assert ids("--tag", "variant=a") == [IDS[0], IDS[2]]
    assert ids("--name", "base", "--tag", "variant=b") == [IDS[1]]
    assert ids("--status", "failed") == []
    assert ids("--since", "1h") == IDS  # all were started just now
    future = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%d")
    assert ids("--since", future) == []
    r = perfsdk_cli(["runs", "--store", str(store), "--since", "yesterday"])
    assert r.exit_code == 2 and "perfsdk: error: Invalid value for --since" in r.output
    r = perfsdk_cli(["runs", "--store", str(store), "--tag", "variant"])
    assert r.exit_code == 2 and "expected KEY=VALUE" in r.output


def test_parse_since():
    now = datetime(2026, 11, 3, 12, 0, tzinfo=timezone.utc)
    assert parse_since("90m", now) == datetime(2026, 11, 3, 10, 30, tzinfo=timezone.utc)
    assert parse_since("2d", now) == datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
    assert parse_since("1w", now) == datetime(2026, 10, 27, 12, 0, tzinfo=timezone.utc)
    assert parse_since("2026-11-03", now) == datetime(2026, 11, 3, tzinfo=timezone.utc)
    assert parse_since("2026-11-03T10:15+01:00", now) == datetime(2026, 11, 3, 9, 15, tzinfo=timezone.utc)


def test_table_shows_id_name_status_model_start_and_metrics(store, perfsdk_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    r = perfsdk_cli(["runs", "--store", str(store)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].strip() == f"3 run(s) in {store}"
    header = lines[1].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "run", "name", "status", "validity", "model", "started (UTC)", "output tokens/s", "ttft p50 ms",
        "ttft p95 ms"]  # the unit in the header, bare numbers below it
    st = Store(store)
    for rid, line in zip(IDS, lines[2:5]):
        run = st.get(rid)
        flat = run_row(run)
        # the run's own verdict (these short runs are noisy: too few samples for tail percentiles)
        assert run.validity is not None and run.validity.verdict == "noisy"
        assert line.split() == [rid, run.name, "ok", run.validity.verdict, "LlamaForCausalLM",
                                *run.started_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S").split(),
                                fmt_bare(flat["collectors.latency.output_tokens_per_s"]),
                                *(fmt_bare(flat[c], 1e-3) for c in ("collectors.latency.ttft_s.p50",
                                                                    "collectors.latency.ttft_s.p95"))]


def test_chosen_metric_columns(store, perfsdk_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    r = perfsdk_cli(["runs", "--store", str(store), "--name", "fast", "--metric", "latency.steps",
                     "--metric", "batching.batch_size"])
    assert r.exit_code == 0, r.output
    assert [h.strip() for h in r.output.splitlines()[1].split("  ") if h.strip()][-2:] == [
        "steps", "config.workload.batching.batch size"]
    assert r.output.splitlines()[2].split()[-2:] == ["3", "4"]  # three timed steps; the config's batch size
    # a field no run has is an error, not a column of dashes
    r = perfsdk_cli(["runs", "--store", str(store), "--metric", "workload.batch_size"])
    assert r.exit_code == 2 and "unknown metric 'workload.batch_size'" in r.output


def test_resolve_prefix_latest_and_ambiguity(store):
    st = Store(store)
    assert st.resolve_run_id(IDS[1]) == IDS[1]
    assert st.resolve_run_id("20260102") == IDS[2]
    assert st.resolve_run_id("latest") == IDS[2]
    with pytest.raises(AmbiguousRunId) as err:
        st.resolve_run_id("20260101T")
    assert err.value.candidates == IDS[:2]
    assert str(err.value) == f"run id prefix '20260101T' matches 2 runs: {IDS[0]}, {IDS[1]}"
    with pytest.raises(RunNotFound):
        st.resolve_run_id("2027")


def test_compare_takes_prefixes_and_latest(store, perfsdk_cli):
    r = perfsdk_cli(["compare", "20260101T09", "latest", "--store", str(store), "--json", "--bootstrap", "200"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["baseline"] == IDS[0]
    assert {c["candidate"] for c in out["comparisons"]} == {IDS[2]}


def test_ambiguous_prefix_is_a_usage_error_listing_candidates(store, perfsdk_cli):
    r = perfsdk_cli(["compare", "20260101", "latest", "--store", str(store)])
    assert r.exit_code == 2
    assert r.output.strip() == (f"perfsdk: error: run id prefix '20260101' matches 2 runs: {IDS[0]}, {IDS[1]}; "
                                "give more of the id")
    r = perfsdk_cli(["report", "20260101", "--store", str(store), "--output", "unused.html"])
    assert r.exit_code == 2 and "matches 2 runs" in r.output


def test_report_on_latest(store, perfsdk_cli, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.html"
    r = perfsdk_cli(["report", "latest", "--store", str(store), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert f"({IDS[2]})" in out.read_text()


def test_damaged_runs_are_named_damaged(tmp_path, store, perfsdk_cli):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    (copy / "runs" / IDS[1] / "result.json").write_text("{truncated")
    st = Store(copy)
    with pytest.raises(DamagedRun, match=f"run {IDS[1]} is damaged"):
        st.get(IDS[1])
    for args in (["compare", IDS[0], IDS[1]], ["compare", IDS[0], "20260101T10"], ["report", IDS[1]]):
        r = perfsdk_cli([*args, "--store", str(copy)])
        assert r.exit_code == 2, r.output
        assert f"perfsdk: error: run {IDS[1]} is damaged" in r.output and "no run" not in r.output
    rows = _json(perfsdk_cli, "--store", str(copy))
    assert [(r["run_id"], r["status"]) for r in rows] == [(IDS[1], "damaged"), (IDS[0], "ok"), (IDS[2], "ok")]
    assert _json(perfsdk_cli, "--store", str(copy), "--status", "damaged")[0]["run_id"] == IDS[1]
    # after repair the run is moved aside: still named damaged, not unknown
    assert perfsdk_cli(["store", "repair", "--store", str(copy)]).exit_code == 0
    r = perfsdk_cli(["compare", IDS[0], IDS[1], "--store", str(copy)])
    assert r.exit_code == 2 and f"run {IDS[1]} is damaged" in r.output


def test_empty_and_missing_store(perfsdk_cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = perfsdk_cli(["runs", "--store", str(tmp_path / "empty")])
    assert r.exit_code == 0 and r.output.strip() == f"no runs in {tmp_path / 'empty'}"
    r = perfsdk_cli(["runs", "--store", str(tmp_path / "nope")])
    assert r.exit_code == 2 and r.output.strip() == f"perfsdk: error: --store {tmp_path / 'nope'}: no such result store"


def test_export_takes_prefixes_and_latest(store, perfsdk_cli):
    r = perfsdk_cli(["export", "--format", "jsonl", "--store", str(store), "--run", "latest", "--run", "20260101T09"])
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["run_id"] for line in r.output.splitlines()] == [IDS[2], IDS[0]]
    r = perfsdk_cli(["export", "--format", "jsonl", "--store", str(store), "--run", "20260101"])
    assert r.exit_code == 2 and "perfsdk: error: run id prefix '20260101' matches 2 runs" in r.output


def test_units_in_headers_at_80_columns(store, perfsdk_cli, monkeypatch):
    """The table showed ``ttft s.p50`` as a header and ``rss peak bytes`` as ``535801856``."""
    monkeypatch.setenv("COLUMNS", "80")
    r = perfsdk_cli(["runs", "--store", str(store), "--metric", "rss_peak_bytes", "--metric", "ttft_s.p50"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == [IDS[0]])
    header = [line.split() for line in lines[1:first]]  # the metric headers wrap between words
    assert header[-1][0] == "run" and {"status", "validity"} <= set(header[-1])
    assert header[-1][-2:] == ["MiB", "ms"]  # "rss peak MiB", "ttft p50 ms", wrapped between words
    assert {"rss", "peak", "ttft", "p50"} <= {w for h in header for w in h}
    assert "bytes" not in out and "ttft s" not in out
    st = Store(store)
    for rid, line in zip(IDS, lines[first:first + 3]):
        flat = run_row(st.get(rid))
        assert line.split()[0] == rid
        assert line.split()[-2:] == [fmt_bare(flat["collectors.memory.rss_peak_bytes"], 1024**2),
                                     fmt_bare(flat["collectors.latency.ttft_s.p50"], 1e-3)]
        assert str(flat["collectors.memory.rss_peak_bytes"]) not in out
    assert lines[-1].startswith("left out to fit 80 columns: started (UTC)") and "(--wide shows" in lines[-1]
    wide = perfsdk_cli(["runs", "--store", str(store), "--wide", "--metric", "rss_peak_bytes", "--metric", "ttft_s.p50"])
    assert "started (UTC)" in wide.output and "LlamaForCausalLM" in wide.output and "left out" not in wide.output


def test_long_list_shows_the_latest_runs(store, perfsdk_cli, monkeypatch):
    import perfsdk.cli.store as store_cli

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(store_cli, "SUMMARY_RUNS", 2)
    out = perfsdk_cli(["runs", "--store", str(store)]).output
    assert IDS[0] not in out and IDS[1] in out and IDS[2] in out
    assert "the latest 2 of 3 runs; --all lists every one" in out
    out = perfsdk_cli(["runs", "--store", str(store), "--all"]).output
    assert all(rid in out for rid in IDS) and "--all" not in out

"""Metric names resolve against what the runs contain, in compare, runs and sweeps; an unknown or
ambiguous name is an exit-2 error with suggestions, and a gate on a metric it cannot judge fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import perfsdk
from perfsdk.metric_names import MetricNameError, resolve_metric
from perfsdk.store import Store


class GenCountResult(perfsdk.CollectorResult):
    output_tokens: int
    steps: int


class GenCount(perfsdk.Collector):
    """Counts the output tokens of the measured generate steps (a plugin metric without samples)."""

    name = "gencount"
    Result = GenCountResult

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.tokens = 0
        self.steps = 0

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session: Any, step: perfsdk.Step) -> None:
        if not step.warmup and step.kind == "generate":
            self.tokens += sum(step.output_tokens or [])
            self.steps += 1

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> GenCountResult:
        return GenCountResult(output_tokens=self.tokens, steps=self.steps)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real runs of a tiny model with the gencount collector: A makes 3 tokens a step, B 5."""
    from perfsdk.testing import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("names")
    model = build_tiny_causal_lm()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    for rid, n in (("run-a", 3), ("run-b", 5)):
        cfg = {"name": rid, "collectors": {"energy": False, "utilization": False, "gencount": {}}}
        with perfsdk.session(cfg, store=root, run_id=rid, collectors=[GenCount]) as s:
            s.load(model=model, tokenizer=None)
            for _ in range(3):
                s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n)
    return root


def test_collector_names_and_suffixes_resolve(store: Path, perfsdk_cli: Any) -> None:
    st = Store(store)
    assert st.get("run-b").collectors["gencount"]["output_tokens"] == 3 * 2 * 5
    r = perfsdk_cli(["compare", "run-a", "run-b", "--store", str(store), "--json", "--metric", "gencount.output_tokens",
                     "--metric", "ttft_s.p50", "--metric", "collectors.latency.ttft_s"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    by = {c["metric"]: c for c in data["comparisons"]}
    assert list(by) == ["collectors.gencount.output_tokens", "collectors.latency.ttft_s.p50", "ttft_s"]
    gen = by["collectors.gencount.output_tokens"]
    assert (gen["baseline_value"], gen["candidate_value"]) == (18, 30)
    assert gen["change"] == pytest.approx(30 / 18 - 1)


def test_unknown_and_ambiguous_names_are_usage_errors(store: Path, perfsdk_cli: Any) -> None:
    # the typo that used to print verdict n/a and exit 0
    r = perfsdk_cli(["compare", "run-a", "run-b", "--store", str(store), "--metric", "ttft_ss",
                     "--fail-if-slower", "5%"])
    assert r.exit_code == 2
    assert "unknown metric 'ttft_ss' (did you mean 'ttft_s'" in r.output
    # latency and gencount both have output_tokens: the candidates are named
    r = perfsdk_cli(["compare", "run-a", "run-b", "--store", str(store), "--metric", "output_tokens"])
    assert r.exit_code == 2
    assert ("metric 'output_tokens' is ambiguous: it matches collectors.gencount.output_tokens, "
            "collectors.latency.output_tokens; give more of the name") in r.output
    r = perfsdk_cli(["runs", "--store", str(store), "--metric", "gencount.bogus"])
    assert r.exit_code == 2
    assert ("unknown metric 'gencount.bogus' (did you mean 'gencount.steps' or 'gencount.output_tokens'?)"
            in r.output)
    r = perfsdk_cli(["runs", "--store", str(store), "--metric", "gencount.output_tokens", "--json"])
    assert r.exit_code == 0, r.output
    assert [e["metrics"] for e in json.loads(r.output)] == [{"collectors.gencount.output_tokens": 18},
                                                           {"collectors.gencount.output_tokens": 30}]


def test_a_gate_on_a_metric_without_samples_fails_loudly(store: Path, perfsdk_cli: Any) -> None:
    r = perfsdk_cli(["compare", "run-a", "run-b", "--store", str(store), "--metric", "gencount.output_tokens",
                     "--fail-if-slower", "5%"])
    assert r.exit_code == 2
    assert ("--fail-if-slower cannot judge collectors.gencount.output_tokens of run-b against run-a: the field has "
            "no per-step samples") in r.output
    # without a gate the same comparison is shown, with no verdict
    r = perfsdk_cli(["compare", "run-a", "run-b", "--store", str(store), "--metric", "gencount.output_tokens",
                     "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["comparisons"][0]["verdict"] == "no samples"


def test_resolution_rules() -> None:
    cols = ["collectors.latency.ttft_s.p50", "collectors.latency.output_tokens", "records.perplexity",
            "collectors.quality.perplexity"]
    sampled = {"ttft_s": "latency"}
    assert resolve_metric("latency.ttft_s", cols, sampled) == "ttft_s"
    assert resolve_metric("ttft_s.p50", cols, sampled) == "collectors.latency.ttft_s.p50"
    # a collector's own field wins over a user record of the same name
    assert resolve_metric("perplexity", cols, sampled) == "collectors.quality.perplexity"
    assert resolve_metric("records.perplexity", cols, sampled) == "records.perplexity"
    with pytest.raises(MetricNameError, match="did you mean 'latency.output_tokens'"):
        resolve_metric("latency.output_token", cols, sampled)


def test_sweep_objectives_and_constraints_resolve_or_fail(tmp_path: Path, perfsdk_cli: Any) -> None:
    (tmp_path / "bench.py").write_text(
        "def run(session):\n"
        "    knob = float(session.config.tags['knob'])\n"
        "    session.record('accuracy', 1 - abs(knob - 2) / 10)\n")
    base = {"exporters": [], "collectors": {"energy": False, "memory": False, "utilization": False}}
    spec = {"name": "knob", "base": base, "axes": {"tags.knob": [1, 2]}, "workload": "bench.py:run",
            "objectives": [{"maximize": "accuracy"}], "constraints": ["accuracy >= 0.95"]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    r = perfsdk_cli(["sweep", str(tmp_path / "s.yaml"), "--store", str(tmp_path / "st"), "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.output)
    assert m["objectives"] == [{"field": "records.accuracy", "direction": "maximize"}]
    assert m["constraints"] == ["records.accuracy >= 0.95"]
    assert [(p["values"]["tags.knob"], p["feasible"]) for p in m["points"]] == [(1, False), (2, True)]
    spec["constraints"] = ["acuracy >= 0.95"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    r = perfsdk_cli(["sweep", str(tmp_path / "bad.yaml"), "--store", str(tmp_path / "st2"), "--quiet"])
    assert r.exit_code == 2
    assert "constraints[0] (acuracy >= 0.95): unknown metric 'acuracy' (did you mean 'records.accuracy'?)" in r.output

"""compare: the values shown, the change and its interval come from one estimator, and the output
says which (per-request samples, per-step samples, or run totals)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import perfsdk
from perfsdk.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real runs whose steps differ in size (1 and 2 requests, 2 and 6 new tokens), so that
    the mean of per-step rates and the run's tokens over wall time are different figures."""
    from perfsdk.testing import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("est")
    model = build_tiny_causal_lm()
    one, two = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    for rid in ("est-a", "est-b"):
        cfg = {"name": "est", "collectors": {"energy": False, "utilization": False}}
        with perfsdk.session(cfg, store=root, run_id=rid) as s:
            s.load(model=model, tokenizer=None)
            for k in range(4):
                ids, n = (one, 2) if k % 2 else (two, 6)
                s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n)
    return root


def _per_step_rates(run: Any) -> list[float]:
    steps: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in run.read_series("requests"):
        steps[r["step"]].append(r)
    return [sum(r["output_tokens"] for r in rs) / max(r["e2e_s"] for r in rs)
            for rs in steps.values()]


def test_values_change_and_interval_share_one_estimator(store: Path, perfsdk_cli: Any) -> None:
    r = perfsdk_cli(["compare", "est-a", "est-b", "--store", str(store), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    st = Store(store)
    a, b = st.get("est-a"), st.get("est-b")
    for c in data["comparisons"]:
        # the change is the change between the values shown, and lies in its own interval
        assert c["change"] == pytest.approx(c["candidate_value"] / c["baseline_value"] - 1, rel=1e-9)
        assert c["ci_low"] <= c["change"] <= c["ci_high"]
    by = {c["metric"]: c for c in data["comparisons"]}
    tput = by["output_tokens_per_s"]
    assert tput["estimator"] == "per-step samples"
    assert tput["baseline_value"] == pytest.approx(np.mean(_per_step_rates(a)), rel=1e-9)
    assert tput["candidate_value"] == pytest.approx(np.mean(_per_step_rates(b)), rel=1e-9)
    # not the run summary's tokens / wall time, which is another estimator of throughput: the two
    # differ by the run's timing (0.05 % in one run, more in most), so the value shown must sit on
    # the per-step mean, not merely near the summary
    summary = a.collectors["latency"]["output_tokens_per_s"]
    assert abs(tput["baseline_value"] - summary) > abs(tput["baseline_value"] - np.mean(_per_step_rates(a)))
    ttft = by["ttft_s"]
    assert ttft["estimator"] == "per-request samples" and ttft["samples"] == [6, 6]
    assert ttft["baseline_value"] == pytest.approx(np.mean([x["ttft_s"] for x in a.read_series("requests")]))


def test_the_output_names_the_estimator(store: Path, perfsdk_cli: Any) -> None:
    r = perfsdk_cli(["compare", "est-a", "est-b", "--store", str(store), "--metric", "ttft_s", "--metric",
                     "output_tokens_per_s", "--metric", "memory.rss_peak_bytes"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())  # notes wrap at the terminal's width
    assert "per-request samples: ttft_s: mean of the per-request samples, steps resampled whole" in flat
    assert ("per-step samples: output_tokens_per_s: mean of one sample per step (a rate is each step's own, not "
            "the run's total over its wall time)") in flat
    assert ("run totals: collectors.memory.rss_peak_bytes: the figure stored with each run; no samples, no "
            "interval") in flat

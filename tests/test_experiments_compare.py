"""compare: bootstrap over per-request samples flags a real slowdown and not noise."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfsdk.experiments.compare import (CompareError, bootstrap_change, compare, parse_threshold, samples_for,
                                         slower_than)
from perfsdk.schemas import RunResult, Validity
from perfsdk.store import Store


def _requests(seed: int, scale: float, n_steps: int = 50, batch: int = 4) -> list[dict[str, Any]]:
    """Per-request rows whose latencies are lognormal around 20 ms TTFT / 5 ms TPOT, times ``scale``."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(n_steps):
        ttft = float(rng.lognormal(np.log(0.020 * scale), 0.15))
        for i in range(batch):
            tpot = float(rng.lognormal(np.log(0.005 * scale), 0.15))
            rows.append({"step": step, "request": i, "input_tokens": 10, "output_tokens": 16, "ttft_s": ttft,
                         "tpot_s": tpot, "e2e_s": ttft + 15 * tpot})
    return rows


def _save(store: Store, run_id: str, rows: list[dict[str, Any]], tags: dict[str, str] | None = None,
          validity: Validity | None = None) -> None:
    tput = sum(r["output_tokens"] for r in rows) / sum(max(r["e2e_s"] for r in rows if r["step"] == s)
                                                       for s in {r["step"] for r in rows})
    run = RunResult(run_id=run_id, name="cmp", status="ok", started_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    perfsdk_version="0", collectors={"latency": {"output_tokens_per_s": tput,
                                                                 "ttft_s": {"p50": 0.02}},
                                                     "memory": {"rss_peak_bytes": 1000}},
                    tags=tags or {}, validity=validity)
    store.save(run, series={"requests": rows})


def test_bootstrap_flags_ten_percent_slowdown_not_noise() -> None:
    rng = np.random.default_rng(7)
    a = rng.lognormal(np.log(0.02), 0.2, 400)
    slow = rng.lognormal(np.log(0.022), 0.2, 400)   # +10 %
    noise = rng.lognormal(np.log(0.02), 0.2, 400)   # same distribution
    change, lo, hi = bootstrap_change(a, slow, seed=0)
    assert 0.06 < change < 0.14 and lo > 0
    change, lo, hi = bootstrap_change(a, noise, seed=0)
    assert abs(change) < 0.04 and lo < 0 < hi


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0]
    assert bootstrap_change(a, b, seed=3) == bootstrap_change(a, b, seed=3)
    assert bootstrap_change(a, b, stat="p50", seed=3)[0] == pytest.approx(3.5 / 2.5 - 1)


def test_compare_runs_and_cli_exit_status(tmp_path: Path, perfsdk_cli: Any) -> None:
    store = Store(tmp_path / "s")
    _save(store, "base", _requests(1, 1.0))
    _save(store, "slow", _requests(2, 1.10))
    _save(store, "same", _requests(3, 1.0))
    assert len(samples_for(store, store.get("base"), "ttft_s") or []) == 200
    assert len(samples_for(store, store.get("base"), "output_tokens_per_s") or []) == 50

    res = compare(store, ["base", "slow"], seed=0)
    by = {c.metric: c for c in res}
    for m in ("ttft_s", "tpot_s", "e2e_s"):
        assert by[m].significant and by[m].verdict == "slower"
        assert 0.05 < by[m].change < 0.15  # type: ignore[operator]
    assert by["output_tokens_per_s"].verdict == "slower" and by["output_tokens_per_s"].slowdown > 0.05  # type: ignore[operator]
    assert slower_than(res, 0.05)

    noise = compare(store, ["base", "same"], seed=0)
    assert not slower_than(noise, 0.05)
    assert all(c.verdict in ("same (noise)", "faster", "slower") for c in noise)
    assert all(abs(c.change or 0) < 0.05 for c in noise)

    r = perfsdk_cli(["compare", "base", "slow", "--store", str(tmp_path / "s"), "--fail-if-slower", "5%"])
    assert r.exit_code == 1, r.output
    assert "slower" in r.output
    r = perfsdk_cli(["compare", "base", "same", "--store", str(tmp_path / "s"), "--fail-if-slower", "5%"])
    assert r.exit_code == 0, r.output
    # a 10 % slowdown is not beyond a 20 % limit
    r = perfsdk_cli(["compare", "base", "slow", "--store", str(tmp_path / "s"), "--fail-if-slower", "20%"])
    assert r.exit_code == 0
    r = perfsdk_cli(["compare", "base", "slow", "same", "--store", str(tmp_path / "s"), "--json",
                     "--metric", "ttft_s", "--metric", "collectors.memory.rss_peak_bytes"])
    data = json.loads(r.output)
    assert [(c["candidate"], c["metric"]) for c in data["comparisons"]] == [
        ("slow", "ttft_s"), ("slow", "collectors.memory.rss_peak_bytes"),
        ("same", "ttft_s"), ("same", "collectors.memory.rss_peak_bytes")]
    mem = data["comparisons"][1]
    assert mem["change"] == 0.0 and mem["significant"] is None and mem["verdict"] == "no samples"


def test_compare_sweeps_point_by_point(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    for sweep, scale, seed in (("A", 1.0, 1), ("B", 1.2, 2)):
        for bs in ("1", "4"):
            _save(store, f"{sweep}-{bs}", _requests(seed + int(bs), scale),
                  tags={"sweep_id": sweep, "sweep_point": f"p{bs}", "workload.batching.batch_size": bs})
    res = compare(store, ["A", "B"], metrics=["e2e_s"], seed=0)
    assert [(c.point, c.baseline, c.candidate) for c in res] == [
        ("batch_size=1", "A-1", "B-1"), ("batch_size=4", "A-4", "B-4")]
    assert all(c.verdict == "slower" for c in res)


def test_compare_errors(tmp_path: Path, perfsdk_cli: Any) -> None:
    store = Store(tmp_path / "s")
    _save(store, "base", _requests(1, 1.0))
    with pytest.raises(CompareError, match="nope: no run or sweep"):
        compare(store, ["base", "nope"])
    r = perfsdk_cli(["compare", "base", "nope", "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "no run or sweep" in r.output
    assert parse_threshold("5%") == pytest.approx(0.05) and parse_threshold("0.1") == pytest.approx(0.1)
    with pytest.raises(CompareError):
        parse_threshold("fast")


def test_token_times_fallback(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    run = RunResult(run_id="old", name="x", status="ok", started_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    perfsdk_version="0")
    rows = [{"step": s, "position": k, "t_s": 0.1 * (s + 1) + 0.01 * k} for s in range(2) for k in range(3)]
    store.save(run, series={"token_times": rows})
    r = store.get("old")
    assert samples_for(store, r, "ttft_s") == pytest.approx([0.1, 0.2])
    assert samples_for(store, r, "e2e_s") == pytest.approx([0.12, 0.22])
    assert samples_for(store, r, "tpot_s") == pytest.approx([0.01, 0.01])


def test_requests_of_one_batch_are_not_independent() -> None:
    # one step per side: eight identical requests are one sample, not eight
    with pytest.raises(CompareError, match="at least two independent samples"):
        bootstrap_change([[1.0] * 8], [[1.2] * 8])
    # groups are resampled whole: the interval is wider than when pooling as independent
    rng = np.random.default_rng(0)
    ga = [[float(x)] * 4 for x in rng.lognormal(0, 0.3, 20)]
    gb = [[float(x)] * 4 for x in rng.lognormal(0, 0.3, 20)]
    c1, lo1, hi1 = bootstrap_change(ga, gb, seed=0)
    c2, lo2, hi2 = bootstrap_change([v for g in ga for v in g], [v for g in gb for v in g], seed=0)
    assert c1 == pytest.approx(c2)
    assert hi1 - lo1 > 1.5 * (hi2 - lo2)
    # percentiles over pooled groups take the slow path and agree on the point estimate
    c3, lo3, hi3 = bootstrap_change(ga, gb, stat="p50", n_boot=300, seed=0)
    assert lo3 <= c3 <= hi3


def test_single_step_runs_get_no_verdict(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    _save(store, "a", _requests(1, 1.0, n_steps=1, batch=8))
    _save(store, "b", _requests(2, 2.0, n_steps=1, batch=8))
    res = compare(store, ["a", "b"], metrics=["ttft_s"])
    assert res[0].significant is None and res[0].verdict == "too few steps"
    assert res[0].change is not None and res[0].change > 0.5
    assert not slower_than(res, 0.05)


def test_compare_says_when_a_run_is_not_valid_and_does_not_judge_invalid_ones(tmp_path: Path,
                                                                              perfsdk_cli: Any) -> None:
    store = Store(tmp_path / "s")
    valid = Validity(verdict="valid")
    noisy = Validity(verdict="noisy", reasons=["contention: other processes used 48.0% of the CPUs"])
    invalid = Validity(verdict="invalid", reasons=["few-samples: no timed step finished"])
    _save(store, "base", _requests(1, 1.0), validity=valid)
    _save(store, "slow-noisy", _requests(2, 1.10), validity=noisy)
    _save(store, "slow-invalid", _requests(2, 1.10), validity=invalid)
    _save(store, "same", _requests(3, 1.0), validity=valid)
    # a noisy run is judged, and the output says it is noisy and why
    r = perfsdk_cli(["compare", "base", "slow-noisy", "--store", str(tmp_path / "s"), "--fail-if-slower", "5%"])
    assert r.exit_code == 1, r.output
    assert "validity: slow-noisy is noisy: contention: other processes used 48.0% of the CPUs" in " ".join(
        r.output.split())
    # an invalid run is not judged: its own exit status
    r = perfsdk_cli(["compare", "base", "slow-invalid", "--store", str(tmp_path / "s"), "--fail-if-slower", "5%"])
    assert r.exit_code == 3, r.output
    assert "NOT JUDGED: invalid run(s) slow-invalid" in " ".join(r.output.split())
    assert "validity: slow-invalid is invalid: few-samples: no timed step finished" in " ".join(r.output.split())
    res = compare(store, ["base", "slow-invalid"], seed=0)
    assert all(c.candidate_verdict == "invalid" and not c.judged for c in res) and not slower_than(res, 0.05)
    # a judged regression beside an unjudged comparison still fails
    r = perfsdk_cli(["compare", "base", "slow-noisy", "slow-invalid", "--store", str(tmp_path / "s"),
                     "--fail-if-slower", "5%"])
    assert r.exit_code == 1, r.output
    # without --fail-if-slower nothing is judged: exit 0; --json lists the verdicts
    r = perfsdk_cli(["compare", "base", "slow-invalid", "same", "--store", str(tmp_path / "s"), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["not_judged"] == ["slow-invalid"]
    assert data["validity"] == ["slow-invalid is invalid: few-samples: no timed step finished"]
    assert {(c["candidate"], c["candidate_verdict"], c["judged"]) for c in data["comparisons"]} == {
        ("slow-invalid", "invalid", False), ("same", "valid", True)}
    r = perfsdk_cli(["compare", "base", "same", "--store", str(tmp_path / "s"), "--fail-if-slower", "5%"])
    assert r.exit_code == 0 and "validity:" not in r.output

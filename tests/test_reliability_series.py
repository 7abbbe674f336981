"""Bounded time series: capped, evenly spaced, and the cap recorded in the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import perfsdk
from perfsdk.series import META_ARTIFACT, BoundedSeries, add_bounded, downsample, max_rows
from perfsdk.store import Store


def test_downsample_keeps_first_last_and_even_spacing() -> None:
    assert downsample(list(range(10)), 4) == [0, 3, 6, 9]
    assert downsample(list(range(5)), 5) == [0, 1, 2, 3, 4]
    assert downsample(list(range(101)), 11) == list(range(0, 101, 10))
    assert downsample([], 3) == []


def test_bounded_series_never_exceeds_its_cap() -> None:
    b = BoundedSeries(4)
    for i in range(10):
        b.append(i)
        assert len(b) <= 4
    assert b.rows == [0, 4, 8] and b.stride == 4 and b.seen == 10 and b.downsampled
    big = BoundedSeries(1000)
    for i in range(100_000):
        big.append(i)
    assert len(big) <= 1000 and big.stride == 128
    assert big.rows == list(range(0, 100_000, 128))
    assert big.meta() == {"rows_in": 100_000, "rows_kept": 782, "method": "every 128th row", "max_rows": 1000}


def test_max_rows_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_SERIES_MAX_ROWS", "7")
    assert max_rows() == 7
    monkeypatch.setenv("PERFSDK_SERIES_MAX_ROWS", "oops")
    assert max_rows() == 100_000
    monkeypatch.setenv("PERFSDK_SERIES_MAX_ROWS", "1")
    assert max_rows() == 2


class _Fake:
    def __init__(self) -> None:
        self.series: dict[str, Any] = {}
        self.artifacts: dict[str, bytes] = {}


def test_add_bounded_records_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_SERIES_MAX_ROWS", "5")
    s = _Fake()
    add_bounded(s, "small", [{"i": i} for i in range(5)])
    assert len(s.series["small"]) == 5 and META_ARTIFACT not in s.artifacts
    add_bounded(s, "big", [{"i": i} for i in range(9)])
    assert s.series["big"] == [{"i": i} for i in (0, 2, 4, 6, 8)]
    b = BoundedSeries(4)
    for i in range(12):
        b.append({"i": i})
    add_bounded(s, "streamed", b)
    meta = json.loads(s.artifacts[META_ARTIFACT])
    assert meta == {
        "big": {"rows_in": 9, "rows_kept": 5, "method": "evenly spaced, first and last kept", "max_rows": 5},
        "streamed": {"rows_in": 12, "rows_kept": 3, "method": "every 4th row", "max_rows": 4},
    }


def test_session_series_capped_in_the_stored_run(tmp_path: Path, tiny_causal_lm: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_SERIES_MAX_ROWS", "4")
    cfg = {"collectors": {"energy": False, "utilization": False}}
    with perfsdk.session(cfg, store=tmp_path) as s:
        s.load(model=tiny_causal_lm)
        ids = torch.tensor([[5, 6, 7]])
        for _ in range(2):
            s.generate(tiny_causal_lm, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                       min_new_tokens=5, do_sample=False)
        s.add_series("user", [{"k": k} for k in range(10)])
    store = Store(tmp_path)
    run = store.get(s.result.run_id)
    # statistics use every token; only the stored series is capped
    assert run.collectors["latency"]["output_tokens"] == 10 and run.collectors["latency"]["itl_s"]["count"] == 8
    rows = store.read_series(run.run_id, "token_times")
    # built in a BoundedSeries: one row in 4 kept (stride doubled twice), evenly spaced
    assert [(r["step"], r["position"]) for r in rows] == [(0, 0), (0, 4), (1, 3)]
    assert [r["k"] for r in store.read_series(run.run_id, "user")] == [0, 3, 6, 9]
    meta = json.loads((store.run_dir(run.run_id) / run.artifacts[META_ARTIFACT]).read_text())
    assert meta["token_times"]["rows_in"] == 10 and meta["token_times"]["rows_kept"] == 3
    assert meta["token_times"]["method"] == "every 4th row"
    assert meta["user"] == {"rows_in": 10, "rows_kept": 4, "method": "evenly spaced, first and last kept", "max_rows": 4}

"""Utilization collector: samples through the seams, phase tags, statistics, sampler cost."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import perfsdk
from perfsdk.clock import Clock
from perfsdk.collectors.utilization import UtilizationCollector, UtilizationConfig, summarize_rows
from perfsdk.energy.fake import FakeNvmlReader


class _Sampler:
    def __init__(self) -> None:
        self.probes: list[tuple[str, Any, float]] = []
        self.cpu_time_s = 0.25
        self.started_ns = 0
        self.stopped_ns = 5_000_000_000

    def add_probe(self, name: str, fn: Any, interval_s: float) -> None:
        self.probes.append((name, fn, interval_s))


def _fake_session() -> SimpleNamespace:
    return SimpleNamespace(phase="idle", in_warmup=False, clock=Clock(), sampler=_Sampler(), series={},
                           add_series=lambda name, rows: None)


def test_one_probe_phase_tags_gpu_fields_and_stats() -> None:
    reader = FakeNvmlReader(names=["G0", "G1"], power_w=[[100.0, 200.0], [50.0]], utilization_pct=75.0)
    col = UtilizationCollector(UtilizationConfig(interval_s=0.05), nvml_reader=reader)
    s = _fake_session()
    col.perfsdk_session_start(s)
    assert [(n, i) for n, _, i in s.sampler.probes] == [("utilization", 0.05)]  # one probe, no thread
    probe = s.sampler.probes[0][1]
    for phase, warm in [("prefill", False), ("decode", False), ("decode", False), ("prefill", True)]:
        s.phase, s.in_warmup = phase, warm
        probe(0)
    rows = col.rows
    assert [r["phase"] for r in rows] == ["prefill", "decode", "decode", "prefill"]
    assert rows[0]["gpu0_power_w"] == 100.0 and rows[1]["gpu0_power_w"] == 200.0
    assert rows[0]["gpu1_utilization_pct"] == 75.0 and rows[0]["gpu1_memory_used_bytes"] == 1 << 30
    assert all(r["rss_bytes"] > 0 for r in rows)
    res = col.perfsdk_finalize(s)
    assert res.samples == 4 and res.warmup_samples == 1
    assert res.per_phase["prefill"].samples == 1 and res.per_phase["decode"].samples == 2
    g0 = res.gpus[0]
    assert g0.name == "G0" and g0.power_w.count == 4
    assert g0.power_w.mean == pytest.approx((100 + 200 + 200 + 200) / 4)
    assert res.per_phase["decode"].gpus[0].power_w.mean == 200.0
    assert res.gpus[1].temperature_c.mean == 60.0 and res.gpus[1].sm_clock_mhz.max == 1500.0
    assert res.sampler_cpu_time_s == 0.25 and res.sampler_cpu_s_per_s == pytest.approx(0.05)
    assert any("below NVML" in n for n in res.notes)  # 0.05 s < NVML's update period


def test_summarize_rows_exact_statistics() -> None:
    rows = [{"phase": "decode", "warmup": False, "cpu_process_pct": v, "cpu_system_pct": 2 * v,
             "rss_bytes": 1000 * v} for v in (10.0, 20.0, 30.0, 40.0)]
    res = summarize_rows(rows, 0.1, [], "no GPU", SimpleNamespace(cpu_time_s=0.0, started_ns=None, stopped_ns=None))
    assert res.cpu_process_pct.mean == 25.0 and res.cpu_process_pct.p50 == 25.0
    assert res.cpu_system_pct.max == 80.0 and res.rss_bytes.min == 10_000.0
    assert res.gpus == [] and not res.gpu_available and res.gpu_reason == "no GPU"
    assert res.sampler_cpu_s_per_s is None
    assert not any("below NVML" in n for n in res.notes)  # no GPU, nothing to flag


def test_real_session_stores_series_and_primed_cpu() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                         max_position_embeddings=256)).eval()
    ids = torch.randint(3, 250, (1, 6))
    cfg = {"collectors": {"utilization": {"interval_s": 0.01}, "energy": False}}
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=model, tokenizer=None)
        for _ in range(3):
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4)
    u = s.result.collectors["utilization"]
    rows = s.series.get("utilization", [])
    assert u["samples"] == len(rows) and u["samples"] >= 1
    assert u["interval_s"] == 0.01 and u["sampler_cpu_time_s"] >= 0
    assert set(rows[0]) >= {"t_s", "phase", "warmup", "cpu_process_pct", "cpu_system_pct", "rss_bytes"}
    assert sum(p["samples"] for p in u["per_phase"].values()) + u["warmup_samples"] == u["samples"]
    assert u["rss_bytes"]["min"] > 0


def test_rss_includes_child_processes() -> None:
    import subprocess
    import sys

    import psutil

    from perfsdk.collectors.utilization import _TreeRss

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = _TreeRss(psutil.Process())
        total = tree(0)
        assert [c.pid for c in tree.children] == [child.pid]
        child_rss = psutil.Process(child.pid).memory_info().rss
        assert total >= child_rss + psutil.Process().memory_info().rss // 2
        tree(500_000_000)  # within a second: the child list is reused, not rebuilt
        assert [c.pid for c in tree.children] == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert tree(2_000_000_000) > 0  # after a second the list is rebuilt; the dead child is gone
    assert tree.children == []

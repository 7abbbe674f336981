"""The ``torch_profiler`` collector: traces as artifacts, top operators as results."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import perfsdk
from perfsdk.collectors.torch_profiler import TorchProfilerCollector
from perfsdk.plugins import collect_registry, get_plugin_manager

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=256, max_position_embeddings=256)


def tiny_llama(cls: type = LlamaForCausalLM) -> nn.Module:
    torch.manual_seed(0)
    return cls(LlamaConfig(**LLAMA)).eval()


def gen(s: perfsdk.Session, model: nn.Module, batch: int, tokens: int, new: int) -> torch.Tensor:
    torch.manual_seed(1)
    ids = torch.randint(3, 256, (batch, tokens))
    return s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                      min_new_tokens=new, do_sample=False)


def test_generate_trace_and_top_operators() -> None:
    model = tiny_llama()
    cfg = {"collectors": {"torch_profiler": {"top_n": 8}}}
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=model, tokenizer=None)
        with s.warmup():
            gen(s, model, 2, 8, 3)
        gen(s, model, 2, 8, 3)
        gen(s, model, 2, 8, 3)
    assert not torch.autograd._profiler_enabled()
    res = s.result.collectors["torch_profiler"]
    assert res["status"] == "ok"
    # a copy (step 3) of the first measured step (step 1), run after the timed steps
    assert res["steps_profiled"] == 1 and res["step_indices"] == [3] and s.steps[3].replay_of == 1
    assert res["activities"] == ["cpu"] and res["sort_by"] == "self_cpu_time_s"
    assert res["traces"] == ["torch_trace_step3.json"] and list(s.artifacts) == ["torch_trace_step3.json"]
    trace = json.loads(s.artifacts["torch_trace_step3.json"])
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::linear", "aten::mm", "aten::embedding"} <= names
    ops = res["operators"]
    assert 1 <= len(ops) <= 8
    assert all(o["calls"] > 0 and o["self_cpu_time_s"] > 0 for o in ops[:3])
    assert all(o["cpu_time_total_s"] >= o["self_cpu_time_s"] for o in ops)
    assert [o["self_cpu_time_s"] for o in ops] == sorted((o["self_cpu_time_s"] for o in ops), reverse=True)
    assert all(o["self_cuda_time_s"] is None and o["self_cpu_memory_bytes"] is None for o in ops)
    assert sum(o["share_pct"] for o in ops) <= 100.0 + 1e-6
    assert res["operators_total"] >= len(ops)
    assert res["self_cpu_time_total_s"] >= sum(o["self_cpu_time_s"] for o in ops)


def test_linear_calls_counted_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    cfg = {"collectors": {"torch_profiler": {"top_n": 100, "profile_memory": True, "record_shapes": True}}}
    with perfsdk.session(cfg, store=None) as s:
        s.forward(model, torch.randn(5, 16))
    res = s.result.collectors["torch_profiler"]
    by_name = {o["name"]: o for o in res["operators"]}
    assert by_name["aten::linear"]["calls"] == 2
    assert by_name["aten::addmm"]["calls"] == 2
    assert by_name["aten::relu"]["calls"] == 1
    # profile_memory: allocations per operator in bytes (float32 outputs: 5x32 and 5x4)
    assert by_name["aten::addmm"]["self_cpu_memory_bytes"] == (5 * 32 + 5 * 4) * 4
    assert all(isinstance(o["self_cpu_memory_bytes"], int) for o in res["operators"])


def test_every_nth_step() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with perfsdk.session({"collectors": {"torch_profiler": {"steps": {"every": 2}}}}, store=None) as s:
        for _ in range(3):
            s.forward(model, torch.ones(1, 4))
    res = s.result.collectors["torch_profiler"]
    assert res["step_indices"] == [3, 4] and [st.replay_of for st in s.steps[3:]] == [0, 2]
    assert sorted(s.artifacts) == ["torch_trace_step3.json", "torch_trace_step4.json"]
    for data in s.artifacts.values():
        assert "traceEvents" in json.loads(data)


class FailsInTheCopy(LlamaForCausalLM):
    """A 4-token generate is 4 forwards; the 6th (the profiled copy's first decode step) raises."""

    calls = 0

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        if type(self).calls == 6:
            raise RuntimeError("boom in decode")
        return super().forward(*args, **kwargs)


def test_profiler_stopped_when_step_raises() -> None:
    model = tiny_llama(FailsInTheCopy)
    with perfsdk.session({"collectors": {"torch_profiler": {}}}, store=None) as s:
        s.load(model=model, tokenizer=None)
        gen(s, model, 1, 8, 4)
    assert not torch.autograd._profiler_enabled()
    res = s.result.collectors["torch_profiler"]
    assert res["status"] == "unavailable" and res["steps_failed"] == 1
    assert s.artifacts == {}
    assert s.result.status == "partial" and s.result.errors[0].message == "boom in decode"
    # a later profiler can start: nothing was left running
    with perfsdk.session({"collectors": {"torch_profiler": {}}}, store=None) as s2:
        s2.forward(nn.Linear(2, 2), torch.ones(1, 2))
    assert s2.result.collectors["torch_profiler"]["status"] == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cuda_requested_without_cuda() -> None:
    cfg = {"collectors": {"torch_profiler": {"activities": ["cpu", "cuda"], "save_traces": False}}}
    with perfsdk.session(cfg, store=None) as s:
        s.forward(nn.Linear(2, 2), torch.ones(1, 2))
    res = s.result.collectors["torch_profiler"]
    assert res["activities"] == ["cpu"] and res["cuda_reason"] == "CUDA is not available on this machine"
    assert res["self_cuda_time_total_s"] is None and res["traces"] == [] and s.artifacts == {}


def test_registered_opt_in() -> None:
    reg = collect_registry(get_plugin_manager(load_entry_points=False))
    assert reg.collectors["torch_profiler"] is TorchProfilerCollector
    assert reg.origins["collector:layers"] == "perfsdk.collectors.layers.collector"
    assert not TorchProfilerCollector.default_enabled
    with perfsdk.session(None, store=None) as s:
        s.forward(nn.Linear(2, 2), torch.ones(1, 2))
    assert "torch_profiler" not in s.result.collectors and s.artifacts == {}


def test_summary_tables() -> None:
    from rich.console import Console

    from perfsdk.collectors.layers import LayersCollector
    from perfsdk.collectors.torch_profiler import TorchProfilerCollector

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    cfg = {"collectors": {"layers": {"steps": {"every": 2}}, "torch_profiler": {"save_traces": False}}}
    with perfsdk.session(cfg, store=None) as s:
        for _ in range(3):
            s.forward(model, torch.ones(2, 8))
    tables = [*LayersCollector.summary_tables(LayersCollector.result_of(s.result)),
              *TorchProfilerCollector.summary_tables(TorchProfilerCollector.result_of(s.result))]
    assert len(tables) == 3  # forward layers, coverage/overhead, top operators
    console = Console(record=True, width=150)
    for t in tables:
        console.print(t)
    text = console.export_text()
    assert "Layers — forward (2 forwards" in text and "ReLU" in text
    assert "coverage of step time" in text and "Top operators (1 profiled steps" in text
    assert "aten::addmm" in text


def test_stored_trace_and_csv_export(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import csv
    import io

    from perfsdk.exporters.builtin import CsvExporter
    from perfsdk.store import Store

    cfg = {"collectors": {"torch_profiler": {"top_n": 3}, "layers": {"log_events": True}}, "exporters": []}
    with perfsdk.session(cfg, store=str(tmp_path)) as s:
        s.forward(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.ones(2, 4))
    store = Store(str(tmp_path))
    run = store.get(s.result.run_id)
    assert "torch_trace_step1.json" in run.artifacts  # the profiled copy of timed step 0
    stored = tmp_path / "runs" / run.run_id / run.artifacts["torch_trace_step1.json"]
    assert "traceEvents" in json.loads(stored.read_text())
    assert len(store.read_series(run.run_id, "layers_events")) == 3  # root + 2 children
    assert len(run.collectors["torch_profiler"]["operators"]) == 3
    buf = io.StringIO()
    assert CsvExporter().export([run], buf)
    row = next(csv.DictReader(io.StringIO(buf.getvalue())))
    assert row["collectors.torch_profiler.status"] == "ok"
    assert "aten::" in row["collectors.torch_profiler.operators"]
    assert float(row["collectors.layers.coverage_pct"]) > 0

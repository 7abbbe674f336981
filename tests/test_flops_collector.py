"""The flops collector inside a session, and the ``perfsdk flops`` command."""

from __future__ import annotations

import csv
import io
import json
import warnings

import pytest
import torch
from click.testing import CliRunner
from transformers import LlamaConfig, LlamaForCausalLM

import perfsdk
from perfsdk.cli.flops import flops_command
from perfsdk.collectors.flops import FlopsCollector

HID, LAYERS, HEADS, KV, INTER, VOCAB = 64, 2, 4, 2, 128, 256
HD = HID // HEADS


def tiny() -> LlamaForCausalLM:
    cfg = LlamaConfig(hidden_size=HID, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
                      intermediate_size=INTER, vocab_size=VOCAB, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def fwd_macs(b: int, new: int, ctx: int) -> int:
    lin = HID * HEADS * HD * 2 + 2 * HID * KV * HD + 3 * HID * INTER
    return LAYERS * (b * new * lin + 2 * b * HEADS * new * ctx * HD) + b * HID * VOCAB


def run_session(model: torch.nn.Module, settings: dict, steps: int = 3, b: int = 2, t: int = 5, g: int = 4,  # type: ignore[no-untyped-def]
                replay: bool = True):
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (b, t))
    cfg = {"collectors": {"flops": settings}, "instrumentation": {"replay": replay}}
    with perfsdk.session(cfg, store=None) as s:
        s.load(model=model, tokenizer=None)
        for _ in range(steps):
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=g,
                       min_new_tokens=g, do_sample=False, pad_token_id=0)
    return s


def test_collector_counts_prefill_and_decode_exactly() -> None:
    b, t, g = 2, 5, 4
    s = run_session(tiny(), {"peak_tflops": 2.0})
    res = s.result
    assert res is not None and res.status == "ok", res.errors if res else None
    r = res.collectors["flops"]
    prefill = fwd_macs(b, t, t)
    decode = sum(fwd_macs(b, 1, t + k) for k in range(1, g))
    assert r["flops_prefill"] == 2 * prefill and r["flops_decode"] == 2 * decode
    assert r["flops_total"] == 2 * r["macs_total"] == 2 * (prefill + decode)
    assert r["analytic_flops_total"] == r["flops_total"]
    assert r["deviation_pct"] == 0.0 and r["deviation_flagged"] is False
    assert (r["backend"], r["method"]) == ("torch", "capture")
    assert "no causal halving" in r["convention"]
    assert r["steps_counted"] == 1 and r["steps_measured"] == 3  # first step of each shape only
    # counted on an instrumented copy of the first timed step, run after the three timed ones
    assert r["counted_steps"][0]["step"] == 3 and r["counted_steps"][0]["replay_of"] == 0
    assert res.collectors["latency"]["steps"] == 3 and res.collectors["latency"]["instrumented_steps"] == 1
    assert res.validity is not None and res.validity.instrumented.copies == 1
    assert not any(r.startswith("instrumented") for r in res.validity.reasons)
    assert r["output_tokens"] == b * g
    assert r["flops_per_output_token"] == r["flops_total"] / (b * g)
    assert r["achieved_flops_per_s"] > 0
    assert r["mfu_pct"] == pytest.approx(100 * r["achieved_flops_per_s"] / 2e12)
    names = [m["name"] for m in r["top_modules"]]
    assert len(names) == 10 and "lm_head" in names
    assert r["counted_steps"][0]["forwards"] == g
    ctx = [row["context_len"] for row in s.series["flops_forwards"]]
    assert ctx == [t, t + 1, t + 2, t + 3]


def test_on_cuda_the_gpu_profile_gives_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from perfsdk.collectors.flops import FlopsConfig
    from perfsdk.hardware.catalog import profile_for_device

    names = {0: "NVIDIA H200", 1: "NVIDIA H100 PCIe", 2: "Tesla T4"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names[torch.device(d).index or 0])
    assert [profile_for_device(d) for d in ("cuda:0", torch.device("cuda", 1), "cuda:2", "cpu", None)] == \
        ["h200", "h100-pcie", None, None, None]
    col = FlopsCollector(FlopsConfig())
    session = SimpleNamespace(device=torch.device("cuda", 0), model_info=SimpleNamespace(dtype="bfloat16"), pm=None)
    assert col._peak(session) == pytest.approx(989.5)
    assert col._notes == ["MFU against the h200 profile's bfloat16 peak (989.5 TFLOP/s, spec sheet), the profile of "
                          "the GPU this ran on (collectors.flops.hardware or peak_tflops to choose)"]
    # a GPU the catalogue does not know, and the CPU: no peak, no MFU
    assert FlopsCollector(FlopsConfig())._peak(SimpleNamespace(device=torch.device("cuda", 2), model_info=None)) is None
    assert FlopsCollector(FlopsConfig())._peak(SimpleNamespace(device=torch.device("cpu"), model_info=None)) is None


def test_collector_all_steps_and_no_peak() -> None:
    s = run_session(tiny(), {"steps": "all"}, steps=2)
    s_hw = run_session(tiny(), {"hardware": "host-cpu"}, steps=1)
    r_hw = s_hw.result.collectors["flops"]  # type: ignore[union-attr]
    assert r_hw["peak_tflops"] > 0 and r_hw["mfu_pct"] > 0, r_hw["notes"]
    r = s.result.collectors["flops"]  # type: ignore[union-attr]
    assert r["steps_counted"] == 2 and [c["replay_of"] for c in r["counted_steps"]] == [0, 1]
    assert r["flops_total"] == 2 * 2 * sum([fwd_macs(2, 5, 5)] + [fwd_macs(2, 1, 5 + k) for k in range(1, 4)])
    assert r["mfu_pct"] is None and r["peak_tflops"] is None
    # achieved FLOP/s from the timed originals, which the counter never slowed
    assert not any("counter's overhead" in n for n in r["notes"])
    # counting the timed steps themselves leaves none to time: the run says so
    s = run_session(tiny(), {"steps": "all"}, steps=2, replay=False)
    r = s.result.collectors["flops"]  # type: ignore[union-attr]
    assert r["steps_counted"] == 2 and [c["replay_of"] for c in r["counted_steps"]] == [None, None]
    assert any("counter's overhead" in n for n in r["notes"])
    v = s.result.validity  # type: ignore[union-attr]
    assert v.verdict == "invalid" and v.instrumented.in_place == 2
    assert any(x.startswith("instrumented: 2 timed step(s) instrumented in place by flops") for x in v.reasons)
    assert "few-samples: no timed step finished" in v.reasons


def test_collector_quantized_model_labeled() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(tiny(), {torch.nn.Linear}, dtype=torch.qint8)
    s = run_session(q, {}, steps=1)
    r = s.result.collectors["flops"]  # type: ignore[union-attr]
    assert "unquantized architecture" in r["method"] and "dynamic-int8" in r["method"]
    assert r["flops_total"] == 2 * (fwd_macs(2, 5, 5) + sum(fwd_macs(2, 1, 5 + k) for k in range(1, 4)))


def test_collector_analytic_backend_and_opt_in() -> None:
    assert FlopsCollector.default_enabled is False
    s = run_session(tiny(), {"backend": "analytic"}, steps=1)
    r = s.result.collectors["flops"]  # type: ignore[union-attr]
    assert r["backend"] == "analytic" and r["deviation_pct"] == 0.0
    with perfsdk.session(None, store=None) as plain:
        pass
    assert "flops" not in plain.result.collectors  # type: ignore[union-attr]


def test_csv_export_carries_flops_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from perfsdk.exporters.builtin import CsvExporter

    model = tiny()
    ids = torch.randint(1, VOCAB, (1, 4))
    with perfsdk.session({"collectors": {"flops": {}}}, store=str(tmp_path)) as s:
        s.load(model=model, tokenizer=None)
        s.generate(model, input_ids=ids, max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)
    buf = io.StringIO()
    assert CsvExporter().export([s.result], buf)  # type: ignore[list-item]
    row = next(csv.DictReader(io.StringIO(buf.getvalue())))
    assert int(row["collectors.flops.flops_total"]) == 2 * (fwd_macs(1, 4, 4) + fwd_macs(1, 1, 5))
    assert "collectors.flops.flops_prefill" in row and "collectors.flops.deviation_pct" in row


def test_cli_json_and_errors() -> None:
    runner = CliRunner()
    r = runner.invoke(flops_command, ["builtin:tiny-llama", "-b", "2", "-t", "8", "-g", "3", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("flops_total", "flops_prefill", "flops_decode", "macs_total", "flops_per_output_token",
                "analytic_flops_total", "deviation_pct", "backend", "method", "top_modules"):
        assert key in d
    assert d["flops_total"] == d["flops_prefill"] + d["flops_decode"] == 2 * d["macs_total"]
    assert d["deviation_pct"] == 0.0 and d["decode_forwards"] == 2
    assert d["flops_per_output_token"] == d["flops_total"] / 6
    r = runner.invoke(flops_command, ["builtin:tiny-llama", "-t", "8", "-g", "3", "--backend", "fvcore", "--json"])
    assert r.exit_code == 0 and "fvcore" in json.loads(r.output)["method"]
    r = runner.invoke(flops_command, ["no-such-model"])
    assert r.exit_code == 2 and "unknown model" in r.output
    r = runner.invoke(flops_command, ["gpt2", "--backend", "nope"])
    assert r.exit_code == 2 and "unknown backend" in r.output
    r = runner.invoke(flops_command, ["gpt2", "-t", "8", "-g", "2"])
    assert r.exit_code == 0 and "flops_total" in r.output and "lm_head" in r.output


def test_collector_forward_steps_and_fvcore_backend() -> None:
    model = tiny()
    ids = torch.randint(1, VOCAB, (3, 6))
    with perfsdk.session({"collectors": {"flops": {}}}, store=None) as s:
        s.load(model=model, tokenizer=None)
        s.forward(model, input_ids=ids)
    r = s.result.collectors["flops"]  # type: ignore[union-attr]
    full_logits = LAYERS * (3 * 6 * (HID * HEADS * HD * 2 + 2 * HID * KV * HD + 3 * HID * INTER)
                            + 2 * 3 * HEADS * 6 * 6 * HD) + 3 * 6 * HID * VOCAB
    assert r["flops_forward"] == r["flops_total"] == 2 * full_logits
    assert r["flops_prefill"] == 0 and r["deviation_pct"] == 0.0
    s2 = run_session(tiny(), {"backend": "fvcore"}, steps=1)
    r2 = s2.result.collectors["flops"]  # type: ignore[union-attr]
    assert r2["backend"] == "fvcore" and "MACs x 2" in r2["method"]
    assert r2["deviation_pct"] == 0.0 and any("multiply-adds" in n for n in r2["notes"])

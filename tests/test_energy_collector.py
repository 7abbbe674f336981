"""The energy collector in real sessions: fake NVML, fake powercap, and this machine as it is."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import perfsdk
from perfsdk.collectors.energy import EnergyCollector, EnergyConfig
from perfsdk.collectors.utilization import UtilizationCollector
from perfsdk.doctor import nvml_status, rapl_status
from perfsdk.energy.fake import FakeNvmlReader, make_powercap_tree
from perfsdk.sampler import Sampler


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 250, (2, 6))
    return model, ids, torch.ones_like(ids)


def _generate(s: perfsdk.Session, tiny: tuple, n: int = 2, warmup: int = 1) -> None:
    model, ids, mask = tiny
    s.load(model=model, tokenizer=None)
    with s.warmup():
        for _ in range(warmup):
            s.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4)
    for _ in range(n):
        s.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4)


def test_fake_nvml_session_reports_joules_per_token_per_phase(tiny: tuple) -> None:
    # +1 J per read, a counter refreshing every 10 µs: even a fast machine's phases (a tiny model's two
    # steps can take under 10 ms) hold the ten updates their per-token figures need
    reader = FakeNvmlReader(names=["Fake GPU"], energy_mj=[list(range(0, 1_000_000, 1000))], update_period_s=1e-5)
    energy = EnergyCollector(EnergyConfig(codecarbon={"enabled": False}, sources=["nvml"]), nvml_reader=reader)
    util = UtilizationCollector(nvml_reader=reader)
    with perfsdk.session({"collectors": {"utilization": {"interval_s": 0.05}}}, store=None,
                         collectors=[energy, util]) as s:
        _generate(s, tiny)
    res = s.result.collectors["energy"]
    key = "nvml:gpu:0"
    assert res["status"] == "ok"
    assert res["output_tokens"] == 16  # 2 measured steps x 2 requests x 4 tokens
    names = [w["window"] for w in res["windows"]]
    assert names.count("prefill") == 3 and names.count("decode") == 3 and names.count("session") == 1
    assert res["warmup_windows"] == 3
    assert all(w["energy_j"] is not None and w["energy_j"] >= 0 for w in res["windows"])
    assert all(w["method"] == "counter" and w["source"] == "nvml" for w in res["windows"])
    steps_e = res["steps_energy_j"][key]
    assert res["j_per_output_token_by_source"][key] == pytest.approx(steps_e / 16)
    assert res["measured_keys"] == [key]
    assert res["j_per_output_token"] == pytest.approx(steps_e / 16)
    assert res["output_tokens_per_j"] == pytest.approx(16 / steps_e)
    pp = res["per_phase"]
    assert pp["steps"][key]["windows"] == 2
    assert pp["prefill"][key]["energy_j"] + pp["decode"][key]["energy_j"] <= steps_e
    assert steps_e < res["energy_j"][key]  # the session also holds the warm-up step and the gaps
    # every edge read is a whole joule here, so each window is a whole number of joules
    assert all(float(w["energy_j"]).is_integer() for w in res["windows"])
    u = s.result.collectors["utilization"]
    assert u["gpu_available"] and u["gpus"][0]["name"] == "Fake GPU"
    if u["samples"]:
        assert u["gpus"][0]["power_w"]["max"] == 100.0


def test_phases_shorter_than_the_counter_updates_give_no_per_token_figure(tiny: tuple) -> None:
    # NVML's usual 100 ms refresh: a tiny model's prefill windows add up to a few ms; the counter
    # difference stays in per_phase, flagged, but no J per output token is made of it
    reader = FakeNvmlReader(names=["Fake GPU"], energy_mj=[[0]])  # the counter never moves
    energy = EnergyCollector(EnergyConfig(codecarbon={"enabled": False}, sources=["nvml"]), nvml_reader=reader)
    with perfsdk.session({"collectors": {"utilization": False}}, store=None, collectors=[energy]) as s:
        _generate(s, tiny)
    res = s.result.collectors["energy"]
    pre = res["per_phase"]["prefill"]["nvml:gpu:0"]
    assert pre["energy_j"] == 0.0 and pre["windows"] == 2 and pre["low_confidence"] is True
    assert pre["confidence_note"].startswith("2 windows adding up to ")
    assert pre["confidence_note"].endswith("of the counter's 100 ms update periods (fewer than 10); the counter did "
                                           "not advance in them")
    assert res["j_per_output_token_per_phase"]["prefill"] is None
    assert res["j_per_output_token_per_phase"]["decode"] is None
    assert res["j_per_output_token"] is None and res["output_tokens_per_j"] is None
    assert any(n.startswith("prefill J per output token left out: 2 windows adding up to") for n in res["notes"])
    # the session window lasts longer than the 1 s that 10 updates take only if the run did
    sess = res["per_phase"]["session"]["nvml:gpu:0"]
    assert sess["low_confidence"] is (sess["duration_s"] < 1.0)


def test_the_phase_switch_is_read_off_the_generating_thread(tiny: tuple) -> None:
    class Recording(FakeNvmlReader):
        def __init__(self) -> None:
            super().__init__(names=["Fake GPU"], energy_mj=[list(range(0, 10**7, 1000))], update_period_s=0.001)
            self.threads: list[str] = []

        def total_energy_mj(self, index: int) -> int | None:
            self.threads.append(threading.current_thread().name)
            return super().total_energy_mj(index)

    reader = Recording()
    energy = EnergyCollector(EnergyConfig(codecarbon={"enabled": False}, sources=["nvml"]), nvml_reader=reader)
    with perfsdk.session({"collectors": {"utilization": False}}, store=None, collectors=[energy]) as s:
        _generate(s, tiny, n=2, warmup=0)
    me = threading.current_thread().name
    helper = [t for t in reader.threads if t != me]
    # one switch (prefill -> decode) per step, read on the helper thread; every other edge here
    assert len(helper) == 2 and all(t.startswith("perfsdk-energy-edge") for t in helper)
    res = s.result.collectors["energy"]
    key = "nvml:gpu:0"
    rows = {(w["window"], w["step_index"]): w["energy_j"] for w in res["windows"]}
    for step in (0, 1):
        # +1 J a read; edges: step open, prefill open, switch (shared by prefill and decode),
        # decode close, step close: the reading taken on the helper thread serves both windows
        assert (rows[("prefill", step)], rows[("decode", step)], rows[(f"step:{step}", step)]) == (1.0, 1.0, 4.0)
    assert res["per_phase"]["prefill"][key]["windows"] == 2
    assert not s.in_timed_interval and not any(t.is_alive() for t in threading.enumerate()
                                               if t.name.startswith("perfsdk-energy-edge"))


def test_fake_powercap_session_reads_packages_and_dram(tmp_path: Path, tiny: tuple) -> None:
    make_powercap_tree(tmp_path, {
        "intel-rapl:0": ("package-0", 0, 2**32), "intel-rapl:0:0": ("core", 0, 2**32),
        "intel-rapl:0:1": ("dram", 0, 2**32), "intel-rapl:1": ("package-1", 0, 2**32),
    })
    reads: dict[str, int] = {}

    def read_text(p: Path) -> str:  # each counter read advances that zone by 1000 µJ
        if p.name != "energy_uj":
            return p.read_text()
        reads[p.parent.name] = reads.get(p.parent.name, -1) + 1
        return str(reads[p.parent.name] * 1000)

    # at 1 W a 2**32 µJ counter takes 71 minutes to wrap: no sampler poll adds a read to count
    energy = EnergyCollector(EnergyConfig(rapl_root=str(tmp_path), sources=["rapl"], codecarbon={"enabled": False},
                                          rapl_max_power_w=1.0), rapl_read_text=read_text)
    with perfsdk.session({"collectors": {"utilization": False}}, store=None, collectors=[energy]) as s:
        _generate(s, tiny, n=1, warmup=0)
    res = s.result.collectors["energy"]
    assert res["status"] == "ok"
    assert sorted(res["energy_j"]) == ["rapl:dram", "rapl:package"]
    assert "intel-rapl:0:0" not in reads or reads["intel-rapl:0:0"] == 0  # core: never read after open
    edges = res["edge_reads"]
    # both packages advance 1 mJ per edge: the session spans edges-1 steps on each of two sockets
    assert res["energy_j"]["rapl:package"] == pytest.approx(2 * (edges - 1) * 0.001)
    assert res["energy_j"]["rapl:dram"] == pytest.approx((edges - 1) * 0.001)
    assert res["measured_keys"] == ["rapl:dram", "rapl:package"]
    assert res["measured_energy_j"] == pytest.approx(3 * (edges - 1) * 0.001)
    # RAPL refreshes every millisecond: a step under 10 ms is too short for a per-token figure
    if res["per_phase"]["steps"]["rapl:package"]["low_confidence"]:
        assert res["j_per_output_token"] is None
    else:
        assert res["j_per_output_token"] == pytest.approx(res["measured_steps_energy_j"] / 8)
    nv = next(x for x in res["sources"] if x["name"] == "nvml")
    assert nv == {"name": "nvml", "available": False, "reason": "not selected (collectors.energy.sources)"}


def test_this_machine_reports_unavailable_with_reasons(tiny: tuple) -> None:
    if nvml_status()[0] or rapl_status()[0]:
        pytest.skip("this machine has NVML or RAPL")
    with perfsdk.session({"collectors": {"energy": {"codecarbon": {"enabled": False}}}}, store=None) as s:
        _generate(s, tiny, n=1, warmup=0)
    res = s.result.collectors["energy"]
    assert res["status"] == "unavailable"
    srcs = {x["name"]: x for x in res["sources"]}
    assert not srcs["nvml"]["available"] and srcs["nvml"]["reason"]
    assert not srcs["rapl"]["available"] and "powercap" in srcs["rapl"]["reason"]
    assert [r.split(":")[0] for r in res["reasons"]] == ["nvml", "rapl", "codecarbon"]
    assert res["windows"] == [] and res["energy_j"] == {} and res["j_per_output_token_by_source"] == {}  # no zeros
    assert res["j_per_output_token"] is None and res["measured_energy_j"] is None
    assert s.result.status == "ok"


def test_unknown_setting_is_a_config_error() -> None:
    with pytest.raises(perfsdk.ConfigError, match="collectors.energy.bogus"):
        perfsdk.session({"collectors": {"energy": {"bogus": 1}}}, store=None)


def test_sampler_start_stop_idempotent_and_no_thread_left(tiny: tuple) -> None:
    before = set(threading.enumerate())
    calls: list[int] = []
    sp = Sampler()
    sp.start()  # no probe: nothing starts
    assert not sp.running
    sp.add_probe("p", calls.append, 0.01)
    sp.start()
    sp.start()
    assert sp.running and sum(t.name == "perfsdk-sampler" for t in threading.enumerate()) == 1
    sp.stop()
    sp.stop()
    assert not sp.running
    with perfsdk.session({"collectors": {"energy": {"codecarbon": {"enabled": False}}}}, store=None) as s:
        _generate(s, tiny, n=1, warmup=0)
        assert s.sampler.running
    assert not s.sampler.running
    assert set(threading.enumerate()) - before == set()


def test_energy_reads_closest_to_the_work() -> None:
    s = perfsdk.session({}, store=None)
    opens = [i.plugin_name for i in s._hook_impls("perfsdk_window_open")]
    closes = [i.plugin_name for i in s._hook_impls("perfsdk_window_close")]
    assert opens[-1] == "collector:energy" and closes[0] == "collector:energy"

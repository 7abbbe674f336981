"""Instrumented steps: any collector can ask for them, they are copies of timed steps, and no
statistic counts them."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn

import perfsdk
from perfsdk.collectors.energy import EnergyCollector, EnergyConfig
from perfsdk.energy.fake import FakeNvmlReader

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

SLOW_S = 0.2


class Slowdown(perfsdk.Collector):
    """A third-party collector that makes the steps it instruments slow (a sleeping forward hook)."""

    name = "slowdown"
    instruments_steps = True

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.asked: list[int] = []
        self.instrumented: list[int] = []
        self._handle: Any = None

    def wants_to_instrument(self, session: Any, step: Any) -> bool:
        self.asked.append(step.index)
        return step.batch_size == 2  # every timed step of batch 2

    @perfsdk.hookimpl
    def perfsdk_before_generate(self, session: Any, step: Any) -> None:
        if self.name not in step.instrumented_by:
            return
        util = session.collector("utilization")

        def slow(module: Any, args: Any) -> None:
            util.sample(time.perf_counter_ns())  # a utilization sample inside the instrumented step
            time.sleep(SLOW_S)

        self._handle = step.model.register_forward_pre_hook(slow)
        self.instrumented.append(step.index)

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def test_a_third_party_collector_gets_copies_that_no_statistic_counts() -> None:
    model = nn.Linear(4, 4)
    slow = Slowdown()
    energy = EnergyCollector(EnergyConfig(sources=["nvml"], codecarbon={"enabled": False}),
                             nvml_reader=FakeNvmlReader(energy_mj=[list(range(0, 10**7, 1000))]))
    with perfsdk.session({"collectors": {"memory": False}}, store=None, collectors=[slow, energy]) as s:
        with s.warmup():
            s.forward(model, torch.ones(2, 4))  # warm-up: never asked
        for batch in (2, 1, 2, 1):
            s.forward(model, torch.ones(batch, 4))
        assert s.instrumented_steps == []  # copies run after the timed steps
    assert slow.asked == [1, 2, 3, 4]
    assert slow.instrumented == [5, 6]
    assert [(st.index, st.instrumented_by, st.replay_of) for st in s.steps[5:]] == [
        (5, ["slowdown"], 1), (6, ["slowdown"], 3)]
    assert [st.batch_size for st in s.steps[5:]] == [2, 2]  # same inputs as the originals
    assert all(st.duration_s >= SLOW_S for st in s.steps[5:])
    assert [st.index for st in s.measured_steps] == [1, 2, 3, 4]
    r = s.result
    lat = r.collectors["latency"]
    assert lat["steps"] == 4 and lat["warmup_steps"] == 1 and lat["instrumented_steps"] == 2
    assert lat["forward_s"]["count"] == 4 and lat["forward_s"]["max"] < SLOW_S  # never the slowed copies
    assert lat["requests"] == 6
    en = r.collectors["energy"]
    assert en["instrumented_windows"] == 2
    assert en["per_phase"]["steps"]["nvml:gpu:0"]["windows"] == 4
    assert [w["step_index"] for w in en["windows"] if w["instrumented"]] == [5, 6]
    assert "step:5" not in en["per_phase"] and "step:1" in en["per_phase"]
    util = r.collectors["utilization"]
    assert util["instrumented_samples"] >= 2
    v = r.validity
    assert v is not None and v.instrumented.copies == 2 and v.instrumented.in_place == 0
    assert v.instrumented.by_collector == {"slowdown": 2} and v.instrumented.time_s >= 2 * SLOW_S
    assert not any(x.startswith("instrumented") for x in v.reasons)
    # measured-path budget warnings are not raised for instrumented steps
    assert r.environment.extra["hook_time"]["slowdown.perfsdk_before_generate"]["over_budget"] == 0


def test_in_place_and_early_copies() -> None:
    model = nn.Linear(4, 4)
    slow = Slowdown()
    with perfsdk.session({"instrumentation": {"replay": False}}, store=None, collectors=[slow]) as s:
        s.forward(model, torch.ones(2, 4))
        s.forward(model, torch.ones(1, 4))
    assert [(st.index, st.instrumented_by, st.replay_of) for st in s.steps] == [(0, ["slowdown"], None), (1, [], None)]
    assert s.result.collectors["latency"]["steps"] == 1
    v = s.result.validity
    assert v.instrumented.in_place == 1 and v.verdict == "noisy"
    assert "instrumented: 1 timed step(s) instrumented in place by slowdown, left out of the statistics" in v.reasons
    # copies can be run before the session ends (e.g. before the model changes)
    slow = Slowdown()
    with perfsdk.session(None, store=None, collectors=[slow]) as s:
        s.forward(model, torch.ones(2, 4))
        assert s.run_instrumented() == 1 and slow.instrumented == [1]
        s.forward(model, torch.ones(1, 4))
        assert s.run_instrumented() == 0
    assert [st.instrumented_by for st in s.steps] == [[], ["slowdown"], []]


def test_a_sampled_copy_draws_the_same_tokens_and_the_random_state_is_restored() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, vocab_size=128,
                                         max_position_embeddings=64)).eval()
    ids = torch.randint(3, 128, (2, 6))
    with perfsdk.session({"collectors": {"layers": {"steps": {"first": 2}}}}, store=None) as s:
        for _ in range(2):
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                       min_new_tokens=8, do_sample=True, top_k=50)
        state = torch.random.get_rng_state()
    first, second, copy0, copy1 = s.steps
    assert (copy0.replay_of, copy1.replay_of) == (0, 1)
    assert not torch.equal(first.outputs, second.outputs)  # sampling: the timed steps differ
    assert torch.equal(copy0.outputs, first.outputs) and torch.equal(copy1.outputs, second.outputs)
    assert torch.equal(torch.random.get_rng_state(), state)  # as if no copy had run


class Inspecting(nn.Module):
    """Records, at every call, whether anything instruments it: forward hooks on it, a dispatch
    mode (the FLOPs counter) or a running profiler."""

    def __init__(self, session_ref: list[Any]) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.session_ref = session_ref
        self.calls: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hooked = bool(self._forward_hooks or self._forward_pre_hooks or self.lin._forward_hooks)
        dispatch = torch._C._len_torch_dispatch_stack() > 0
        profiled = torch.autograd._profiler_enabled()
        self.calls.append((self.session_ref[0].in_instrumented, hooked or dispatch or profiled))
        return self.lin(x)


def test_timed_steps_run_bare_with_every_instrumenting_collector_on() -> None:
    ref: list[Any] = []
    model = Inspecting(ref)
    cfg = {"collectors": {"flops": {"steps": "all"}, "layers": {"steps": {"every": 1}},
                          "torch_profiler": {"steps": {"every": 1}, "save_traces": False}}}
    s = perfsdk.session(cfg, store=None)
    ref.append(s)
    with s:
        for _ in range(3):
            s.forward(model, torch.ones(2, 8))
    timed = [inst for copy, inst in model.calls if not copy]
    copies = [inst for copy, inst in model.calls if copy]
    assert timed == [False, False, False]  # nothing on the timed steps
    assert copies == [True] * 9  # three collectors x three steps, each copy instrumented
    assert s.result.collectors["latency"]["steps"] == 3 and s.result.collectors["latency"]["instrumented_steps"] == 9

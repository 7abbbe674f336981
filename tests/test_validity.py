"""The validity verdict: figures, reasons, thresholds, seams, and contention from a real process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch import nn

import perfsdk
from perfsdk.config import ConfigError, ValidityConfig
from perfsdk.events import Step
from perfsdk.schemas import ContentionFigures, InstrumentedFigures, SampleFigures, StabilityFigures, ThrottleFigures
from perfsdk.validity import KINDS, CpuClocks, ValidityMonitor, judge, latency_samples, stability, throttle_figures


def _step(index: int, duration_ms: float, batch: int = 2, tokens: int = 8, start_ms: float | None = None) -> Step:
    start = int((index * 100 if start_ms is None else start_ms) * 1e6)
    st = Step(kind="forward", index=index, batch_size=batch, input_tokens=[tokens] * batch)
    st.start_ns, st.end_ns = start, start + int(duration_ms * 1e6)
    return st


def test_stability_groups_by_shape_and_measures_drift() -> None:
    # two shapes, 10 ms and 40 ms: different shapes are not instability
    steps = [_step(i, 10.0 if i % 2 else 40.0, tokens=8 if i % 2 else 64) for i in range(12)]
    st = stability(steps)
    assert st.shapes == 2 and st.steps == 12
    assert st.cv == pytest.approx(0.0) and st.drift_pct == pytest.approx(0.0)
    # one shape slowing down from 10 ms to 12 ms halfway: +20 % between the first and last third
    steps = [_step(i, 10.0 if i < 6 else 12.0) for i in range(12)]
    st = stability(steps)
    assert st.drift_pct == pytest.approx(20.0)
    # median is 11 ms: values 10/11 and 12/11, mean 1.0, sample std sqrt(12/11)/11
    assert st.cv == pytest.approx((12 / 11) ** 0.5 / 11)
    # a shape seen once tells nothing
    assert stability([_step(0, 10.0), _step(1, 20.0, tokens=3)]) == StabilityFigures(steps=0, shapes=0)


def test_stability_finds_a_cold_first_run_per_shape() -> None:
    # two batches alternating, as a runner's passes do: the first run of the long batch took
    # 4x its later runs (the GPU check saw this with cuDNN attention on an H200); the short
    # batch was warmed up and is steady
    steps = [_step(i, (10.0 if i % 2 == 0 else (160.0 if i == 1 else 40.0)), tokens=8 if i % 2 == 0 else 64)
             for i in range(8)]
    st = stability(steps)
    assert (st.shapes, st.cold_shapes, st.cold_ratio) == (2, 1, pytest.approx(4.0))
    v, r = _judge(stab=st)
    assert v == "noisy"
    assert [x.split(":")[0] for x in r] == ["unstable", "cold-start", "drift"]
    assert r[1] == ("cold-start: the first timed step of 1 of 2 step shapes was its slowest, up to 4.0x the "
                     "median of that shape's later steps (a first-run cost the warm-up did not cover: set "
                     "workload.warmup_every_batch: true, or run each shape once in s.warmup())")
    # two runs of a shape, the first 4x the second: the ratio is to the later run (a median of
    # both would say 1.6x)
    pair = [_step(0, 40.0), _step(1, 10.0)]
    assert stability(pair).cold_ratio == pytest.approx(4.0)
    # a slow step later on is noise, not a cold start; the threshold is validity.max_cold_ratio
    late = [_step(i, 10.0 if i != 3 else 40.0) for i in range(6)]
    assert stability(late).cold_shapes == 0
    mild = [_step(i, 14.0 if i == 0 else 10.0) for i in range(6)]
    assert stability(mild).cold_shapes == 0 and stability(mild, cold_ratio=1.3).cold_shapes == 1
    assert stability(mild, cold_ratio=1.3).cold_ratio == pytest.approx(1.4)
    assert "cold-start" in KINDS


def test_latency_samples_counts_requests_and_forward_steps() -> None:
    gen = Step(kind="generate", index=0, batch_size=3, input_tokens=[4, 4, 4], output_tokens=[5, 0, 2])
    assert latency_samples([gen, _step(1, 1.0), _step(2, 1.0)]) == 2 + 2


def _judge(cfg: dict[str, Any] | None = None, **figs: Any) -> tuple[str, list[str]]:
    base: dict[str, Any] = {
        "contention": ContentionFigures(timed_s=10.0, other_cpu_s=0.1, other_cpu_cores=0.01, other_cpu_pct=0.5,
                                        logical_cpus=2),
        "stab": StabilityFigures(steps=40, shapes=8, cv=0.03, drift_pct=1.0),
        "samples": SampleFigures(timed_steps=40, latency_samples=160, min_samples=100, timed_wall_s=10.0,
                                 sampler_interval_s=0.1),
        "instr": InstrumentedFigures(),
        "throttle": ThrottleFigures(),
    }
    base.update(figs)
    return judge(ValidityConfig(**(cfg or {})), **base)


def test_judge_each_kind_and_the_verdict() -> None:
    assert _judge() == ("valid", [])
    v, r = _judge(contention=ContentionFigures(timed_s=10, other_cpu_s=9.6, other_cpu_cores=0.96, other_cpu_pct=48.0,
                                               logical_cpus=2))
    assert v == "noisy" and r == ["contention: other processes used 48.0% of the CPUs (0.96 of 2) while timed steps "
                                  "ran (limit 10%)"]
    v, r = _judge({"invalid_contention_pct": 40}, contention=ContentionFigures(
        timed_s=10, other_cpu_s=9.6, other_cpu_cores=0.96, other_cpu_pct=48.0, logical_cpus=2))
    assert v == "invalid" and r[0].startswith("contention:") and "limit for a valid comparison 40%" in r[0]
    v, r = _judge(contention=ContentionFigures(other_cpu_pct=0.0, gpu_other_pids=[4242, 77]))
    assert v == "noisy" and r == ["contention: other processes on the GPU (pids 4242, 77)"]
    v, r = _judge(stab=StabilityFigures(steps=40, shapes=8, cv=0.3, drift_pct=-12.5))
    assert v == "noisy" and [x.split(":")[0] for x in r] == ["unstable", "drift"]
    assert r[1] == "drift: the last third of timed steps is 12.5% faster than the first (limit 10%)"
    v, r = _judge(samples=SampleFigures(timed_steps=3, latency_samples=12, min_samples=100, timed_wall_s=0.05,
                                        sampler_interval_s=0.1))
    assert v == "noisy" and [x.split(":")[0] for x in r] == ["few-samples", "few-samples"]
    v, r = _judge(samples=SampleFigures(timed_steps=0, min_samples=100),
                  instr=InstrumentedFigures(steps=2, in_place=2, by_collector={"flops": 2}))
    assert v == "invalid" and r == ["few-samples: no timed step finished",
                                    "instrumented: 2 timed step(s) instrumented in place by flops, left out of the "
                                    "statistics"]
    v, r = _judge(instr=InstrumentedFigures(steps=3, copies=3, by_collector={"layers": 3}))
    assert (v, r) == ("valid", [])  # copies never enter the statistics
    v, r = _judge(throttle=ThrottleFigures(samples=9, cpu_freq_first_mhz=3000, cpu_freq_last_mhz=2400,
                                           cpu_freq_change_pct=-20.0, gpu_throttle_reasons=["hw-thermal"]))
    assert v == "noisy" and r == ["throttled: CPU clock fell 20.0% (3000 -> 2400 MHz); GPU slowed down: hw-thermal "
                                  "(clock limit 10%)"]
    # every reason starts with one of the seven kinds
    assert set(KINDS) == {"contention", "unstable", "cold-start", "drift", "few-samples", "instrumented", "throttled"}
    assert all(x.split(":")[0] in KINDS for x in r)


def test_thresholds_are_validated_and_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"validity\.max_cv: Input should be greater than 0"):
        perfsdk.load_config({"validity": {"max_cv": 0}})
    with pytest.raises(ConfigError, match=r"validity\.max_contention_pct"):
        perfsdk.load_config({"validity": {"max_contention_pct": 150}})
    with pytest.raises(ConfigError, match=r"validity\.max_jitter: unknown key"):
        perfsdk.load_config({"validity": {"max_jitter": 1}})
    assert perfsdk.load_config({"validity": {"max_cv": 0.05}}).validity.max_cv == 0.05


def test_throttle_figures_from_synthetic_readings() -> None:
    rows = [{"cpu_mhz": 3000.0, "cpu_throttle": 10, "gpu_mhz": 1800.0, "gpu_reasons": 0}] * 3 + \
           [{"cpu_mhz": 2500.0, "cpu_throttle": 14, "gpu_mhz": 1400.0, "gpu_reasons": 0x40 | 0x1}] * 3
    t = throttle_figures(rows)
    assert (t.samples, t.cpu_freq_first_mhz, t.cpu_freq_last_mhz) == (6, 3000.0, 2500.0)
    assert t.cpu_freq_change_pct == pytest.approx(-100 / 6)
    assert t.cpu_throttle_events == 4
    assert t.gpu_sm_clock_change_pct == pytest.approx(-400 / 18)
    assert t.gpu_throttle_reasons == ["hw-thermal"]  # GPU idle (0x1) is not a slowdown
    assert throttle_figures(rows[:2]).cpu_freq_change_pct is None  # too few samples for thirds


def _fake_cpu_tree(root: Path, khz: int, throttles: int = 0) -> None:
    for cpu in ("cpu0", "cpu1"):
        (root / cpu / "cpufreq").mkdir(parents=True, exist_ok=True)
        (root / cpu / "cpufreq" / "scaling_cur_freq").write_text(f"{khz}\n")
        (root / cpu / "thermal_throttle").mkdir(parents=True, exist_ok=True)
        (root / cpu / "thermal_throttle" / "core_throttle_count").write_text(f"{throttles}\n")
    (root / "cpufreq").mkdir(exist_ok=True)  # not a CPU folder: ignored


def test_cpu_clocks_read_from_sysfs(tmp_path: Path) -> None:
    _fake_cpu_tree(tmp_path, 2_400_000, 3)
    c = CpuClocks(str(tmp_path))
    assert c.readable and c.mean_mhz() == 2400.0 and c.throttle_count() == 6
    assert not CpuClocks(str(tmp_path / "absent")).readable


class FakeGpu:
    """A :class:`perfsdk.validity.GpuProbe` with scripted readings."""

    def __init__(self, pids: list[int], reasons: int = 0, mhz: float = 1500.0) -> None:
        self.pids, self.reasons, self.mhz = pids, reasons, mhz

    def device_count(self) -> int:
        return 1

    def uuid(self, index: int) -> str | None:
        return "GPU-fake"

    def compute_pids(self, index: int) -> list[int] | None:
        return self.pids

    def throttle_reasons(self, index: int) -> int | None:
        return self.reasons

    def sm_clock_mhz(self, index: int) -> float | None:
        return self.mhz

    def close(self) -> None:
        raise AssertionError("an injected probe belongs to the caller")


class Sampled(nn.Module):
    """Takes one validity sample inside every forward (deterministic, instead of the sampler's timing)."""

    def __init__(self, monitor: ValidityMonitor, on_call: Any = None) -> None:
        super().__init__()
        self.monitor, self.on_call, self.calls = monitor, on_call, 0
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.on_call is not None:
            self.on_call(self.calls)
        self.calls += 1
        self.monitor.sample(time.perf_counter_ns())
        return self.lin(x)


def test_gpu_processes_and_cpu_throttling_through_seams(tmp_path: Path) -> None:
    import os

    _fake_cpu_tree(tmp_path, 3_000_000)
    cfg = {"collectors": {"utilization": False, "memory": False, "energy": False},
           "validity": {"min_samples": 1, "max_cv": 100, "max_drift_pct": 1000, "sample_interval_s": 60}}
    s = perfsdk.session(cfg, store=None)
    gpu = FakeGpu(pids=[os.getpid(), 999_999])  # ours, and another process on the GPU
    s.validity_monitor = ValidityMonitor(s.config.validity, cpu_root=str(tmp_path), gpu=gpu)

    def slow_down(call: int) -> None:  # the CPU clock falls from 3.0 to 2.4 GHz halfway
        if call == 6:
            _fake_cpu_tree(tmp_path, 2_400_000, throttles=1)

    model = Sampled(s.validity_monitor, slow_down)
    with s:
        with s.warmup():
            s.forward(model, torch.ones(1, 4))  # warm-up: not sampled
        for _ in range(11):
            s.forward(model, torch.ones(1, 4))
    v = s.result.validity
    assert v is not None and v.verdict == "noisy"
    # one per timed forward; the sampler thread may add one of its own at start (60 s interval)
    assert v.throttling.samples in (11, 12)
    assert (v.throttling.cpu_freq_first_mhz, v.throttling.cpu_freq_last_mhz) == (3000.0, 2400.0)
    assert v.throttling.cpu_throttle_events == 2  # two CPUs, one event each
    assert v.contention.gpu_other_pids == [999_999]
    assert "contention: other processes on the GPU (pids 999999)" in v.reasons
    assert any(r.startswith("throttled: CPU clock fell 20.0% (3000 -> 2400 MHz); 2 CPU thermal throttle events")
               for r in v.reasons)


def test_every_run_has_a_verdict_and_it_is_stored(tmp_path: Path) -> None:
    from perfsdk.store import Store

    with perfsdk.session({"collectors": {"energy": False}}, store=str(tmp_path)) as s:
        s.forward(nn.Linear(2, 2), torch.ones(1, 2))
    run = Store(str(tmp_path)).get(s.result.run_id)
    assert run.validity is not None and run.validity.verdict in ("valid", "noisy")
    # one step: too few samples for tail percentiles
    assert any(r.startswith("few-samples: 1 latency samples") for r in run.validity.reasons)
    assert run.validity.thresholds["max_cv"] == 0.15
    with perfsdk.session(None, store=None) as s:
        pass
    assert s.result.validity.verdict == "invalid"
    assert s.result.validity.reasons == ["few-samples: no timed step finished"]


# -- contention from a real process beside the run -----------------------------------------------

BURN = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"


def _start_burner() -> int:
    """A CPU-burning process that is not ours: started through a parent that exits at once, so it
    is re-parented and not part of this process tree (which counts as the run's own CPU time)."""
    launcher = ("import subprocess, sys\n"
                f"p = subprocess.Popen([sys.executable, '-c', {BURN!r}], start_new_session=True,\n"
                "                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                "print(p.pid)\n")
    out = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, check=True, timeout=30)
    pid = int(out.stdout.strip())
    proc = psutil.Process(pid)
    deadline = time.monotonic() + 10
    while proc.cpu_times().user < 0.2 and time.monotonic() < deadline:  # burning before the run starts
        time.sleep(0.05)
    return pid


def _contention_run(no_sysfs: Path, seconds: float = 2.0) -> Any:
    cpus = psutil.cpu_count() or 1
    # noisy above half of one CPU's worth of others' time: one burner crosses it on any machine,
    # background daemons on a quiet CI machine stay far below. Only contention is judged here.
    cfg = {"collectors": {"utilization": False, "energy": False, "memory": False},
           "validity": {"max_contention_pct": min(10.0, 50.0 / cpus), "max_cv": 100, "max_drift_pct": 1000,
                        "max_cold_ratio": 1000, "min_samples": 1, "max_freq_drop_pct": 100}}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).eval()
    x = torch.randn(64, 256)
    s = perfsdk.session(cfg, store=None)
    # no clocks to read: thermal counters of a CI machine must not decide this test
    s.validity_monitor = ValidityMonitor(s.config.validity, cpu_root=str(no_sysfs))
    with s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.forward(model, x)
    return s.result.validity


def test_a_cpu_burner_beside_the_run_makes_it_noisy_and_the_run_alone_is_valid(tmp_path: Path) -> None:
    # "Alone" means alone on the machine, as in CI: where other people's jobs keep the cores busy,
    # the second run is rightly noisy too.
    pid = _start_burner()
    try:
        v = _contention_run(tmp_path)
    finally:
        burner = psutil.Process(pid)
        burner.kill()
        burner.wait(timeout=10)
    assert v.verdict == "noisy", v
    assert v.contention.status == "ok" and v.contention.timed_s > 1.0
    assert v.contention.other_cpu_cores is not None and v.contention.other_cpu_cores > 0.5, v.contention
    assert any(r.startswith("contention: other processes used") for r in v.reasons)
    alone = _contention_run(tmp_path)
    assert alone.contention.status == "ok"
    assert alone.verdict == "valid", alone
    assert alone.reasons == []

"""Measuring on this machine: short ``generate`` timings of randomly initialised models on a
grid of shapes, plus two micro-kernels, turned into observations and fitted
(:func:`calibrate_here`)."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfsdk.capture.ops import OpRecord
from perfsdk.simulation.calibration.fit import FitResult, Observation, fit
from perfsdk.stats import percentile


@dataclass
class Measurement:
    """TTFT and decode time of repeated ``generate`` calls of one configuration.

    ``decode_steps_s``: the time of each decode step (the gap before generated position 2, 3, …),
    each the best over the repeats; ``decode_s`` is their sum.
    """

    model: str
    batch_size: int
    input_tokens: int
    output_tokens: int
    ttft_s: float
    decode_s: float
    repeats: int
    decode_steps_s: list[float] | None = None

    @property
    def tpot_s(self) -> float | None:
        return self.decode_s / (self.output_tokens - 1) if self.output_tokens > 1 else None

    def merged(self, other: Measurement) -> Measurement:
        """The best of both (another pass over the same configuration): the faster TTFT, and
        each decode step the faster of the two."""
        steps = None
        if self.decode_steps_s is not None and other.decode_steps_s is not None:
            steps = [min(a, b) for a, b in zip(self.decode_steps_s, other.decode_steps_s)]
        return Measurement(model=self.model, batch_size=self.batch_size, input_tokens=self.input_tokens,
                           output_tokens=self.output_tokens, ttft_s=min(self.ttft_s, other.ttft_s),
                           decode_s=sum(steps) if steps is not None else min(self.decode_s, other.decode_s),
                           repeats=self.repeats + other.repeats, decode_steps_s=steps)


class _Stamps:
    """A streamer recording when each generated position is ready (as the session does)."""

    def __init__(self, clock: Any = time.perf_counter_ns) -> None:
        self.times: list[int] = []
        self._prompt = False
        self._clock = clock

    def put(self, value: Any) -> None:
        t = self._clock()
        if self._prompt:
            self.times.append(t)
        self._prompt = True

    def end(self) -> None:
        pass


def measure_generate(model: Any, batch_size: int, input_tokens: int, output_tokens: int, *, repeats: int = 3,
                     warmup: int = 1, label: str = "model", seed: int = 0, estimator: str = "min",
                     clock: str = "wall", min_time_s: float = 0.0, max_repeats: int = 64) -> Measurement:
    """Time ``model.generate`` on random token ids, forcing exactly ``output_tokens`` tokens.

    TTFT = generate start to the first generated position; decode = first to last position
    (one clock: ``time.perf_counter_ns``), over ``repeats`` calls after ``warmup``. The default
    estimator is the minimum: on a shared machine other processes only ever add time, so the
    fastest repeat is the best estimate of the machine's own speed (``estimator="median"``
    for the median). The decode time is taken step by step: each decode step's time is the
    estimator over the repeats of that step (same position, same context length), and the
    decode time their sum, so an interruption in one step of one call does not cost that call
    all its other steps. ``clock="cpu"`` times with this process's CPU time instead of the wall
    clock: with one torch thread it leaves out the time the process waited for a core that other
    processes held, which is what makes timings on a busy shared machine comparable.

    ``min_time_s``: keep repeating (up to ``max_repeats``) until the timed calls add up to at
    least this long, so that a cheap configuration gets as many chances at a quiet moment as an
    expensive one (its fixed costs are what the per-call overheads are fitted from). The garbage
    collector is paused while timing, as ``timeit`` does.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(4, vocab, (batch_size, input_tokens), generator=g)
    mask = torch.ones_like(ids)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=output_tokens, min_new_tokens=output_tokens,
              do_sample=False, pad_token_id=0)
    ttft: list[float] = []
    steps: list[list[float]] = []
    clk = time.process_time_ns if clock == "cpu" else time.perf_counter_ns
    spent = 0.0
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.inference_mode():
            i = 0
            while i < warmup + repeats or (spent < min_time_s and len(ttft) < max_repeats):
                st = _Stamps(clk)
                t0 = clk()
                model.generate(**kw, streamer=st)
                t1 = clk()
                i += 1
                if i <= warmup:
                    continue
                spent += (t1 - t0) / 1e9
                ttft.append((st.times[0] - t0) / 1e9)
                steps.append([(b - a) / 1e9 for a, b in zip(st.times, st.times[1:])])
    finally:
        if was_enabled:
            gc.enable()
    pick = min if estimator == "min" else statistics.median
    per_step = [pick(col) for col in zip(*steps)]
    return Measurement(model=label, batch_size=batch_size, input_tokens=input_tokens, output_tokens=output_tokens,
                       ttft_s=pick(ttft), decode_s=sum(per_step), repeats=len(ttft), decode_steps_s=per_step)


def build_random_model(spec: str) -> Any:
    """A randomly initialised causal LM of ``spec``'s architecture (nothing read or downloaded).

    ``spec@layers=N`` overrides the number of layers (same widths, different depth);
    ``spec@hidden=N`` the width (the MLP scaled in proportion, the same number of heads);
    ``spec@vocab=N`` the vocabulary (the embedding and the output projection); any of them can be
    combined, ``spec@hidden=64@layers=2``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec, *suffixes = spec.split("@")
    if spec.startswith("builtin:"):
        from perfsdk.models.tiny import tiny_llama_config

        cfg = tiny_llama_config(spec.removeprefix("builtin:"))
    else:
        cfg = AutoConfig.from_pretrained(spec, local_files_only=True)
    for suffix in suffixes:
        key, _, value = suffix.partition("=")
        if key not in ("layers", "hidden", "vocab") or not value.isdigit() or int(value) < 1:
            raise ValueError(f"{spec}@{suffix}: only @layers=N, @hidden=N and @vocab=N are understood")
        if key == "layers":
            cfg.num_hidden_layers = int(value)
            continue
        if key == "vocab":
            cfg.vocab_size = int(value)
            continue
        hidden, heads = int(value), int(cfg.num_attention_heads)
        if hidden % heads:
            raise ValueError(f"{spec}@{suffix}: the width must be a multiple of the {heads} heads")
        cfg.intermediate_size = max(1, round(cfg.intermediate_size * hidden / cfg.hidden_size))
        cfg.hidden_size = hidden
        if getattr(cfg, "head_dim", None):
            cfg.head_dim = hidden // heads
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
    return model


def observations_for(shape: Any, m: Measurement, dtype: str = "float32") -> list[Observation]:
    """Prefill and decode observations of one measurement, ops from the analytic generator."""
    from perfsdk.simulation.analytic import forward_ops, sampled_decode_steps

    label = f"{m.model} b{m.batch_size} in{m.input_tokens} out{m.output_tokens}"
    pre = forward_ops(shape, m.batch_size, m.input_tokens, 0, dtype, "prefill", 0)
    obs = [Observation.from_ops(label + " prefill", "prefill", m.ttft_s, pre)]
    if m.output_tokens > 1:
        steps, weights = sampled_decode_steps(m.output_tokens, 8)
        ops: list[OpRecord] = []
        for k in steps:
            ops.extend(forward_ops(shape, m.batch_size, 1, m.input_tokens + k - 1, dtype, "decode", k))
        obs.append(Observation.from_ops(label + " decode", "decode", m.decode_s, ops, weights))
    return obs


def micro_observations(repeats: int = 7, clock: str = "wall") -> list[Observation]:
    """Three micro-kernels that anchor the rates: a large fp32 matmul (compute), a large
    elementwise add (memory) and a chain of kernels on tiny tensors (the cost of one kernel
    call), timed with torch on the current thread setting."""
    import torch

    clk = time.process_time_ns if clock == "cpu" else time.perf_counter_ns

    def best(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            t0 = clk()
            fn()
            ts.append((clk() - t0) / 1e9)
        return min(ts)

    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    t_mm = best(lambda: torch.mm(a, b))
    m = 16 * 1024 * 1024  # 64 MiB per fp32 operand: far beyond any cache
    x, y, z = torch.randn(m), torch.randn(m), torch.empty(m)
    t_add = best(lambda: torch.add(x, y, out=z))
    # the fixed cost of one kernel call: a chain of elementwise kernels on 16-element tensors
    calls = 400
    u, v = torch.randn(16), torch.randn(16)

    def chain() -> None:
        w = u
        for _ in range(calls):
            w = torch.add(w, v)

    t_calls = best(chain)
    one = np.ones(1)
    return [
        Observation("micro matmul 1024^3 fp32", "micro", t_mm, np.array([2.0 * n**3]), np.array([3.0 * n * n * 4]),
                    one, 0.0, np.array([float(n)])),
        Observation("micro add 3x64MiB fp32", "micro", t_add, np.array([0.0]), np.array([3.0 * m * 4]), one, 0.0,
                    np.array([np.inf])),
        Observation(f"micro {calls} kernel calls", "micro", t_calls, np.zeros(1), np.zeros(1), np.zeros(1), 0.0,
                    np.array([np.inf]), ops=0.0, extra_launches=float(calls)),
    ]


DEFAULT_CALIBRATION_GRID = [(1, 16, 16), (1, 128, 16), (4, 32, 16), (8, 128, 8), (2, 256, 8)]
# one configuration at four depths (per-layer vs per-pass costs, 20 to 100 MB of weights per pass:
# the cache term) and, narrowed to width 64, at two depths: there the framework's fixed costs
# dominate, which pins the per-operation overhead apart from the bytes
DEFAULT_CALIBRATION_MODELS = ["builtin:tiny-llama-medium", "builtin:tiny-llama-medium@layers=4",
                              "builtin:tiny-llama-medium@layers=2", "builtin:tiny-llama-medium@layers=1",
                              "builtin:tiny-llama-medium@hidden=64@layers=8",
                              "builtin:tiny-llama-medium@hidden=64@layers=2"]


def calibrate_here(models: list[str], grid: list[tuple[int, int, int]] | None = None, *, repeats: int = 3,
                   threads: int | None = None, fit_step_overhead: bool = True, micro: bool = True,
                   progress: Any = None, clock: str = "wall", passes: int = 3,
                   min_time_s: float = 0.2) -> tuple[FitResult, list[Measurement]]:
    """Measure ``models`` (random weights) on a grid of (batch, input tokens, output tokens),
    plus the micro-kernels (``micro``), and fit.

    Every configuration is measured ``repeats`` times (after a warm-up call) in each of
    ``passes`` round-robin passes over all of them, and the fastest TTFT and decode steps are
    kept (:meth:`Measurement.merged`); a configuration faster than ``min_time_s`` over its
    repeats is repeated until it has taken that long (:func:`measure_generate`): spreading the repeats over time lets each configuration meet a quiet moment, which is
    what makes two calibrations of the same machine agree. The micro-kernels are timed at the
    start and at the end, and the faster of the two kept.
    """
    import torch

    from perfsdk.models.arch import architecture_from_config

    if threads:
        torch.set_num_threads(threads)
    built = {spec: build_random_model(spec) for spec in models}
    shapes = {spec: architecture_from_config(model.config) for spec, model in built.items()}
    configs = [(spec, b, i, o) for spec in models for b, i, o in (grid or DEFAULT_CALIBRATION_GRID)]
    best: dict[tuple[str, int, int, int], Measurement] = {}
    by_pass: dict[tuple[str, int, int, int], list[Measurement]] = {}
    micro_runs = [micro_observations(clock=clock)] if micro else []
    for p in range(max(1, passes)):
        for key in configs:
            spec, b, i, o = key
            m = measure_generate(built[spec], b, i, o, repeats=repeats, label=spec, clock=clock, seed=p,
                                 min_time_s=min_time_s)
            by_pass.setdefault(key, []).append(m)
            prev = best.get(key)
            best[key] = m if prev is None else prev.merged(m)
            if progress is not None and p == max(1, passes) - 1:
                progress(m)
    if micro:
        micro_runs.append(micro_observations(clock=clock))
    obs: list[Observation] = [min(pair, key=lambda ob: ob.measured_s) for pair in zip(*micro_runs)]
    meas = [best[key] for key in configs]
    for key, m in zip(configs, meas):
        obs.extend(observations_for(shapes[key[0]], m))
    result = fit(obs, fit_step_overhead=fit_step_overhead)
    result.drift_pct = pass_drift_pct(list(by_pass.values()))
    return result, meas


def pass_drift_pct(runs: list[list[Measurement]]) -> float | None:
    """How far the machine's speed moved between round-robin passes, in percent.

    ``runs``: for each configuration, its measurement in each pass (in pass order). Each pass's
    level is the median, over configurations, of its time (TTFT + decode) relative to the same
    configuration's fastest pass; the result is the slowest pass level over the fastest, minus 1.
    A pass that met a busy moment for one configuration barely moves a median; a machine that ran
    slower for a whole pass does. None with fewer than two passes.
    """
    passes = min((len(r) for r in runs), default=0)
    if passes < 2:
        return None
    totals = [[m.ttft_s + m.decode_s for m in r[:passes]] for r in runs]
    levels = [percentile(sorted(t[p] / min(t) for t in totals), 50) for p in range(passes)]
    return 100.0 * (max(levels) / min(levels) - 1.0)


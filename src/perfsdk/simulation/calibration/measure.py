"""Measuring on this machine: short ``generate`` timings of randomly initialised models on a
grid of shapes, plus two micro-kernels, turned into observations and fitted
(:func:`calibrate_here`)."""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfsdk.capture.ops import OpRecord
from perfsdk.hardware.profile import CacheShares, FewRowRatios, HardwareProfile, SmallMGaps, WeightRowCosts
from perfsdk.simulation.calibration.fit import CACHE_GRID, FitResult, Observation, cached_fraction, fit
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
    #: the time a decode step spends outside the model's forward (the generate loop's own work
    #: and the session's), per step, the median over the calls; None where it was not timed
    outside_step_s: float | None = None

    @property
    def tpot_s(self) -> float | None:
        return self.decode_s / (self.output_tokens - 1) if self.output_tokens > 1 else None

    def merged(self, other: Measurement) -> Measurement:
        """The best of both (another pass over the same configuration): the faster TTFT, and
        each decode step the faster of the two."""
        steps = None
        if self.decode_steps_s is not None and other.decode_steps_s is not None:
            steps = [min(a, b) for a, b in zip(self.decode_steps_s, other.decode_steps_s)]
        outside = [x for x in (self.outside_step_s, other.outside_step_s) if x is not None]
        return Measurement(model=self.model, batch_size=self.batch_size, input_tokens=self.input_tokens,
                           output_tokens=self.output_tokens, ttft_s=min(self.ttft_s, other.ttft_s),
                           decode_s=sum(steps) if steps is not None else min(self.decode_s, other.decode_s),
                           repeats=self.repeats + other.repeats, decode_steps_s=steps,
                           outside_step_s=min(outside) if outside else None)


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
                     clock: str = "wall", min_time_s: float = 0.0, max_repeats: int = 64,
                     pause_gc: bool = True) -> Measurement:
    """Time ``model.generate`` on random token ids, forcing exactly ``output_tokens`` tokens.

    TTFT = generate start to the first generated position; decode = first to last position
    (one clock: ``time.perf_counter_ns``), over ``repeats`` calls after ``warmup``. The default
    estimator is the minimum: on a shared machine other processes only ever add time, so the
    fastest repeat is the best estimate of the machine's own speed. The decode time is then taken
    step by step: each decode step's fastest time over the repeats (same position, same context
    length), summed, so an interruption in one step of one call does not cost that call all its
    other steps. ``estimator="median"`` takes the median call instead (the TTFT and the decode
    time of whole calls, as a session's p50 reads them): what a run typically sees, not its best. ``clock="cpu"`` times with this process's CPU time instead of the wall
    clock: with one torch thread it leaves out the time the process waited for a core that other
    processes held, which is what makes timings on a busy shared machine comparable.

    ``min_time_s``: keep repeating (up to ``max_repeats``) until the timed calls add up to at
    least this long, so that a cheap configuration gets as many chances at a quiet moment as an
    expensive one (its fixed costs are what the per-call overheads are fitted from). The garbage
    collector is paused while timing (``pause_gc``), as ``timeit`` does.
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
    if pause_gc:
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
    if estimator == "median":
        return Measurement(model=label, batch_size=batch_size, input_tokens=input_tokens,
                           output_tokens=output_tokens, ttft_s=statistics.median(ttft),
                           decode_s=statistics.median(sum(row) for row in steps), repeats=len(ttft))
    per_step = [min(col) for col in zip(*steps)]
    return Measurement(model=label, batch_size=batch_size, input_tokens=input_tokens, output_tokens=output_tokens,
                       ttft_s=min(ttft), decode_s=sum(per_step), repeats=len(ttft), decode_steps_s=per_step)


def measure_in_session(model: Any, batch_size: int, input_tokens: int, output_tokens: int, *, calls: int = 3,
                       label: str = "model", seed: int = 0, min_time_s: float = 0.0,
                       max_calls: int = 64) -> Measurement:
    """TTFT and decode time of ``model.generate`` as a perfsdk session measures them: inside a
    session with the default collectors (no store), on the session clock, after one warm-up call;
    the median over ``calls`` calls (more while they add up to less than ``min_time_s``, up to
    ``max_calls``). What a user's run reads as its p50, so a profile fitted to these predicts it.

    The model's forward is timed too (a hook before and after it), so that the measurement also
    says how long each decode step spends outside it (``outside_step_s``): the generate loop's
    own work between two forwards and the session's, what the cost model's fixed cost per step
    stands for."""
    import torch

    import perfsdk

    g = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(4, vocab, (batch_size, input_tokens), generator=g)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_tokens,
              min_new_tokens=output_tokens, do_sample=False, pad_token_id=0)
    cfg = perfsdk.Config.model_validate({"name": "perfsdk-calibrate", "model": {"id": label}, "store": None,
                                         "workload": {"threads": torch.get_num_threads()}})
    ttft: list[float] = []
    decode: list[float] = []
    steps: list[list[float]] = []
    outside: list[float] = []
    spans: list[list[int]] = []  # [start, end] of each forward of the current call, on the session clock
    hooks = [model.register_forward_pre_hook(lambda *_: spans.append([time.perf_counter_ns()])),
             model.register_forward_hook(lambda *_: spans[-1].append(time.perf_counter_ns()))]
    try:
        with perfsdk.session(cfg) as s:
            s.load(model=model)
            with s.warmup():
                s.generate(model, **kw)
            spent = 0.0
            while len(ttft) < calls or (spent < min_time_s and len(ttft) < max_calls):
                spans.clear()
                s.generate(model, **kw)
                step = s.steps[-1]
                t = step.token_times_ns
                ttft.append((t[0] - step.start_ns) / 1e9)
                decode.append((t[-1] - t[0]) / 1e9)
                steps.append([(b - a) / 1e9 for a, b in zip(t, t[1:])])
                spent += ((step.end_ns or t[-1]) - step.start_ns) / 1e9
                if len(t) > 1:
                    # the decode's forwards lie between the first and the last position's stamps
                    inside = sum(sp[1] - sp[0] for sp in spans if len(sp) == 2 and sp[0] >= t[0] and sp[1] <= t[-1])
                    outside.append((t[-1] - t[0] - inside) / 1e9 / (len(t) - 1))
    finally:
        for h in hooks:
            h.remove()
    # each decode step's median over the calls (what :func:`decode_warmup_steps` reads)
    per_step = [float(statistics.median(x)) for x in zip(*steps)] if steps and steps[0] else None
    return Measurement(model=label, batch_size=batch_size, input_tokens=input_tokens, output_tokens=output_tokens,
                       ttft_s=float(statistics.median(ttft)), decode_s=float(statistics.median(decode)),
                       repeats=len(ttft), decode_steps_s=per_step,
                       outside_step_s=float(statistics.median(outside)) if outside else None)


#: decode steps a measurement needs for :func:`decode_warmup_steps` (the later half is its steady step)
WARMUP_MIN_STEPS = 8


def decode_warmup_steps(m: Measurement) -> float | None:
    """How many steady decode steps the first steps of ``m``'s decode take beyond their own count:
    ``sum(t_i / steady - 1)`` over its steps, ``steady`` the median of the later half (None with
    fewer than :data:`WARMUP_MIN_STEPS` steps or none recorded). In a perfsdk session on a 2-core
    x86 host the first decode steps after the prefill ran slower and settled over about six steps
    (a model of 21 MB of weights, batch 1: 2.21, 2.08, 2.01, 1.94 ms, then 1.85-1.99 ms): a TPOT
    over 8 new tokens read several percent above one over 32."""
    t = m.decode_steps_s
    if not t or len(t) < WARMUP_MIN_STEPS:
        return None
    steady = float(statistics.median(t[len(t) // 2:]))
    if not steady > 0:
        return None
    return float(sum(x / steady - 1.0 for x in t))


def steady_decode(m: Measurement, warmup_steps: float) -> Measurement:
    """``m`` with its decode time at the steady step: divided by ``1 + warmup_steps / steps``
    (what the cost model prices; the prediction multiplies it back, :func:`warmup_factor`)."""
    from dataclasses import replace

    from perfsdk.simulation.costmodel import warmup_factor

    f = warmup_factor(warmup_steps, m.output_tokens - 1)
    return replace(m, decode_s=m.decode_s / f,
                   decode_steps_s=[x / f for x in m.decode_steps_s] if m.decode_steps_s is not None else None)


def measured_warmup(runs: list[Measurement]) -> float:
    """The decode warm-up of a calibration, in steady steps: the median of
    :func:`decode_warmup_steps` over every measured pass of every configuration long enough to
    show it (0 where none is)."""
    ks = [k for k in (decode_warmup_steps(m) for m in runs) if k is not None]
    return max(0.0, float(statistics.median(ks))) if ks else 0.0


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
    elif spec.startswith("type:"):
        model_type = spec.removeprefix("type:")
        if model_type not in SMALL_FAMILY_CONFIGS:
            raise ValueError(f"{spec}: no small configuration of model type {model_type!r} here "
                             f"(known: {', '.join('type:' + k for k in SMALL_FAMILY_CONFIGS)}); "
                             "give a local folder with a config.json instead")
        cfg = AutoConfig.for_model(model_type, **SMALL_FAMILY_CONFIGS[model_type])
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


#: Small configurations of other families that ``type:MODEL_TYPE`` builds (random weights): what
#: the default calibration measures besides its Llama, so that it can say how far it misses a
#: family it was not fitted on. GPT-BigCode: multi-query attention, fused QKV, LayerNorm, GELU,
#: biases, learned positions; CodeGen: fused QKV split by hand, partial rotary, parallel residual.
SMALL_FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt_bigcode": dict(n_embd=256, n_layer=4, n_head=4, n_inner=1024, vocab_size=4096, n_positions=512,
                        multi_query=True, bos_token_id=0, eos_token_id=0),
    "codegen": dict(n_embd=256, n_layer=4, n_head=4, rotary_dim=32, vocab_size=4096, n_positions=512,
                    bos_token_id=0, eos_token_id=0),
}


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


def captured_observations_for(config: Any, m: Measurement) -> list[Observation]:
    """Prefill and decode observations of one measurement, ops captured from the model's own code
    on the meta device (every ATen call: the fixed cost is fitted per kernel call)."""
    from perfsdk.flops.meta import capture_generation_ops
    from perfsdk.simulation.analytic import sampled_decode_steps

    label = f"{m.model} b{m.batch_size} in{m.input_tokens} out{m.output_tokens}"
    steps, weights = sampled_decode_steps(m.output_tokens, 8) if m.output_tokens > 1 else ([], {})
    cap = capture_generation_ops(config, m.batch_size, m.input_tokens, m.output_tokens, steps)
    pre = [o for o in cap.ops if o.phase != "decode"]
    obs = [Observation.from_ops(label + " prefill", "prefill", m.ttft_s, pre, captured=True)]
    if m.output_tokens > 1:
        dec = [o for o in cap.ops if o.phase == "decode"]
        obs.append(Observation.from_ops(label + " decode", "decode", m.decode_s, dec, weights, captured=True))
    return obs


def micro_observations(repeats: int = 7, clock: str = "wall", estimator: str = "min") -> list[Observation]:
    """Micro-kernels that anchor the rates: a large fp32 matmul (compute), a large elementwise
    add (memory), a chain of kernels on tiny tensors (the cost of one kernel call), a pair of
    streamed one-row products that differ only in their weights' rows (the cost per stored row:
    :func:`weight_row_cost`; over weights of six row lengths, that cost by the row's length:
    :func:`weight_row_costs`) and a staircase of streamed products of 1-16 rows (the repacking
    size: :func:`repacking_rows`; the few-row ratios: :func:`few_row_ratios`), again over a weight
    that fits one core's level-2 cache (its further passes: :func:`fast_pack`), and one-row
    products cycled over working sets of 4 to 384 MiB
    (the cache: :func:`measured_cache`) and products of 16 to 256 rows over weights of five inner
    sizes, each stored as a linear layer and as a Conv1D stores it (the small-M slowdown by layout
    and inner size: :func:`small_m_gaps`),
    timed with torch on the current thread setting.

    :func:`calibrate_here` fits the add only when the measured models leave the memory rate
    unidentified (every one of them in cache): one long stream reaches a bandwidth that a
    model's weights, read as many separate matrices with framework code between them, do not
    (on a 2-core x86 host, one thread: the add and a 134 MB matrix-vector product 14–15 GB/s,
    the models' weights 9–10 GB/s). Fitted with the models, the robust fit discounts it in most
    calibrations and follows it in some, so two calibrations of one machine landed on memory
    rates 23 % apart."""
    import torch

    def best(fn: Any) -> float:
        return _timed(fn, repeats, clock, warm=1, estimator=estimator)

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
    pair = [ob for shape in row_ladder_shapes()
            for ob in _streamed_products(shape, best, (1,), label=_PAIR, stream_bytes=PAIR_STREAM_BYTES)]
    staircase = _streamed_products(STAIRCASE_WEIGHT, best, FEW_ROWS, label=_STAIRCASE)
    staircase += [ob for shape in few_row_shapes(STAIRCASE_WEIGHT)
                  for ob in _streamed_products(shape, best, FEW_ROWS, label=_SHAPES)]
    core = core_cache_bytes()
    if core:
        fast = fast_staircase_weight(core)
        staircase += _streamed_products(fast, best, FEW_ROWS, label=_FAST_STAIRCASE)
        staircase += [ob for shape in few_row_shapes(fast)
                      for ob in _streamed_products(shape, best, FEW_ROWS, label=_FAST_SHAPES)]
    working_sets = _working_sets(best)
    layouts = _layout_products(best)
    return [
        Observation("micro matmul 1024^3 fp32", "micro", t_mm, np.array([2.0 * n**3]), np.array([3.0 * n * n * 4]),
                    one, 0.0, np.array([float(n)])),
        Observation("micro add 3x64MiB fp32", "micro", t_add, np.array([0.0]), np.array([3.0 * m * 4]), one, 0.0,
                    np.array([np.inf])),
        Observation(f"micro {calls} kernel calls", "micro", t_calls, np.zeros(1), np.zeros(1), np.zeros(1), 0.0,
                    np.array([np.inf]), ops=0.0, extra_launches=float(calls)),
        *pair,
        *staircase,
        *working_sets,
        *layouts,
    ]


#: Two fp32 linear-layer weights of the same 8 MiB, one of many short rows, one of few long ones:
#: a one-row product over each differs only in the number of rows it runs over (its bytes, FLOPs
#: and calls are the same), which measures the fixed cost per stored row (:func:`weight_row_cost`).
MATVEC_PAIR = ((8192, 256), (512, 4096))
#: The inner sizes (the stored rows' lengths) of the one-row products over fp32 weights of the
#: pair's bytes that measure the cost per stored row by the row's length (:func:`weight_row_costs`;
#: the pair is two of them). That cost is not one figure: on a 2-core x86 host, one thread, 8.4 MB
#: weights streamed from memory, rows of 128, 256, 384, 512, 1024, 2048 and 4096 elements streamed
#: at 8.2, 10.3, 12.0, 13.3, 16.6, 20.1 and 22.1 GB/s (two threads: 9.5, 10.2, 10.9, 13.0, 15.6,
#: 18.2, 18.8): one-thread products 40, 55, 61, 65, 67 and 38 ns a row longer than the 4096-element
#: rows' product, so one cost per row read off the pair (8192 against 512 rows: 59 ns) over-priced a
#: weight of 128-element rows and under-priced one of 384-1024 (two threads: a 12.6 MB output
#: layer of 384-element rows took 1356 µs, where the pair's figure gave about 1050)
ROW_LADDER_INNER = (128, 256, 512, 1024, 2048, 4096)


def row_ladder_shapes() -> list[tuple[int, int]]:
    """The weights ([out, in], the pair's bytes) of :data:`ROW_LADDER_INNER`, the pair's among them."""
    n, k = MATVEC_PAIR[0]
    return [(n * k // inner, inner) for inner in ROW_LADDER_INNER]


#: The weight and the row counts of the repacking staircase (:func:`repacking_rows`).
STAIRCASE_WEIGHT = (4096, 512)
STAIRCASE_ROWS = (1, 2, 3, 4, 8)
#: The row counts the staircases are timed at: the repacking staircase's and more, up to 16 rows,
#: 4P at the largest repacking size P the few-row ratios read, and as far as they reach
#: (:func:`few_row_ratios`: held at 4P's ratio past 4P). Between 4 and 16 rows the time is not
#: monotone (two threads on a 2-core x86 host, an 8.4 MB weight: 1.35-1.44, 1.10-1.19, 1.12-1.23
#: and 1.36-1.54 times the one-row time at 4, 6, 8 and 16 rows), so the counts between are timed too.
FEW_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
_STAIRCASE = "micro staircase"
_PAIR = "micro matrix-vector"
#: the same staircase over a weight half the size of one core's level-2 cache (at most 1 MiB):
#: what a further pass costs over a weight the first pass left in the core's cache
#: (:func:`fast_pack`)
_FAST_STAIRCASE = "micro core-cache staircase"
#: The inner sizes of the staircases' further weights (:func:`few_row_shapes`): which kernel a
#: few rows take depends on the weight's shape as well as its size
FEW_ROW_INNER = (256, 512, 1024, 2048)
#: the further weights of each staircase (:func:`few_row_ratios`: the ratios' geometric mean)
_SHAPES = "micro few-row shape"
_FAST_SHAPES = "micro core-cache few-row shape"


def few_row_shapes(weight: tuple[int, int]) -> list[tuple[int, int]]:
    """Weights of the size of ``weight`` ([out, in]) at the other inner sizes of
    :data:`FEW_ROW_INNER` that leave it at least 16 rows: a staircase over each beside the one over
    ``weight``. On a 2-core AMD host with two threads, a product of 4 rows over 8.4 MB weights took
    1.26-1.44 times its one-row time over [4096, 512], 1.47-1.53 over [8192, 256], 1.47-1.59 over
    [2048, 1024] and 1.53-1.64 over [1024, 2048] (timings minutes apart); inside `generate`,
    1.35-1.65 times over the weights of the models it ran (a Llama, a Falcon), where a profile
    read from the first staircase alone priced them at 1.31-1.34."""
    n, k = weight
    return [(n * k // inner, inner) for inner in FEW_ROW_INNER if inner != k and n * k // inner >= 16]


def core_cache_bytes() -> float | None:
    """Bytes of one core's level-2 cache as the operating system reports it (Linux sysfs; None
    where it does not say)."""
    from pathlib import Path

    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        if level != "2" or kind not in ("Unified", "Data") or not size:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        try:
            return float(size.rstrip("KMG")) * unit
        except ValueError:
            return None
    return None


def fast_staircase_weight(core_bytes: float) -> tuple[int, int]:
    """The fp32 weight [out, 256] of the core-cache staircase: half of ``core_bytes``, 64 to 1024 rows."""
    return int(min(1024, max(64, core_bytes // 2 // (256 * 4)))), 256


def _streamed_products(shape: tuple[int, int], best: Any, rows: tuple[int, ...], *, label: str,
                       stream_bytes: float = 96e6) -> list[Observation]:
    """Linear products of each of ``rows`` rows over a ``shape`` ([out, in]) fp32 weight, each
    timed over one cycle of copies of ``stream_bytes`` in all so that the weights come from
    memory, as a model's do; the time of one product. The pair's products (``label`` ``_PAIR``)
    state their weight's stored rows, which :func:`weight_row_cost` reads."""
    import torch

    n, k = shape
    copies = max(2, int(stream_bytes // (n * k * 4)))
    ws = [torch.randn(n, k) for _ in range(copies)]
    linear = torch.nn.functional.linear
    nbytes = float(n * k * 4)
    out = []

    def name(r: int) -> str:
        return f"{label}: {r} rows over [{n}, {k}] fp32, streamed"

    for r in rows:
        x = torch.randn(r, k)

        def cycle(x: Any = x) -> None:
            for w in ws:
                linear(x, w)

        out.append(Observation(name(r), "micro", best(cycle) / copies,
                               np.array([2.0 * r * n * k]), np.array([nbytes + 4.0 * r * (n + k)]), np.ones(1), 0.0,
                               np.array([float(r)]), resident=np.array([stream_bytes]),
                               weight_bytes=np.array([nbytes]),
                               weight_rows=np.array([float(n)]) if label == _PAIR else None, calls=1.0,
                               unit=name(rows[0]) if r != rows[0] else None))
    return out


#: The layout ladder (:func:`small_m_gaps`): products of these rows over fp32 weights of
#: [out, in] = [LAYOUT_OUT, K] for each inner size K of LAYOUT_INNER, stored [out, in] (a linear
#: layer) and [in, out] (a Conv1D), kept in cache (the kernel's speed, not the memory's); the last
#: row count is the large product whose time per row is the unit of the slowdown
LAYOUT_OUT = 1152
LAYOUT_INNER = (256, 384, 512, 768, 1024)
LAYOUT_ROWS = (16, 32, 48, 256)
_LAYOUT = "micro layout"


def ladder_label(layout: str, rows: int, inner: int) -> str:
    """The label of the layout ladder's product of ``rows`` rows over a [:data:`LAYOUT_OUT`,
    ``inner``] weight stored ``layout`` (``[out, in]`` or ``[in, out]``), which
    :func:`ladder_half_rows` reads."""
    return f"{_LAYOUT} {layout}: {rows} rows over [{LAYOUT_OUT}, {inner}] fp32"


def _layout_products(best: Any) -> list[Observation]:
    """The layout ladder: for each inner size of :data:`LAYOUT_INNER` and each of
    :data:`LAYOUT_ROWS`, the time of one product over a [:data:`LAYOUT_OUT`, K] weight stored as a
    linear layer stores it and as a Conv1D does (the same ``F.linear`` call, the second over the
    transposed view of an [in, out] tensor). On a 2-core x86 host, fp32, with two threads: the
    [out, in] products of 16-48 rows took (R + 64 to 104) / R of their full-speed time at K up to
    640 and (R + 2 to 38) / R from K = 768, the [in, out] ones (R - 6 to 38) / R at every K;
    with one thread (R + 8 to 31) / R and (R + 1 to 27) / R (K = 192 to 3072)."""
    import torch

    linear = torch.nn.functional.linear
    n = LAYOUT_OUT
    out = []
    for k in LAYOUT_INNER:
        stored = {"[out, in]": torch.randn(n, k), "[in, out]": torch.randn(k, n).t()}
        nbytes = float(n * k * 4)
        unit = ladder_label("[out, in]", LAYOUT_ROWS[-1], k)  # what ladder_half_rows divides by
        for r in LAYOUT_ROWS:
            x = torch.randn(r, k)
            calls = max(2, 256 // r)
            for layout, w in stored.items():
                def run(w: Any = w, x: Any = x, calls: int = calls) -> None:
                    for _ in range(calls):
                        linear(x, w)

                label = ladder_label(layout, r, k)
                out.append(Observation(label, "micro", best(run) / calls, np.array([2.0 * r * n * k]),
                                       np.array([nbytes + 4.0 * r * (n + k)]), np.ones(1), 0.0,
                                       np.array([float(r)]), weight_bytes=np.array([nbytes]), calls=1.0,
                                       unit=unit if label != unit else None))
    return out


def ladder_half_rows(micro: list[Observation]) -> dict[tuple[str, float], float]:
    """The small-M slowdown ``h`` the layout ladder among ``micro`` shows, by (layout, inner
    size): at each small row count R, the product's time over the time per row of the largest
    [out, in] product of the same inner size, less R; the median over the small R. Empty where
    the ladder is missing or incomplete."""
    ladder: dict[tuple[str, float, float], float] = {}
    for ob in micro:
        if ob.label.startswith(_LAYOUT):
            head, shape = ob.label[len(_LAYOUT) + 1:].split(" over [")
            layout, count = head.split(": ")
            inner = float(shape.split(",")[1].split("]")[0])
            ladder[(layout, inner, float(count.split()[0]))] = ob.measured_s
    out: dict[tuple[str, float], float] = {}
    for inner in sorted({k for _, k, _ in ladder}):
        rows = sorted({r for _, k, r in ladder if k == inner})
        if len(rows) < 2 or any((lay, inner, r) not in ladder for lay in ("[out, in]", "[in, out]") for r in rows):
            return {}
        per_row = ladder[("[out, in]", inner, rows[-1])] / rows[-1]
        if not per_row > 0:
            return {}
        for lay in ("[out, in]", "[in, out]"):
            out[(lay, inner)] = float(statistics.median(ladder[(lay, inner, r)] / per_row - r for r in rows[:-1]))
    return out


def small_m_gaps(micro: list[Observation]) -> SmallMGaps | None:
    """The gaps of :class:`~perfsdk.hardware.profile.SmallMGaps` from the layout ladder among
    ``micro`` (None where it is missing): each (layout, inner size)'s ``h``
    (:func:`ladder_half_rows`) taken from the anchor, the median ``h`` of the [out, in] products
    over the inner sizes (:func:`anchored_on_products` takes it from the calibration's own
    products instead). The fit's ``h`` is that of a product at the anchor; a product then
    keeps the share of it its own measured ``h`` is of the anchor (none at or below 0 rows, all
    of it at or above the anchor). An anchor of 0 rows or less (no slowdown at the median) leaves
    the gaps to be subtracted."""
    h = ladder_half_rows(micro)
    if not h:
        return None
    inner = sorted({k for _, k in h})
    anchor = float(statistics.median(h[("[out, in]", k)] for k in inner))
    return SmallMGaps(inner=inner, out_in=[anchor - h[("[out, in]", k)] for k in inner],
                      in_out=[anchor - h[("[in, out]", k)] for k in inner], anchor=anchor if anchor > 0 else None)


def anchored_on_products(gaps: SmallMGaps | None, measured: list[Observation],
                         pack_rows: float = 0.0) -> SmallMGaps | None:
    """``gaps`` taken from the ``h`` the ladder measured at the calibration's own products: the
    weighted median of each product's ladder ``h`` (its layout and inner size) over the matrix
    products of ``measured`` the small-M term applies to at ``pack_rows``, each weighted by its
    FLOPs per output row (what it adds to the fitted ``h``'s column). The fitted ``h`` is that
    of the products the fit saw, so a product keeps the share of it its own ladder ``h`` is of
    theirs. Taken from the ladder's own median instead, a size the models do not use could stand
    as the anchor: on a 2-core x86 host with two threads the ladder measured ``h`` of 25 rows at
    K = 512, where the calibration's models lie, and 15 at K = 768, the anchor then, so every
    product of K = 768 kept all of the fitted 47 rows, and a 768-wide model's 32-row prefill
    products came out 36 % slower than the profiler timed them. ``gaps`` unchanged without an
    anchor or such products."""
    from perfsdk.stats import weighted_median

    if gaps is None or gaps.anchor is None:
        return gaps
    hs: list[float] = []
    ws: list[float] = []
    for ob in measured:
        if ob.inner is None:
            continue
        in_out = ob.in_out if ob.in_out is not None else np.zeros(len(ob.flops), dtype=bool)
        for k, io, w in zip(ob.inner, in_out, ob.weights * ob.row_flops(pack_rows)):
            if w > 0 and k > 0:
                hs.append(gaps.anchor - gaps.gap(float(k), bool(io)))
                ws.append(float(w))
    anchor = weighted_median(hs, ws) if ws else 0.0
    if not anchor > 0:
        return gaps
    shift = anchor - gaps.anchor
    return gaps.model_copy(update={"out_in": [g + shift for g in gaps.out_in],
                                   "in_out": [g + shift for g in gaps.in_out], "anchor": anchor})


def small_m_text(gaps: SmallMGaps, profile: HardwareProfile) -> str:
    """What the layout ladder measured (``gaps``: :func:`small_m_gaps`) and what the profile
    ``profile`` made of it, for the calibration's output."""
    h = profile.matmul_half_rows or 0.0
    sizes = ", ".join(f"{k:g}" for k in gaps.inner)
    if not h:
        return (f"products of {min(LAYOUT_ROWS)}-{sorted(LAYOUT_ROWS)[-2]} rows measured at inner sizes {sizes}; "
                "no small-M slowdown fitted, so every product is priced alike")

    def row(in_out: bool) -> str:
        return " ".join(f"{gaps.half_rows(h, k, in_out):.1f}" for k in gaps.inner)

    return (f"small-M slowdown (rows + h) / rows by inner size K = {sizes} (the layout ladder, products of "
            f"{min(LAYOUT_ROWS)}-{sorted(LAYOUT_ROWS)[-2]} rows): h {row(False)} over a weight stored [out, in] "
            f"(a linear layer), {row(True)} over one stored [in, out] (a Conv1D); fitted h {h:.1f}")


#: The cache staircase (:func:`measured_cache`): one-row products over [1024, 1024] fp32 weights
#: (4 MiB each), cycled over working sets of this many MiB.
CACHE_WEIGHT = (1024, 1024)
#: working sets timed (MiB): past the step from a last-level cache to memory on the hosts seen
#: (32 MiB L3; on a host whose ``lscpu`` reports a 480 MiB L3, the rate stepped down between 32
#: and 128 MB and held from 192 MB on)
CACHE_SETS_MIB = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
#: bytes the pair of :data:`MATVEC_PAIR` cycles over: the largest working set, past every cache the
#: working sets can find, since the cost per stored row is paid on weights streamed from memory
#: only (one thread on a 2-core x86 host with an 80 MB cache: [8192, 256] and [256, 8192] one-row
#: products 28.2 and 28.1 GB/s over 32 MB, 13.3 and 15.9 GB/s over 384 MB)
PAIR_STREAM_BYTES = float(CACHE_SETS_MIB[-1] * 2**20)
_CACHE = "micro working set"
#: a cache is held only where the smallest working set streams at least this many times faster
#: than the largest (below, one memory rate describes every working set)
CACHE_MIN_SPEEDUP = 1.5
#: two steps are two cache levels only when the larger lies at least this many times above the
#: smaller and the working sets between them stream at a rate of their own, at least
#: :data:`CACHE_LEVEL_SPEEDUP` times slower than below the first and faster than past the second
CACHE_LEVEL_RATIO = 4.0
CACHE_LEVEL_SPEEDUP = 1.2


def _working_sets(best: Any) -> list[Observation]:
    """One-row products over :data:`CACHE_WEIGHT` cycled over copies of each working set of
    :data:`CACHE_SETS_MIB` (the first copies of one allocation), the time of one product each;
    ``resident`` states the working set (what the cache model compares with the cache)."""
    import torch

    n, k = CACHE_WEIGHT
    nbytes = float(n * k * 4)
    copies = [max(1, int(mib * 2**20 // nbytes)) for mib in CACHE_SETS_MIB]
    ws = [torch.randn(n, k) for _ in range(max(copies))]
    x = torch.randn(1, k)
    linear = torch.nn.functional.linear
    out = []
    for c in copies:
        def cycle(c: int = c) -> None:
            for w in ws[:c]:
                linear(x, w)

        out.append(Observation(f"{_CACHE}: {c * nbytes / 2**20:.0f} MiB of [{n}, {k}] fp32, one row", "micro",
                               best(cycle) / c, np.array([2.0 * n * k]), np.array([nbytes + 4.0 * (n + k)]),
                               np.ones(1), 0.0, np.array([1.0]), resident=np.array([c * nbytes]),
                               weight_bytes=np.array([nbytes]), calls=1.0))
    return out


def _cache_grid(lo: float, hi: float) -> np.ndarray:
    """Candidate cache sizes from ``lo`` to ``hi`` bytes: every MiB up to 64 MiB, every 4 MiB above."""
    mib = float(2**20)
    fine = np.arange(lo, min(hi, 64 * mib) + mib / 2, mib)
    coarse = np.arange(max(lo, 64 * mib + 4 * mib), hi + mib / 2, 4 * mib)
    return np.concatenate([fine, coarse])


def _levels_fit(micro: list[Observation]) -> tuple[tuple[float, ...] | None, float | None]:
    """The cache sizes in bytes that the working sets among ``micro`` follow (None when fewer than
    three were timed; ``()`` where the smallest set does not stream :data:`CACHE_MIN_SPEEDUP`
    times faster than the largest). Under the cost model's share ``f = min(1, C / S)`` for a
    working set of S bytes, each product's time is fitted with one step, ``f * t_cache +
    (1 - f) * t_memory``, and with two, ``f1 * t_1 + (f2 - f1) * t_2 + (1 - f2) * t_memory``, the
    times linear, for every size (two sizes) from the smallest working set to half the largest;
    the least relative squared residual wins. Two sizes are returned where they are two levels
    (:data:`CACHE_LEVEL_RATIO` apart, the rate between them :data:`CACHE_LEVEL_SPEEDUP` times
    apart from both sides'), else the one step's. (One thread on a 2-core x86 host with a 32 MiB
    L3: 53, 53, 60, 121, 181, 216 and 221 µs a product at 4, 8, 16, 24, 32, 48 and 64 MiB, 229 µs
    at 256 MiB: one level. Two threads on a 2-core Intel host: 4.2 MB, then a second step between
    32 and 128 MB, 48.5-48.9 GB/s below it and 24.1-26.2 GB/s from 192 MB.)"""
    steps = _cache_steps(micro)
    if len(steps) < 3:
        return None, None
    size = np.array([float(ob.resident[0]) for ob in steps])  # type: ignore[index]
    t = np.array([ob.measured_s for ob in steps])
    if not t[-1] >= CACHE_MIN_SPEEDUP * t[0]:
        return (), None
    grid = _cache_grid(size[0], size[-1] / 2)
    shares = {float(c): np.minimum(1.0, c / size) for c in grid}

    def residual(columns: list[np.ndarray]) -> tuple[float, np.ndarray]:
        a = np.stack(columns, axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        return float(np.sum((a @ coef - 1.0) ** 2)), coef

    one_c, one_res, one_tm = 0.0, float("inf"), 0.0
    for c, f in shares.items():
        res, coef = residual([f, 1.0 - f])
        if res < one_res - 1e-12:
            one_c, one_res, one_tm = c, res, coef[1]
    two, two_res, past = None, float("inf"), 0.0
    if len(steps) >= 5:
        for c1, f1 in shares.items():
            for c2, f2 in shares.items():
                if c2 < CACHE_LEVEL_RATIO * c1:
                    continue
                res, coef = residual([f1, f2 - f1, 1.0 - f2])
                t1, t2, tm = coef
                if not (t1 > 0 and t2 >= CACHE_LEVEL_SPEEDUP * t1 and tm >= CACHE_LEVEL_SPEEDUP * t2):
                    continue
                if res < two_res - 1e-12:
                    two, two_res, past = (c1, c2), res, float(tm)
    per_byte = float(steps[0].bytes_[0])
    if two is not None and two_res < one_res:
        return two, past / per_byte
    return (one_c,), float(one_tm) / per_byte


def _cache_steps(micro: list[Observation]) -> list[Observation]:
    """The working sets among ``micro``, smallest first."""
    return sorted((ob for ob in micro if ob.label.startswith(_CACHE)),
                  key=lambda ob: float(ob.resident[0]))  # type: ignore[index]


#: the working sets of at least this share of the largest stream from memory: their median time is
#: the memory's end of the cache's shares (:func:`cache_shares`; 192 to 384 MiB: on every host seen
#: the rate held from 192 MB on, and the median of the three outvotes one set that met a stall)
CACHE_PAST = 0.5


def cache_shares(micro: list[Observation], cache_bytes: float) -> CacheShares | None:
    """The share of a pass's bytes served from a cache of ``cache_bytes``, by the bytes the pass
    touches, as the working sets among ``micro`` measured it: 1 for the sets inside the cache (its
    size is where their time steps up), and past it each set's time t placed between the in-cache
    time (the median of the sets inside; the smallest where none is) and the memory's (the median
    of the sets of at least :data:`CACHE_PAST` times the largest), ``(t_memory - t) / (t_memory -
    t_cache)`` between 0 and 1, made not to rise with the size (pooled where it does). None
    without a cache, with fewer than three sets, or where the sets past the cache streamed no
    slower than those inside. (The first set timed can run slower than the next: 112.2 against
    89.7 µs at 4 and 8 MiB in one timing here; read like the sets past the cache, one
    calibration's two came out 0.91.)

    The cost model's ``min(1, cache / bytes)`` assumes a pass keeps as much of its bytes cached
    as fits; weights cycled through can keep less. Two threads on a 2-core AMD host (11.5 MB
    cache), one-row products over [2048, 256] and [128, 4096] fp32 weights cycled over 4 to 384
    MiB: 115.0 and 69.9 µs a product at 4 MiB, 183.1 and 93.8 at 16, 239.3 and 111.6 at 20,
    232.9 and 117.4 at 384: 0.42 and 0.50 of the bytes from the cache at 16 MiB, 0 and 0.12 at
    20, where the ratio gives 0.69 and 0.55. The working sets of :data:`CACHE_WEIGHT` on the same
    host followed the ratio closely (0.72 and 0.82 at 16 MiB, 0.43 and 0.48 at 24, in two timings
    that measured caches of 11.5 and 13.6 MB: the ratio 0.69 and 0.81, 0.46 and 0.54)."""
    steps = _cache_steps(micro)
    if not cache_bytes or len(steps) < 3:
        return None
    size = np.array([float(ob.resident[0]) for ob in steps])  # type: ignore[index]
    t = np.array([ob.measured_s for ob in steps])
    inside = t[size <= cache_bytes]
    t_cache = float(np.median(inside if len(inside) else t[:1]))
    t_memory = float(np.median(t[size >= CACHE_PAST * size[-1]]))
    if not t_memory > t_cache:
        return None
    past = np.clip((t_memory - t) / (t_memory - t_cache), 0.0, 1.0)
    share = _not_rising(np.where(size <= cache_bytes, 1.0, past))
    return CacheShares(resident_bytes=[float(b) for b in size], share=[float(f) for f in share])


def _not_rising(values: np.ndarray) -> np.ndarray:
    """The closest sequence (least squares) to ``values`` that does not rise: each run that rises
    pooled into its mean (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    return np.concatenate([np.full(int(n), total / n) for total, n in blocks])


def cache_shares_text(shares: CacheShares) -> str:
    """The cache's shares as the calibration prints them: at each working set whose share differs
    from the previous one's, and where they reach 0."""
    parts, last = [], None
    for size, f in zip(shares.resident_bytes, shares.share):
        if last is None or abs(f - last) >= 0.005:
            parts.append(f"{f:.2f} at {size / 2**20:.0f} MiB")
            last = f
        if f <= 0.0:
            break
    return "served from it by the bytes a pass touches (the working sets): " + ", ".join(parts)


def cache_levels(micro: list[Observation]) -> tuple[float, ...] | None:
    """The cache levels the working sets among ``micro`` follow (:func:`_levels_fit`)."""
    return _levels_fit(micro)[0]


def memory_past_cache(micro: list[Observation]) -> float | None:
    """Seconds per byte the working sets among ``micro`` stream at past the last cache level
    (:func:`cache_levels`; None where they show none): the memory's rate as a model larger than
    that level reads its weights, which calibration models that mostly fit inside the level
    cannot pin on their own."""
    return _levels_fit(micro)[1]


def _models_inside(cache: float, measured: list[Observation]) -> bool:
    """Whether most of the measured phases touch no more than ``cache`` bytes (weights + KV cache)."""
    sizes = [float(np.max(ob.resident)) for ob in measured if ob.resident is not None and len(ob.resident)]
    return bool(sizes) and cache >= float(np.median(sizes))


def measured_cache(micro: list[Observation]) -> float | None:
    """The cache size C in bytes (0: none) the cost model holds, from the working sets among
    ``micro`` (None when they are missing): the last of the :func:`cache_levels` they follow.
    The cost model has one cache; the models it prices stream their weights once a pass, and
    the ones larger than a first, small level (a few MB: an L2) pay the rate past the last one,
    which is where a model of hundreds of MB stands."""
    levels = cache_levels(micro)
    if levels is None:
        return None
    return levels[-1] if levels else 0.0


def _sets_text() -> str:
    return f"{CACHE_SETS_MIB[0]} to {CACHE_SETS_MIB[-1]} MiB"


def measured_cache_note(measured: float | None, result: FitResult, levels: tuple[float, ...] | None = None,
                        memory_origin: str | None = None) -> str:
    """What became of the cache size the working sets measured (:func:`measured_cache`), as the
    calibration prints it; ``levels`` (:func:`cache_levels`) names a smaller level passed over;
    ``memory_origin`` what measured the memory's rate where it was held: ``"the pair"``
    (:func:`pair_memory_rate`) or ``"the working sets"`` (:func:`memory_past_cache`)."""
    if measured is None:
        return "none: no working sets timed"
    if not measured:
        return f"none: the working sets of {_sets_text()} streamed within {CACHE_MIN_SPEEDUP}x of each other"
    first = ("" if not levels or len(levels) < 2 else
             f" (the last of two levels; the first, {levels[0] / 1e6:.1f} MB, not held)")
    if not result.cache_bytes:
        return (f"{measured / 1e6:.1f} MB measured by the working sets{first}, not held: the models' fit gave it no "
                "rate between free and the memory's")
    k = result.coefficients
    memory = {"the working sets": "from memory, as the working sets past it streamed (held)",
              "the pair": "from memory, as the pair of one-row products streamed it (held)"}.get(
        memory_origin or ("the working sets" if "s_per_byte" in result.held else ""), "from memory")
    served = f"; {cache_shares_text(result.cache_shares)}" if result.cache_shares is not None else ""
    if result.cache_rate_tied:
        return (f"{result.cache_bytes / 1e6:.1f} MB measured by the working sets{first} and held; fitted on the "
                f"models, its rate came out no faster than the memory's or free, so it takes the memory's, "
                f"{1e-9 / k['s_per_byte']:.1f} GB/s {memory}: it only divides the weights' rows between the "
                f"cache and memory{served}")
    return (f"{result.cache_bytes / 1e6:.1f} MB measured by the working sets{first} and held; its rate fitted on the "
            f"models, {1e-9 / k['s_per_cached_byte']:.1f} GB/s against {1e-9 / k['s_per_byte']:.1f} GB/s {memory}"
            f"{served}")


#: Repacking sizes whose staircase residuals lie within this factor of the least one are a tie,
#: and the largest of them is kept (:func:`repacking_choice`). On a 2-core AMD host (two threads)
#: a [4096, 512] fp32 weight streamed took 0.88-0.95, 1.36-1.52, 0.90-1.07 and 0.67-1.16 one-row
#: products' time more at 2, 3, 4 and 8 rows (five staircases): neither shape (P = 1: 2, 3, 1, 1
#: passes; P = 2: 1, 2, 2, 1) describes it, their residuals lay within 4 % of each other in one
#: calibration, and two calibrations minutes apart chose P = 1 and P = 2 from nearly the same
#: staircase, then predicted the batch-4 decode of nine other families 8-16 % apart (the same
#: measurements fitted with the same P, either, at most 4.0-5.2 % apart).
PACK_ROWS_TIE = 1.25


def repacking_choice(micro: list[Observation], grid: tuple[float, ...]) -> tuple[float, str] | None:
    """The repacking size P of :func:`~perfsdk.simulation.costmodel.pack_passes` that the
    staircase among ``micro`` follows best, and a sentence saying how it was chosen (None when
    the staircase is missing): products of 1, 2, 3, 4 and 8 rows over the same streamed weights,
    whose extra time over the one-row product is, for each P of ``grid``, fitted as (extra passes
    at P) x one rate; the P with the least relative squared residual wins (P = 0, no repacking,
    leaves every extra time unexplained), except that sizes within :data:`PACK_ROWS_TIE` of it are
    a tie the staircase cannot settle, and the largest of them is kept, so that the same machine
    gives the same size from one calibration to the next."""
    from perfsdk.simulation.costmodel import pack_passes

    steps = sorted((ob for ob in micro if ob.label.startswith(_STAIRCASE) and _on_pack_staircase(ob)),
                   key=lambda ob: float(ob.rows[0]))  # type: ignore[index]
    if len(steps) < 3 or float(steps[0].rows[0]) != 1.0:  # type: ignore[index]
        return None
    rows = np.array([float(ob.rows[0]) for ob in steps[1:]])  # type: ignore[index]
    extra = np.array([ob.measured_s - steps[0].measured_s for ob in steps[1:]])
    scale = float(np.sum(extra * extra)) or 1.0
    residuals: dict[float, float] = {}
    timed: set[float] = set()  # the sizes whose extra passes take time (P = 0 takes none)
    for p in grid:
        n = np.asarray(pack_passes(rows, p), dtype=float)
        rate = float(np.sum(n * extra) / np.sum(n * n)) if np.any(n) else 0.0
        residuals.setdefault(float(p), float(np.sum((extra - max(rate, 0.0) * n) ** 2)) / scale)
        if rate > 0 or not p:
            timed.add(float(p))
    least = min(residuals.values())
    best = next(p for p, r in residuals.items() if r <= least + 1e-12)
    # a size whose passes take no time explains nothing and takes no part in a tie
    tied = [p for p, r in residuals.items() if r <= PACK_ROWS_TIE * least + 1e-12 and p in timed]
    chosen = max(tied) if tied else best
    shape = ", ".join(f"{e / steps[0].measured_s:+.2f}" for e in extra)
    counts = ", ".join(f"{r:g}" for r in rows)
    said = (f"{'none' if not chosen else f'from {chosen:g} rows'} (the staircase: {shape} one-row products' time "
            f"more at {counts} rows; residual {residuals[chosen]:.3f}")
    if chosen != best:
        said += (f", and {residuals[best]:.3f} at P = {best:g}: within {PACK_ROWS_TIE:g} times of each other, a tie "
                 "the staircase cannot settle, the larger kept")
    return chosen, said + ")"


def _pass_time_per_byte(steps: list[Observation], pack_rows: float) -> float | None:
    """Seconds per weight byte of one further pass, from a staircase: its products' extra time over
    the one-row product against their extra passes at ``pack_rows`` (least squares through 0)."""
    from perfsdk.simulation.costmodel import pack_passes

    steps = sorted((ob for ob in steps if _on_pack_staircase(ob)),
                   key=lambda ob: float(ob.rows[0]))  # type: ignore[index]
    if len(steps) < 2 or float(steps[0].rows[0]) != 1.0 or steps[0].weight_bytes is None:  # type: ignore[index]
        return None
    n = np.array([float(pack_passes(float(ob.rows[0]), pack_rows)) for ob in steps[1:]])  # type: ignore[index]
    extra = np.array([ob.measured_s - steps[0].measured_s for ob in steps[1:]])
    if not np.any(n):
        return None
    rate = float(np.sum(n * extra) / np.sum(n * n))
    return rate / float(steps[0].weight_bytes[0]) if rate > 0 else None


def _on_pack_staircase(ob: Observation) -> bool:
    """Whether a staircase product's rows are among :data:`STAIRCASE_ROWS` (what the repacking
    size and rates are read from; the further counts of :data:`FEW_ROWS` serve the ratios)."""
    return ob.rows is not None and float(ob.rows[0]) in STAIRCASE_ROWS


def _ratios(steps: list[Observation]) -> tuple[list[int], list[float], float] | None:
    """(rows from 2, time over the one-row time at each, weight bytes) of one staircase."""
    by_rows = {int(ob.rows[0]): ob for ob in steps if ob.rows is not None}  # type: ignore[index]
    one = by_rows.get(1)
    if one is None or one.weight_bytes is None or not one.measured_s > 0:
        return None
    rows = sorted(r for r in by_rows if r >= 2)
    if not rows:
        return None
    return rows, [by_rows[r].measured_s / one.measured_s for r in rows], float(one.weight_bytes[0])


def few_row_ratios(micro: list[Observation], capacity: float | None,
                   max_rows: float | None = None, held_from: float | None = None) -> FewRowRatios | None:
    """What a product of a few rows costs against its one-row product, from the staircases among
    ``micro`` (the profile's ``matmul_few_rows``): the repacking staircase over a weight streamed
    from memory, and where the core-cache staircase was timed and ``capacity`` (the level-2 cache of
    the cores a product runs on) is known and smaller than the first's weight, the core-cache one
    for weights of at most ``capacity``; row counts up to ``max_rows``. With ``held_from`` (the
    calibration's: 4P, where the blocked kernel takes over), the counts past it take the ratio of
    the last count up to it, as far as the staircase's last count: ``rows`` end with that count and
    it, at one ratio. Each staircase's ratios are the geometric mean with those of the staircases
    over its further shapes (:func:`few_row_shapes`), at the counts all of them reached. None where
    the first staircase is missing or has no count from 2 to ``max_rows`` or ``held_from``."""
    big = _mean_ratios(micro, _STAIRCASE, _SHAPES)
    if big is None:
        return None
    rows, streamed, streamed_bytes, shapes = big
    if max_rows is not None:
        streamed = [r for n, r in zip(rows, streamed) if n <= max_rows]
        rows = [n for n in rows if n <= max_rows]
        if not rows:
            return None
    small = _mean_ratios(micro, _FAST_STAIRCASE, _FAST_SHAPES)
    cached = cached_mb = None
    if small is not None and capacity and capacity < streamed_bytes:
        common = [r for r in rows if r in small[0]]
        streamed = [streamed[rows.index(r)] for r in common]
        cached = [small[1][small[0].index(r)] for r in common]
        rows, cached_mb = common, max(capacity, small[2]) / 1e6
    if held_from is not None:
        upto = [i for i, n in enumerate(rows) if n <= held_from]
        if not upto:
            return None
        keep = upto[-1]
        if keep < len(rows) - 1:
            rows = [*rows[: keep + 1], rows[-1]]
            streamed = [*streamed[: keep + 1], streamed[keep]]
            cached = [*cached[: keep + 1], cached[keep]] if cached is not None else None
    return FewRowRatios(rows=rows, streamed=streamed, streamed_mb=streamed_bytes / 1e6, cached=cached,
                        cached_mb=cached_mb, shapes=shapes)


def _mean_ratios(micro: list[Observation], first: str, further: str) -> tuple[list[int], list[float], float, int] | None:
    """(rows, ratios, weight bytes, shapes) of the staircase labelled ``first`` and the further
    ones labelled ``further`` (:func:`few_row_shapes`, each named by its weight): at each row
    count all of them reached, the geometric mean of their ratios; the first's weight bytes. None
    without the first."""
    own = _ratios([ob for ob in micro if ob.label.startswith(first)])
    if own is None:
        return None
    by_weight: dict[str, list[Observation]] = {}
    for ob in micro:
        if ob.label.startswith(further):
            by_weight.setdefault(ob.unit or ob.label, []).append(ob)
    stairs = [own, *(r for r in map(_ratios, by_weight.values()) if r is not None)]
    rows = [n for n in own[0] if all(n in st[0] for st in stairs)]
    if not rows:
        return None
    mean = [statistics.geometric_mean(st[1][st[0].index(n)] for st in stairs) for n in rows]
    return rows, mean, own[2], len(stairs)


def few_row_text(few: FewRowRatios) -> str:
    """The few-row ratios as the calibration prints them; a ratio held from one count to the
    last (:func:`few_row_ratios`' ``held_from``) is said once, with the counts it covers."""
    rows, streamed, cached = list(few.rows), list(few.streamed), list(few.cached) if few.cached is not None else None
    kinds = f"; the geometric mean over {few.shapes} shapes of that size" if few.shapes > 1 else ""
    held = ""
    if len(rows) > 1 and streamed[-1] == streamed[-2] and (cached is None or cached[-1] == cached[-2]):
        held = f" (one of {rows[-2] + 1} to {rows[-1]} rows as one of {rows[-2]})"
        rows, streamed, cached = rows[:-1], streamed[:-1], cached[:-1] if cached is not None else None
    said = (f"a product of {', '.join(map(str, rows))} rows{held} takes "
            f"{', '.join(f'{r:.2f}' for r in streamed)} times its one-row time over a weight streamed from "
            f"memory ({few.streamed_mb:.1f} MB{kinds})")
    if cached is not None:
        said += (f", {', '.join(f'{r:.2f}' for r in cached)} over one of at most {few.cached_mb:.1f} MB "
                 "(the cores' caches)")
    return said


def fast_pack(micro: list[Observation], pack_rows: float, capacity: float | None) -> tuple[float, float] | None:
    """(bytes, share) of the further passes over a weight that stays in the cores' own caches
    (:func:`~perfsdk.simulation.costmodel.fast_pack_share`): ``capacity``, the level-2 cache of
    the cores a product runs on, and the time per byte of a pass over the core-cache staircase's
    weight as a share of the staircase's (over a larger weight). None where either staircase is
    missing, no capacity is known, the larger weight fits it, or the smaller weight's passes are
    not the faster."""
    big = [ob for ob in micro if ob.label.startswith(_STAIRCASE)]
    small = [ob for ob in micro if ob.label.startswith(_FAST_STAIRCASE)]
    if not capacity or not pack_rows or not big or not small:
        return None
    if big[0].weight_bytes is None or float(big[0].weight_bytes[0]) <= capacity:
        return None
    slow, fast = _pass_time_per_byte(big, pack_rows), _pass_time_per_byte(small, pack_rows)
    if slow is None or fast is None or fast >= slow:
        return None
    return capacity, fast / slow


def fast_pack_text(pack_fast: tuple[float, float]) -> str:
    """The core-cache passes as the calibration prints them (after the repacking size)."""
    return (f"; over weights of at most {pack_fast[0] / 1e6:.1f} MB (the cores' level-2 caches) the further passes "
            f"take {pack_fast[1]:.2f} of that time (the core-cache staircase)")


def repacking_rows(micro: list[Observation], grid: tuple[float, ...]) -> float | None:
    """The repacking size :func:`repacking_choice` keeps (None when the staircase is missing)."""
    choice = repacking_choice(micro, grid)
    return None if choice is None else choice[0]


def weight_row_cost(micro: list[Observation], cache_bytes: float = 0.0,
                    shares: CacheShares | None = None) -> float | None:
    """Seconds per stored weight row, from the pair of streamed matrix-vector products among
    ``micro`` (:data:`MATVEC_PAIR`): the difference of their times over the difference of their
    rows, each row paid on the share of the weight streamed from memory past a cache of
    ``cache_bytes`` (the cost model's, :func:`~perfsdk.simulation.costmodel.cached_share`, with the
    pair's working set; by ``shares`` where measured). None when the pair is missing or its
    working set fits that cache (then it measures no row from memory); 0 when the narrow rows
    were not the slower."""
    pair = _pair(micro, cache_bytes, shares)
    if pair is None:
        return None
    a, b, streamed = pair
    rows = float(np.sum(a.weight_rows) - np.sum(b.weight_rows))  # type: ignore[arg-type]
    if rows <= 0:
        return None
    return max(0.0, (a.measured_s - b.measured_s) / (rows * streamed))


def _pair(micro: list[Observation], cache_bytes: float,
          shares: CacheShares | None = None) -> tuple[Observation, Observation, float] | None:
    """The pair of :data:`MATVEC_PAIR` among ``micro`` (by their weights' rows), more rows first,
    and the share of its working set streamed from memory past a cache of ``cache_bytes`` (the
    cost model's share); None when the pair is missing or that share is nothing."""
    by_rows = {float(np.sum(ob.weight_rows)): ob for ob in _ladder(micro)}  # type: ignore[arg-type]
    a, b = (by_rows.get(float(n)) for n, _ in MATVEC_PAIR)
    if a is None or b is None:
        return None
    streamed = _streamed_share(a, cache_bytes, shares)
    return (a, b, streamed) if streamed > 0 else None


def _ladder(micro: list[Observation]) -> list[Observation]:
    """The one-row products of the row ladder among ``micro`` (the pair's label, stored rows stated)."""
    return [ob for ob in micro if ob.label.startswith(_PAIR) and ob.weight_rows is not None]


def _streamed_share(ob: Observation, cache_bytes: float, shares: CacheShares | None = None) -> float:
    """The share of a streamed product's working set past a cache of ``cache_bytes``
    (:func:`~perfsdk.simulation.calibration.fit.cached_fraction`, by ``shares`` where measured)."""
    if not cache_bytes:
        return 1.0
    working = float(np.max(ob.resident)) if ob.resident is not None and len(ob.resident) else 0.0
    if working <= 0:
        return 0.0
    return 1.0 - float(cached_fraction(np.array([working]), cache_bytes, shares)[0])


def weight_row_costs(micro: list[Observation], cache_bytes: float = 0.0,
                     shares: CacheShares | None = None) -> WeightRowCosts | None:
    """The cost per stored row by the row's length, from the row ladder among ``micro``
    (:data:`ROW_LADDER_INNER`: one-row products over weights of the same bytes, streamed from
    memory): at each length, the difference of its product's time from the longest rows' over its
    rows (paid on the share streamed past a cache of ``cache_bytes``, as :func:`weight_row_cost`
    reads the pair); the longest rows pay none, so the memory's rate is the one they stream at.
    Each cost is read against the longest rows alone: a difference between two long-row products
    is of few rows, and on a 2-core host with two threads the difference of the two longest
    (1024 and 512 rows) came out 207 ns a row in one timing, 58 in the next. None with fewer
    than three lengths, or where the working set fits that cache."""
    ladder = sorted((ob for ob in _ladder(micro) if _row_length(ob)), key=_row_length)
    if len(ladder) < 3 or len({_row_length(ob) for ob in ladder}) != len(ladder):
        return None
    longest = ladder[-1]
    streamed = _streamed_share(longest, cache_bytes, shares)
    if streamed <= 0:
        return None
    costs = []
    for ob in ladder[:-1]:
        rows = float(np.sum(ob.weight_rows))  # type: ignore[arg-type]
        costs.append(max(0.0, (ob.measured_s - longest.measured_s) / (rows * streamed)) * 1e9)
    return WeightRowCosts(row_bytes=[_row_length(ob) for ob in ladder], ns=[*costs, 0.0])


def _row_length(ob: Observation) -> float:
    """Bytes of a stored row of a one-row product's weight: its bytes over its stored rows (0 where
    it states no rows)."""
    rows = float(np.sum(ob.weight_rows)) if ob.weight_rows is not None else 0.0
    return float(np.sum(ob.weight_bytes)) / rows if rows and ob.weight_bytes is not None else 0.0


def pair_memory_rate(micro: list[Observation], row_s: float, cache_bytes: float = 0.0,
                     costs: WeightRowCosts | None = None, shares: CacheShares | None = None) -> float | None:
    """Seconds per byte a weight streamed from memory takes, from the pair of one-row products
    among ``micro`` (:data:`MATVEC_PAIR`): the product over fewer rows, less its stored rows at
    ``row_s`` each (:func:`weight_row_cost`, on the share streamed past a cache of ``cache_bytes``)
    and less one bare kernel call (the chain of kernel calls among ``micro``), over its bytes;
    with ``costs`` (:func:`weight_row_costs`), its rows at the table's cost at their length. None
    when the pair is missing, its working set fits that cache, or nothing is left.

    Fitted on the models instead, the rate came out 12.3-16.4 GB/s in repeated calibrations on a
    2-core AMD host (8-9 MB cache), where one-row products over 6.3 MB weights cycled from 96 MB
    (one thread) streamed their bytes at 17-26 GB/s once their rows' cost was taken off, and the
    products of ``builtin:tiny-llama-large`` inside `generate` took about their cycled time: the
    calibration models' other terms absorbed the difference, and the decode of models well past
    the cache was priced up to about 30 % above what it measured."""
    pair = _pair(micro, cache_bytes, shares)
    if pair is None:
        return None
    _, b, streamed = pair
    chain = next((ob for ob in micro if ob.phase == "micro" and ob.extra_launches and not np.any(ob.bytes_)), None)
    call_s = chain.measured_s / chain.extra_launches if chain is not None else 0.0
    if costs is not None and _row_length(b):
        row_s = float(costs.at(_row_length(b))) * 1e-9
    left = b.measured_s - row_s * float(np.sum(b.weight_rows)) * streamed - call_s  # type: ignore[arg-type]
    nbytes = float(np.sum(b.bytes_))
    return left / nbytes if left > 0 and nbytes > 0 else None


#: (batch, prompt tokens, new tokens). A batch-1 prompt of 48 tokens sits between the 16 and the
#: 128 rows of the others' prefills, where the small-M slowdown changes fastest: without it that
#: slowdown, the repacking rate and the prefill's fixed cost were told apart only by the 16-token
#: prefill, and four one-thread calibrations on one host settled at four different splits
#: (`matmul_half_rows` 0-24.5), their predictions of families they never saw up to 16.8 % apart;
#: with it at 27-36 rows in four more, up to 11.0 %
DEFAULT_CALIBRATION_GRID = [(1, 16, 16), (1, 48, 8), (1, 128, 16), (4, 32, 16), (8, 128, 8), (2, 256, 8)]
# one configuration at four depths (per-layer vs per-pass costs, 20 to 100 MB of weights per pass:
# the cache term); narrowed to width 64 at two depths, where the framework's fixed costs
# dominate, which pins the per-operation overhead apart from the bytes; and at width 256, between
# the two, where neither dominates (most small models a user predicts lie there: without it the
# split between fixed costs and bytes is extrapolated, and two calibrations disagree more)
# and two other families (:data:`SMALL_FAMILY_CONFIGS`): each is left out of one refit and
# predicted by it, which is how far the calibration misses a family it never saw (the intervals)
DEFAULT_CALIBRATION_MODELS = ["builtin:tiny-llama-medium", "builtin:tiny-llama-medium@layers=4",
                              "builtin:tiny-llama-medium@layers=2", "builtin:tiny-llama-medium@layers=1",
                              "builtin:tiny-llama-medium@hidden=256@layers=4",
                              "builtin:tiny-llama-medium@hidden=64@layers=8",
                              "builtin:tiny-llama-medium@hidden=64@layers=2",
                              "type:gpt_bigcode", "type:codegen"]


#: The fixed workload timed right before and after every calibration configuration (and every
#: measured configuration of the accuracy benchmark): the machine's speed at that moment.
REFERENCE_MODEL = "builtin:tiny-llama-medium@layers=2"
REFERENCE_SHAPE = (1, 16, 8)
#: how a calibration's record names the reference workload this version times
REFERENCE_LABEL = f"{REFERENCE_MODEL} batch {REFERENCE_SHAPE[0]} in {REFERENCE_SHAPE[1]} out {REFERENCE_SHAPE[2]}"
#: The memory reference, timed right after the reference workload where asked (:class:`ReferenceTimer`):
#: one-row linear products over copies of one fp32 weight, 128 MiB in all (four times the largest
#: last-level cache of the hosts seen), each read once per call as a decode step reads its model's
#: weights. On a shared host the memory's rate and the rest's moved apart between calibrations
#: minutes apart (the rest 30 % and the memory 1 %; the rest 1 % and the memory 17 %), which the
#: reference workload alone cannot follow.
MEMORY_REFERENCE_WEIGHT = (2048, 2048)
MEMORY_REFERENCE_COPIES = 8
MEMORY_REFERENCE_LABEL = (f"one-row linear products over {MEMORY_REFERENCE_COPIES} fp32 "
                          f"{list(MEMORY_REFERENCE_WEIGHT)} weights, streamed")
#: The compute reference, timed beside the memory reference where asked: a linear product of
#: 128 rows over one fp32 weight that lies in cache, the kind of product a prefill runs; its
#: speed is the cores', not the memory's or the framework's.
COMPUTE_REFERENCE_SHAPE = (128, 2048, 1024)  # rows, output features, input features
COMPUTE_REFERENCE_LABEL = (f"a linear product of {COMPUTE_REFERENCE_SHAPE[0]} rows over one fp32 "
                           f"{list(COMPUTE_REFERENCE_SHAPE[1:])} weight, in cache")
#: a calibration's median pass should rest on three passes within this many percent of each
#: other (:func:`passes_settled`); more passes are run until it does (up to ``max_passes``)
PASS_SETTLE_PCT = 3.0
#: round-robin passes a calibration runs (``perfsdk calibrate --passes``), and up to how many while
#: the median pass is not settled (``--max-passes``). On a shared 2-core host one configuration's
#: time, divided by the reference timed around it, still scattered 4-11 % (standard deviation) from one
#: measurement to the next, and nothing within a measurement averaged it away (nine calls instead
#: of three scattered as much; no other reference, nor a blend of three, followed it closer): what
#: narrows a configuration's median is more passes. Two calibrations of three to six passes
#: predicted the unseen families of the accuracy benchmark 3.5-9.0 % apart at one reference level
#: (five runs), of six passes 2.8-5.4 % (five runs; a calibration about 5 minutes instead of 3-4).
DEFAULT_PASSES = 6
DEFAULT_MAX_PASSES = 9


class ReferenceTimer:
    """Times the reference workload (:data:`REFERENCE_MODEL` at :data:`REFERENCE_SHAPE`) on
    demand, so that other timings can be expressed relative to the machine's speed of the moment.

    :meth:`around` times a measurement between two reference timings (the reference timed after
    one measurement is the one before the next) and returns it with its index. The machine's
    speed around measurement ``i`` is :meth:`level_at` ``i``: the median of the four reference
    times nearest to it (two before, two after), so that one reference call that met a busy
    moment does not move it. A measurement divided by its level and multiplied by :attr:`median`
    is in seconds at the machine's typical speed over the whole session: a drift of the
    machine's speed over minutes cancels to first order.

    With ``memory`` (and ``compute``), each timing of the reference is followed by one of the
    memory reference (:data:`MEMORY_REFERENCE_LABEL`; the compute reference,
    :data:`COMPUTE_REFERENCE_LABEL`): the median of ``repeats`` calls, kept in ``memory_times``
    (``compute_times``). The reference workload is a small model whose time is mostly framework
    and arithmetic; a model's weights streamed from memory drift on their own.
    """

    def __init__(self, *, clock: str = "wall", repeats: int = 5, pause_gc: bool = False, model: Any = None,
                 memory: bool = False, compute: bool = False) -> None:
        self.model = model if model is not None else build_random_model(REFERENCE_MODEL)
        self.clock = clock
        self.repeats = repeats
        self.pause_gc = pause_gc
        self.times: list[float] = []
        #: with ``memory``, the memory reference (:data:`MEMORY_REFERENCE_LABEL`) timed after each
        #: reference timing: the median of ``repeats`` calls each time
        self.memory_times: list[float] = []
        self._memory = _memory_workload() if memory else None
        #: with ``compute``, the compute reference (:data:`COMPUTE_REFERENCE_LABEL`) likewise
        self.compute_times: list[float] = []
        self._compute = _compute_workload() if compute else None

    @property
    def label(self) -> str:
        return REFERENCE_LABEL

    def tick(self) -> float:
        """Time the reference once (median of ``repeats`` calls; TTFT + decode), and keep it."""
        warm = 0 if self.times else 1
        m = measure_generate(self.model, *REFERENCE_SHAPE, repeats=self.repeats, warmup=warm, label="reference",
                             estimator="median", clock=self.clock, pause_gc=self.pause_gc)
        t = m.ttft_s + m.decode_s
        self.times.append(t)
        if self._memory is not None:
            self.memory_times.append(_timed(self._memory, self.repeats, self.clock, warm=warm))
        if self._compute is not None:
            self.compute_times.append(_timed(self._compute, self.repeats, self.clock, warm=warm))
        return t

    def around(self, fn: Any) -> tuple[Any, int]:
        """``(fn(), index)``: ``fn`` timed between two reference timings; ``index`` is that of the
        reference right before it (see :meth:`level_at`)."""
        if not self.times:
            self.tick()
        index = len(self.times) - 1
        out = fn()
        self.tick()
        return out, index

    def level_at(self, index: int) -> float:
        """The reference time around the measurement taken after reference ``index``: the median
        of references ``index - 1`` to ``index + 2``."""
        near = self.times[max(0, index - 1): index + 3]
        return float(statistics.median(near))

    @property
    def median(self) -> float:
        return float(statistics.median(self.times))

    @property
    def memory_median(self) -> float | None:
        """The memory reference's median time over every timing; None when it was not timed."""
        return float(statistics.median(self.memory_times)) if self.memory_times else None

    @property
    def compute_median(self) -> float | None:
        """The compute reference's median time over every timing; None when it was not timed."""
        return float(statistics.median(self.compute_times)) if self.compute_times else None

    def levels(self, tracking: float = 1.0) -> list[float]:
        """The machine's level around every measurement (:meth:`level_at`) relative to the
        reference's median, to the power ``tracking`` (:func:`reference_tracking`): what that
        level does to a configuration's time."""
        med = self.median
        return [(self.level_at(i) / med) ** tracking for i in range(max(0, len(self.times) - 1))]


def _memory_workload() -> Any:
    """The memory reference's call (:data:`MEMORY_REFERENCE_WEIGHT`): every weight read once."""
    import torch

    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(*MEMORY_REFERENCE_WEIGHT, generator=g) for _ in range(MEMORY_REFERENCE_COPIES)]
    x = torch.randn(1, MEMORY_REFERENCE_WEIGHT[1], generator=g)
    linear = torch.nn.functional.linear

    def call() -> None:
        with torch.inference_mode():
            for w in ws:
                linear(x, w)

    return call


def _compute_workload() -> Any:
    """The compute reference's call (:data:`COMPUTE_REFERENCE_SHAPE`)."""
    import torch

    rows, out, inner = COMPUTE_REFERENCE_SHAPE
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(out, inner, generator=g), torch.randn(rows, inner, generator=g)
    linear = torch.nn.functional.linear

    def call() -> None:
        with torch.inference_mode():
            linear(x, w)

    return call


def _timed(fn: Any, repeats: int, clock: str, *, warm: int = 0, estimator: str = "median") -> float:
    """The median (``estimator`` ``min``: the fastest) time of ``repeats`` calls of ``fn``, after
    ``warm`` untimed ones, on ``clock`` (``cpu``: this process's CPU time; else the wall clock)."""
    clk = time.process_time_ns if clock == "cpu" else time.perf_counter_ns
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = clk()
        fn()
        ts.append((clk() - t0) / 1e9)
    return float(min(ts)) if estimator == "min" else float(statistics.median(ts))


#: how long :func:`at_current_speed` times the reference workload for, at least: on a shared
#: two-core machine the medians of three timings (0.6 s) taken within the same ten seconds stood
#: 15-45 % apart, of fifteen (3 s) 3-23 %
RETIME_MIN_S = 3.0


def at_current_speed(profile: HardwareProfile, *, ticks: int = 5, min_time_s: float = RETIME_MIN_S,
                     max_ticks: int = 60, timer: ReferenceTimer | None = None) -> tuple[HardwareProfile, float, str]:
    """A profile calibrated on this host, brought to the machine's speed of the moment.

    The reference workload the calibration was normalised by is timed again, with the
    calibration's torch threads and clock: at least ``ticks`` timings (each the median of its
    calls) and for at least ``min_time_s`` seconds (at most ``max_ticks`` timings); their median
    is the machine's speed now. Every time the profile prices is multiplied by
    :meth:`~perfsdk.hardware.profile.CalibrationRecord.speed_factors`: a machine that runs slower
    now than while it was calibrated gets predictions that are slower by as much as its
    calibrated work followed the reference, the memory traffic by its own exponent where the
    calibration told it apart (:func:`term_tracking`); where the calibration timed the memory
    reference this version times (``memory_reference``), it is timed again after each timing of
    the reference and the memory traffic is scaled by its ratio instead, in proportion; the
    arithmetic likewise by the compute reference's. The intervals follow, widened by how far a window of
    a few seconds strays from the machine's level (:func:`_retimed_levels`): a re-timing is such
    a window, and the run it predicts another. Returns the profile, that
    factor and the sentence that says what was found. ``ValueError`` when it cannot be done: no
    calibration, a calibration without the reference (one from stored runs), another host,
    another reference than the one this version times, or a calibration that did not record its
    threads."""
    from perfsdk.fmt import fmt_s
    from perfsdk.simulation.calibration.fit import this_host

    cal = profile.calibration
    if cal is None or cal.reference_s is None or cal.reference is None:
        raise ValueError(f"profile {profile.name}: its speed can only be re-timed from a calibration on this host "
                         "with the reference workload (perfsdk calibrate; not --from-store, not a spec sheet)")
    host = this_host()
    if cal.host != host:
        raise ValueError(f"profile {profile.name}: calibrated on {cal.host}, and this machine is {host}: the "
                         "reference workload timed here says nothing about that machine's speed")
    if cal.reference != REFERENCE_LABEL:
        raise ValueError(f"profile {profile.name}: its calibration timed the reference {cal.reference!r}; this "
                         f"version times {REFERENCE_LABEL!r}: calibrate again")
    if cal.threads is None:
        raise ValueError(f"profile {profile.name}: its calibration did not record how many torch threads it ran "
                         "with, and the reference's time depends on it: calibrate again")
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(cal.threads)
        # the side references too where the calibration timed the ones this version times
        memory = cal.memory_reference_s is not None and cal.memory_reference == MEMORY_REFERENCE_LABEL
        compute = cal.compute_reference_s is not None and cal.compute_reference == COMPUTE_REFERENCE_LABEL
        timer = timer or ReferenceTimer(clock=cal.clock or "wall", memory=memory, compute=compute)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < max(1, ticks) or (time.perf_counter() - start < min_time_s and len(times) < max_ticks):
            times.append(timer.tick())
        spent = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    now = float(statistics.median(times))
    memory_now = getattr(timer, "memory_median", None) if memory else None
    compute_now = getattr(timer, "compute_median", None) if compute else None
    factor, memory_factor, compute_factor = cal.speed_factors(now, memory_now, compute_now)
    apart = cal.rest_tracking is not None and cal.memory_tracking is not None
    b = cal.rest_tracking if apart else cal.reference_tracking if cal.reference_tracking is not None else 1.0
    # the window's stray drawn from the reference's levels, combined with what the intervals draw
    # the run's own level from (one run's scatter where the calibration kept it)
    drawn = "run_scatter" if cal.run_scatter else "levels"
    levels, (lo, hi) = _retimed_levels(cal.levels, getattr(cal, drawn))
    slowed = profile.slower_by(factor, memory_factor, compute_factor)
    assert slowed.calibration is not None
    slowed = slowed.model_copy(update={"calibration": slowed.calibration.model_copy(update={drawn: levels})})
    sides = [(name, f"{name}'s x {f:.3f} (the {kind} reference took {fmt_s(t_now)} against {fmt_s(t_cal)})")
             for name, kind, f, t_now, t_cal in (
                 ("the memory traffic", "memory", memory_factor, memory_now, cal.memory_reference_s),
                 ("the arithmetic", "compute", compute_factor, compute_now, cal.compute_reference_s))
             if t_now is not None and t_cal is not None]
    but = f" but {' and '.join(name for name, _ in sides)}" if sides else ""
    said_sides = "".join(f", {text}" for _, text in sides)
    if memory_now is None and apart:
        said_sides = (f", the memory traffic's x {memory_factor:.3f} (to the power {cal.memory_tracking:.2f}, the one "
                      "the calibration's memory-bound phases followed it with)") + said_sides
    said = (f"at this machine's speed now: the reference workload took {fmt_s(now)} against {fmt_s(cal.reference_s)} "
            f"when {profile.name} was calibrated; every predicted time{but} x {factor:.3f} (that ratio to "
            f"the power {b:.2f}){said_sides}; the median of {len(times)} timings over {spent:.1f} s, from "
            f"{fmt_s(min(times))} to {fmt_s(max(times))}")
    if cal.levels:
        said += (f"; a window of seconds strays from the machine's level by {100 * (lo - 1):+.1f} / "
                 f"{100 * (hi - 1):+.1f} % (90 %, as the calibration's reference did), which the intervals include")
    return slowed, factor, said


def _retimed_levels(levels: list[float], run: list[float] | None = None, *,
                    keep: int = 1000) -> tuple[list[float], tuple[float, float]]:
    """The machine's levels for a profile brought to the speed of the moment, and how far the
    re-timed window may stray (the central 90 %, as a factor).

    A re-timing is a window of a few seconds, and on a shared machine such a window strays from
    the machine's level over minutes about as far as the calibration's own levels do (each the
    reference's median over a few seconds, relative to its median over the whole calibration):
    on a shared two-core machine the medians of three-second windows a few seconds apart stood
    up to 23 % apart, and two ``perfsdk simulate --at-current-speed`` calls seconds apart put the
    same prediction up to 24 % apart. So the stray is drawn
    from ``1 / levels`` and the run's own level from ``run`` (one run's scatter, :func:`run_scatter`;
    ``levels`` where not given); every combination is one level, thinned to ``keep`` evenly spaced
    quantiles. No levels: nothing to draw from, ``run`` unchanged."""
    if not levels:
        return list(run or []), (1.0, 1.0)
    base = np.asarray(run or levels, dtype=float)
    stray = 1.0 / np.asarray(levels, dtype=float)
    lo, hi = (float(x) for x in np.quantile(stray, [0.05, 0.95]))
    combined = (base[:, None] * stray[None, :]).reshape(-1)
    if combined.size > keep:
        combined = np.quantile(combined, np.linspace(0.0, 1.0, keep))
    return [float(x) for x in combined], (lo, hi)


def scaled(m: Measurement, factor: float) -> Measurement:
    """``m`` with its times multiplied by ``factor`` (a drift normalisation)."""
    steps = [t * factor for t in m.decode_steps_s] if m.decode_steps_s is not None else None
    return Measurement(model=m.model, batch_size=m.batch_size, input_tokens=m.input_tokens,
                       output_tokens=m.output_tokens, ttft_s=m.ttft_s * factor, decode_s=m.decode_s * factor,
                       repeats=m.repeats, decode_steps_s=steps,
                       outside_step_s=m.outside_step_s * factor if m.outside_step_s is not None else None)


def median_of(runs: list[Measurement]) -> Measurement:
    """One measurement of a configuration from its passes: the median TTFT and decode time."""
    first = runs[0]
    outside = [m.outside_step_s for m in runs if m.outside_step_s is not None]
    return Measurement(model=first.model, batch_size=first.batch_size, input_tokens=first.input_tokens,
                       output_tokens=first.output_tokens, ttft_s=float(statistics.median(m.ttft_s for m in runs)),
                       decode_s=float(statistics.median(m.decode_s for m in runs)),
                       repeats=sum(m.repeats for m in runs),
                       outside_step_s=float(statistics.median(outside)) if outside else None)


def _centred(raw: dict[Any, list[tuple[Any, float]]]) -> list[tuple[Any, int, list[float], list[float]]]:
    """For each configuration and phase of ``raw`` (see :func:`reference_tracking`) with two
    passes or more: its key, the phase's index, and the log levels and log times of its passes,
    each centred on its mean."""
    out = []
    for key, runs in raw.items():
        if len(runs) < 2:
            continue
        xs = [math.log(adj) for _, adj in runs]
        mx = sum(xs) / len(xs)
        phases = [(m.ttft_s, m.decode_s) if isinstance(m, Measurement) else tuple(m) for m, _ in runs]
        for j in range(len(phases[0])):
            ys = [math.log(ph[j]) for ph in phases if ph[j] > 0]
            if len(ys) != len(xs):
                continue
            my = sum(ys) / len(ys)
            out.append((key, j, [x - mx for x in xs], [y - my for y in ys]))
    return out


def reference_tracking(raw: dict[Any, list[tuple[Any, float]]]) -> float:
    """How closely the configurations' times follow the reference workload's: the exponent
    ``b`` of ``time ∝ level ** b``, estimated from the passes (``raw``: per configuration, each
    pass as ``(times, level)``, ``times`` a :class:`Measurement` or a tuple of seconds).

    Each configuration's and phase's log times and the log levels of their passes are centred on
    their means, and ``b`` is the least-squares slope of the one on the other over all of them
    (the control-variate coefficient): 1 when the reference moves exactly as the configurations
    do, 0 when its movements are its own noise. Dividing by ``level ** b`` then takes out as much
    of the machine's movement as the reference can tell, and adds none of the reference's own
    noise where it cannot (with a fixed ``b = 1``, a reference that swings more than the work it
    stands for makes the normalised times less steady than the raw ones). Clipped to [0, 1];
    1 when nothing can be estimated (one pass, or a level that never moved)."""
    sxy = sxx = 0.0
    for _, _, xs, ys in _centred(raw):
        sxy += sum(x * y for x, y in zip(xs, ys))
        sxx += sum(x * x for x in xs)
    if sxx <= 0:
        return 1.0
    return min(1.0, max(0.0, sxy / sxx))


#: :func:`term_tracking` tells the two exponents apart only where the memory shares of the
#: phases spread enough: one minus the squared correlation of its two regressors at least this
TERMS_APART_MIN = 0.05
#: ... and where the two exponents differ by at least this many standard errors of their difference
TERMS_APART_SE = 2.0


def term_tracking(raw: dict[Any, list[tuple[Any, float]]],
                  shares: dict[Any, tuple[float, ...]]) -> tuple[float, float] | None:
    """:func:`term_fit`'s exponents (None: not told apart)."""
    return term_fit(raw, shares)[0]


def term_fit(raw: dict[Any, list[tuple[Any, float]]],
             shares: dict[Any, tuple[float, ...]]) -> tuple[tuple[float, float] | None, str]:
    """The exponents ``(b_rest, b_memory)`` that the work other than memory traffic and the
    memory traffic follow the reference workload with, apart.

    A phase whose predicted time is the share ``m`` memory traffic (``shares``: per
    configuration of ``raw``, each phase's share, :meth:`~perfsdk.simulation.calibration.fit.
    FitResult.memory_share`) follows the reference with ``b_rest * (1 - m) + b_memory * m``: the
    centred log times of every phase's passes (as :func:`reference_tracking` takes them) are
    fitted on ``(1 - m) * x`` and ``m * x`` (``x`` the centred log level) by least squares with
    both exponents in [0, 1]. The reference workload is a small model whose time is mostly
    compute and fixed costs; a machine whose memory slows apart from its cores moves the
    memory-bound phases (a large model's decode at batch 1) by other amounts than the reference,
    and one exponent for all of them carries the reference's movement onto them. None where
    the phases' shares do not spread enough to tell the two apart (:data:`TERMS_APART_MIN`),
    where the two exponents differ by less than :data:`TERMS_APART_SE` standard errors of their
    difference (the timings' own noise could make them that different; one exponent for all
    then, :func:`reference_tracking`), or nothing moved. Returns them (or None) and a sentence
    that says what was found."""
    suu = suv = svv = suy = svy = syy = 0.0
    points = groups = 0
    for key, j, xs, ys in _centred(raw):
        share = shares.get(key)
        if share is None or j >= len(share):
            continue
        m = min(1.0, max(0.0, float(share[j])))
        groups, points = groups + 1, points + len(xs)
        for x, y in zip(xs, ys):
            u, v = (1.0 - m) * x, m * x
            suu, suv, svv, suy, svy = suu + u * u, suv + u * v, svv + v * v, suy + u * y, svy + v * y
            syy += y * y
    if suu <= 0 or svv <= 0:
        return None, "not told apart: nothing to fit (one pass, or no phase with memory traffic or without)"
    spread = max(0.0, 1.0 - suv * suv / (suu * svv))
    if spread < TERMS_APART_MIN:
        return None, (f"not told apart: the phases' shares of memory traffic spread too little ({spread:.3f} "
                      f"against {TERMS_APART_MIN})")

    def sse(a: float, b: float) -> float:
        return syy + suu * a * a + 2 * suv * a * b + svv * b * b - 2 * (suy * a + svy * b)

    det = suu * svv - suv * suv
    a, b = (suy * svv - svy * suv) / det, (svy * suu - suy * suv) / det
    # the variance of a - b: the residuals' (one degree of freedom lost to each phase's centring)
    # times that of the difference in the normal equations' inverse
    dof = points - groups - 2
    if dof <= 0:
        return None, "not told apart: too few passes"
    resid = max(0.0, sse(a, b)) / dof
    se = math.sqrt(resid * (suu + svv + 2 * suv) / det)
    found = f"the memory traffic {b:.2f}, the rest {a:.2f} (their difference's standard error {se:.2f})"
    if abs(a - b) < TERMS_APART_SE * se:
        return None, f"not told apart: {found}, less than {TERMS_APART_SE:g} standard errors apart"
    if 0.0 <= a <= 1.0 and 0.0 <= b <= 1.0:
        return (a, b), f"told apart: {found}"
    # the least squares inside the box lie on one of its edges: each edge's best point, the least kept
    edges = [(e, min(1.0, max(0.0, (svy - suv * e) / svv))) for e in (0.0, 1.0)]
    edges += [(min(1.0, max(0.0, (suy - suv * e) / suu)), e) for e in (0.0, 1.0)]
    best = min(edges, key=lambda ab: sse(*ab))
    return best, f"told apart: {found}; in [0, 1], the memory traffic {best[1]:.2f}, the rest {best[0]:.2f}"


def normalised_runs(raw: dict[Any, list[tuple[Measurement, float]]], reference_s: float,
                    tracking: float = 1.0) -> dict[Any, list[Measurement]]:
    """Each pass of each configuration divided by its adjacent reference time and brought back
    to seconds with ``reference_s`` (the reference's median), both to the power ``tracking``
    (:func:`reference_tracking`)."""
    return {key: [scaled(m, (reference_s / adj) ** tracking) for m, adj in runs] for key, runs in raw.items()}


def pass_order(configs: list[Any], p: int, seed: int = 0) -> list[Any]:
    """The order in which pass ``p`` measures ``configs``: a fresh shuffle for every pass
    (reproducible from ``seed`` and ``p``), so that no model's configurations are measured back to
    back in every pass. In model order, a stretch in which the machine ran slower than the
    reference around it showed falls on one model's configurations of that pass together, and
    moves the terms of the fit that model pins (the narrow models: the per-call cost) as a whole;
    shuffled, it falls on configurations of several models and averages out in the fit. On a
    2-core host the excess was small either way: normalised, a model's mean over its five
    configurations moved from pass to pass by 4.1-6.4 % in model order and 4.6-6.5 % shuffled,
    against 3.6-4.6 % and 3.6-5.5 % that the configurations' own noise accounts for (the slow
    stretches the reference misses are mostly shorter than one configuration); the shuffle costs
    nothing."""
    order = list(configs)
    random.Random(f"{seed}:{p}").shuffle(order)
    return order


def calibrate_here(models: list[str], grid: list[tuple[int, int, int]] | None = None, *, repeats: int = 3,
                   threads: int | None = None, fit_step_overhead: bool = True, micro: bool = True,
                   progress: Any = None, clock: str = "wall", passes: int = DEFAULT_PASSES,
                   min_time_s: float = 0.2, normalise: bool = True, estimator: str | None = None,
                   pause_gc: bool = False, replicates: int = 40, max_passes: int | None = None,
                   settle_pct: float = PASS_SETTLE_PCT, cache: bool = False,
                   seed: int = 0, measured_step: bool = True,
                   hold_memory_rate: bool = False) -> tuple[FitResult, list[Measurement]]:
    """Measure ``models`` (random weights) on a grid of (batch, input tokens, output tokens),
    plus the micro-kernels (``micro``), and fit.

    Every configuration is measured ``repeats`` times (after a warm-up call; more while under
    ``min_time_s``) in each of ``passes`` round-robin passes over all of them; each pass keeps the
    median call (``estimator``; by default the median on the wall clock, the fastest call on the CPU
    clock). On the wall clock with the median (the defaults) the calls run
    inside a perfsdk session (:func:`measure_in_session`), so the profile predicts what a user's
    run measures, session included; otherwise in a bare loop (:func:`measure_generate`: ``clock``
    ``cpu`` times process CPU time, ``estimator`` ``min`` keeps the fastest call, ``pause_gc``).

    With ``normalise``, the reference workload (:class:`ReferenceTimer`) is timed right before
    and after every configuration; each pass of a configuration is divided by the machine's level
    around it (:meth:`ReferenceTimer.level_at`) and multiplied by the reference's median over the
    whole calibration, both to the power the passes themselves show the configurations follow
    the reference with (:func:`reference_tracking`), so a drift of the machine's speed cancels to
    first order without the reference's own noise added. The configuration's
    time is the median over its passes. The drift is reported both ways (``drift_pct`` raw,
    ``normalised_drift_pct`` after normalising).

    The cache size is measured by the micro-kernels' working sets (:func:`measured_cache`) and
    held; its rate is fitted with the others (``cache_note`` says what became of it). With
    ``cache`` a size is chosen on a grid by the models' fit instead and kept only where it also
    predicts the models left out of the fit better (:func:`~perfsdk.simulation.calibration.fit.
    checked_cache`): two calibrations of one machine chose differently that way (a 16 MB cache in
    one, none in the other) and then predicted the same other families 5-20 % apart.

    With ``max_passes`` above ``passes``, more passes are run, one at a time up to ``max_passes``,
    while the median pass does not yet rest on three passes that agree within ``settle_pct``
    percent (:func:`passes_settled`, on the normalised passes): a stretch in which the machine
    ran slower than the reference shows is then outvoted instead of moving the median. Each pass
    measures the configurations in its own shuffled order (:func:`pass_order`).

    With ``measured_step`` (and ``fit_step_overhead``), the fixed cost of a forward pass is the
    time the measured decode steps spent outside the model's forward (:func:`measure_in_session`;
    the median over every pass of every configuration, normalised like them), held in the fit
    rather than fitted (:func:`measured_step_cost`): fitted, it traded with the per-call cost and
    moved 0.22-0.94 ms from one calibration to the next on a 2-core host, and the batch-1 decode of
    small models with it, while the time outside the forward read 0.23-0.41 ms.

    With ``hold_memory_rate``, the memory's rate is the one the pair of one-row products streams
    at (:func:`pair_memory_rate`), held in the fit; by default it is fitted on the models (see
    :func:`fit_with_micro` for why).

    The fit then keeps what it needs to state its own uncertainty: ``replicates`` bootstrap
    refits over configurations and passes, every configuration's errors when its model is left
    out of the fit, and the reference's levels (see
    :class:`~perfsdk.hardware.profile.CalibrationRecord`).
    """
    import torch

    from perfsdk.simulation.calibration.fit import (ConfigurationSamples, bootstrap_coefficients, checked_cache,
                                                    keep_held_out)
    from perfsdk.simulation.costmodel import warmup_factor

    if threads:
        torch.set_num_threads(threads)
    if estimator is None:  # what a run reads on the wall clock; the fastest call of an unloaded process on the CPU clock
        estimator = "median" if clock == "wall" else "min"
    built = {spec: build_random_model(spec) for spec in models}
    configs = [(spec, b, i, o) for spec in models for b, i, o in (grid or DEFAULT_CALIBRATION_GRID)]
    ref = ReferenceTimer(clock=clock, pause_gc=pause_gc, memory=True, compute=True) if normalise else None
    raw: dict[tuple[str, int, int, int], list[tuple[Measurement, int]]] = {key: [] for key in configs}
    # the micro-kernels, timed before the first pass and after every pass (between reference
    # timings when normalising): (observations, index of the reference right before them)
    micro_runs: list[tuple[list[Observation], int]] = []

    def time_micro() -> None:
        if not micro:
            return
        if ref is not None:
            micro_runs.append(ref.around(lambda: micro_observations(clock=clock, estimator=estimator)))
        else:
            micro_runs.append((micro_observations(clock=clock, estimator=estimator), -1))

    def normalised() -> tuple[float | None, dict[Any, list[Measurement]]]:
        """The tracking exponent of the passes so far, and the passes normalised by it."""
        if ref is None:
            return None, {k: [m for m, _ in v] for k, v in raw.items()}
        leveled = {k: [(m, ref.level_at(i)) for m, i in v] for k, v in raw.items()}
        tracking = reference_tracking(leveled)
        return tracking, normalised_runs(leveled, ref.median, tracking)

    def run_pass(p: int) -> None:
        for key in pass_order(configs, p, seed):
            spec, b, i, o = key

            def one() -> Measurement:
                if clock == "wall" and estimator == "median":
                    return measure_in_session(built[spec], b, i, o, calls=repeats, label=spec, seed=p,
                                              min_time_s=min_time_s)
                return measure_generate(built[spec], b, i, o, repeats=repeats, label=spec, clock=clock, seed=p,
                                        min_time_s=min_time_s, estimator=estimator, pause_gc=pause_gc)

            if ref is not None:
                m, index = ref.around(one)
            else:
                m, index = one(), -1
            raw[key].append((m, index))
            if progress is not None and p == 0:
                progress(m)
        time_micro()

    time_micro()
    done = 0
    while done < max(1, passes):
        run_pass(done)
        done += 1
    tracking, runs = normalised()
    while done < (max_passes or 0) and not passes_settled(pass_levels([runs[key] for key in configs]), settle_pct):
        run_pass(done)
        done += 1
        tracking, runs = normalised()
    ref_s = ref.median if ref is not None else 1.0
    timed = median_micro(micro_runs, ref, ref_s, tracking if tracking is not None else 1.0)
    merge = _best_of if estimator == "min" else median_of
    meas = [merge(runs[key]) for key in configs]
    # the first decode steps run slower than the rest: measured on the passes' own steps, and
    # every decode brought to the steady step the cost model prices
    warmup = measured_warmup([m for key in configs for m in runs[key]])
    samples: list[ConfigurationSamples] = []
    for key, m in zip(configs, meas):
        phase_obs = captured_observations_for(built[key[0]].config, steady_decode(m, warmup))
        per_pass = [[r.ttft_s for r in runs[key]],
                    [r.decode_s / warmup_factor(warmup, r.output_tokens - 1) for r in runs[key]]][: len(phase_obs)]
        samples.append(ConfigurationSamples(model=key[0], observations=phase_obs, per_pass=per_pass,
                                            width=getattr(built[key[0]].config, "hidden_size", None),
                                            family=getattr(built[key[0]].config, "model_type", None)))
    observed = [ob for c in samples for ob in c.observations]
    step_s = measured_step_cost([m for key in configs for m in runs[key]], warmup) if measured_step else None
    held_kw: dict[str, Any] = ({"held": {"step_overhead_s": step_s}}
                               if step_s is not None and fit_step_overhead else {})
    held_kw["hold_memory_rate"] = hold_memory_rate
    if cache:
        result, fixed = fit_with_micro(timed, observed, cache_bytes=CACHE_GRID, fit_step_overhead=fit_step_overhead,
                                       **held_kw)
        # a cache is kept only where it also predicts the models left out of the fit better
        result, fixed = checked_cache(result, fixed, lambda: fit_with_micro(timed, observed, cache_bytes=(0.0,),
                                                                            fit_step_overhead=fit_step_overhead,
                                                                            **held_kw),
                                      samples, fit_step_overhead=fit_step_overhead)
    else:
        # the cache size the working sets measured, held; its rate fitted with the others
        result, fixed = fit_with_micro(timed, observed, fit_step_overhead=fit_step_overhead, **held_kw)
    result.decode_warmup_steps = warmup
    result.drift_pct = pass_drift_pct([[m for m, _ in raw[key]] for key in configs])
    result.run_scatter = run_scatter([[m for m, _ in raw[key]] for key in configs])
    result.passes, result.threads = done, torch.get_num_threads()
    result.clock = "cpu" if clock == "cpu" else "wall"
    if ref is not None:
        result.normalised_drift_pct = pass_drift_pct([runs[key] for key in configs])
        result.levels = ref.levels(tracking if tracking is not None else 1.0)
        result.reference, result.reference_s = ref.label, ref_s
        result.reference_tracking = tracking
        result.memory_reference, result.memory_reference_s = MEMORY_REFERENCE_LABEL, ref.memory_median
        result.compute_reference, result.compute_reference_s = COMPUTE_REFERENCE_LABEL, ref.compute_median
        # the memory traffic's exponent apart from the rest's, by each phase's share of it in this fit
        shares = {key: tuple(result.memory_share(ob) for ob in c.observations) for key, c in zip(configs, samples)}
        apart, result.tracking_note = term_fit({k: [(m, ref.level_at(i)) for m, i in v] for k, v in raw.items()},
                                               shares)
        if apart is not None:
            result.rest_tracking, result.memory_tracking = apart
    result.replicates = bootstrap_coefficients(result, samples, fixed, replicates=replicates, seed=seed,
                                               fit_step_overhead=fit_step_overhead)
    keep_held_out(result, samples, fixed, fit_step_overhead=fit_step_overhead)
    return result, meas


def measured_step_cost(runs: list[Measurement], warmup_steps: float = 0.0) -> float | None:
    """The fixed cost of a forward pass as measured: the median, over ``runs``, of the time a
    decode step spent outside the model's forward (:attr:`Measurement.outside_step_s`), each
    brought to the steady step like its decode (:func:`steady_decode`). None where no run timed it."""
    from perfsdk.simulation.costmodel import warmup_factor

    per_step = [m.outside_step_s / warmup_factor(warmup_steps, m.output_tokens - 1) for m in runs
                if m.outside_step_s is not None and m.output_tokens > 1]
    return max(0.0, float(statistics.median(per_step))) if per_step else None


def median_micro(runs: list[tuple[list[Observation], int]], ref: ReferenceTimer | None,
                 reference_s: float, tracking: float = 1.0) -> list[Observation]:
    """Each micro-kernel's time over its timings ``runs`` (each with the index of the reference
    timed right before it, -1 without a reference): with ``ref``, every timing is first divided by
    the machine's level around it and brought back to seconds at ``reference_s``, like the
    configurations (a coefficient measured by a micro-kernel and held in the fit must be in the
    same seconds as the fitted ones); then the median. On a 2-core host the cost per stored row,
    timed at the start and the end of five calibrations and the faster kept, came out 67-78 ns:
    the machine ran 10 % slower in some calibrations than in others. ``tracking``: the exponent
    of the level (:func:`reference_tracking`), the configurations' own.

    A micro-kernel read against another (its ``unit``: the layout ladder's products against the
    large product of their inner size, a staircase's against its one-row product) takes that
    one's time times the median of its ratio to it within each timing: the machine's speed moves
    within one timing of the micro-kernels too, and the two medians taken apart can come from
    timings at different speeds. On a 2-core x86 host, five processes each timing the layout
    ladder seven times in a row with two threads read the small-M slowdown at K = 768 ([out, in])
    as 4.0-11.2 rows from the medians taken apart, 8.9-11.0 from the ratios."""
    from dataclasses import replace

    if not runs:
        return []
    out: list[Observation] = []
    for obs in zip(*(r for r, _ in runs)):
        times = [ob.measured_s * ((reference_s / ref.level_at(i)) ** tracking if ref is not None and i >= 0 else 1.0)
                 for ob, (_, i) in zip(obs, runs)]
        out.append(replace(obs[0], measured_s=float(statistics.median(times))))
    index = {ob.label: j for j, ob in enumerate(out)}
    for j, ob in enumerate(out):
        u = index.get(ob.unit) if ob.unit is not None else None
        if u is None or not all(r[u].measured_s > 0 for r, _ in runs):
            continue
        ratio = statistics.median(r[j].measured_s / r[u].measured_s for r, _ in runs)
        out[j] = replace(ob, measured_s=float(out[u].measured_s * ratio))
    return out


def _core_capacity() -> float | None:
    """The level-2 cache of the cores a product runs on: one core's (:func:`core_cache_bytes`)
    times torch's threads."""
    import torch

    core = core_cache_bytes()
    return core * torch.get_num_threads() if core else None


def fit_with_micro(micro: list[Observation], measured: list[Observation], *, core_cache: float | None = None,
                   hold_memory_rate: bool = False, **fit_kw: Any) -> tuple[FitResult, list[Observation]]:
    """Fit ``measured`` with the micro-kernels ``micro``: the streaming one (bytes, no FLOPs)
    only when the fit without it leaves the memory rate unidentified (see
    :func:`micro_observations`). Returns the fit and the micro-kernels it used (what the
    bootstrap and the held-out refits keep in every fit); the fit's ``cache_note`` says what
    became of the cache size the working sets measured, where it held that size. ``core_cache``:
    the level-2 cache of the cores a product runs on (default: this machine's, times torch's
    threads), below which a weight's further passes take the core-cache staircase's share
    (:func:`fast_pack`). The memory's rate is fitted on the models (held at the working sets'
    rate past the cache where most models fit inside it); with ``hold_memory_rate`` it is the
    rate the pair of one-row products streams at (:func:`pair_memory_rate`), held beside their
    cost per stored row. Not the default: in three accuracy runs on a 2-core AMD host, each with
    one calibration of either kind on the same measurements, the held rate put the decode of
    ``builtin:tiny-llama-large`` and of three 124-160M-parameter shapes within 10 % at batch 1
    (fitted: 6-31 % over), but the nine smaller families' worst came out 30.6 and 34.7 % in two of
    them (fitted: 27.9 and 24.0), the decode of `gpt2`, `qwen2-tied`, `opt` and `falcon` at batch 4
    under by 7-15 points more: inside `generate` their products stream slower than the pair does
    (`gpt2`'s 12.6 MB output product at 10.3 GB/s, the pair at 22.6)."""
    from perfsdk.simulation.calibration.fit import PACK_ROWS_GRID

    pack = repacking_choice(micro, tuple(fit_kw.get("pack_rows") or PACK_ROWS_GRID))
    if pack is not None:
        # measured by the staircase and held: chosen on the grid by the models' fit, it flipped
        # between 1 and 2 from one calibration to the next
        fit_kw["pack_rows"] = (pack[0],)
    capacity = core_cache if core_cache is not None else _core_capacity()
    pack_fast = fast_pack(micro, pack[0], capacity) if pack else None
    # a product of a few rows: its one-row time times the staircase's ratio (only beside a
    # repacking size P, which keeps the small-M slowdown off the one-row product), up to the
    # staircase's last count, held at 4P's ratio past 4P rows. From 4P rows the blocked kernel runs
    # on both threads, and its time there follows the host's moment: on a 2-core AMD host with two
    # threads, the staircase's 6-16 rows took 1.1-1.4 times the one-row time in one calibration
    # and 1.3-1.6 in the next, where 2-4 rows read alike in every one; inside `generate` the
    # products of 8 rows took 0.8-1.2 times their time at 4 rows, where the fitted small-M
    # slowdown priced most of them at 0.6-0.9 times their 4-row price
    few = few_row_ratios(micro, capacity, held_from=4 * pack[0]) if pack is not None and pack[0] else None
    for ob in measured:  # the further passes over a weight that stays in the cores' caches
        ob.pack_fast = pack_fast
        ob.few_rows = few
    micro = [ob for ob in micro if not ob.label.startswith((_STAIRCASE, _FAST_STAIRCASE, _SHAPES, _FAST_SHAPES))]
    levels = cache_levels(micro)
    cache = measured_cache(micro)
    past = memory_past_cache(micro)
    shares = cache_shares(micro, cache) if cache and "cache_bytes" not in fit_kw else None
    past_held = past is not None and cache and "cache_bytes" not in fit_kw and _models_inside(cache, measured)
    if cache is not None:
        micro = [ob for ob in micro if not ob.label.startswith(_CACHE)]
    # measured by the working sets and held (none where they are missing) unless the caller
    # offers sizes: chosen on a grid by the models' fit, it flipped between 16 MB and none from
    # one calibration to the next
    held_cache = "cache_bytes" not in fit_kw
    if held_cache:
        fit_kw["cache_bytes"] = (cache or 0.0,)
    layout_gaps = anchored_on_products(small_m_gaps(micro), measured, pack[0] if pack is not None else 0.0)
    micro = [ob for ob in micro if not ob.label.startswith(_LAYOUT)]  # measures the gaps only
    offered = tuple(fit_kw["cache_bytes"])
    held_cache_bytes = offered[0] if len(offered) == 1 else (cache or 0.0)
    row_s = weight_row_cost(micro, held_cache_bytes, shares)
    row_table: WeightRowCosts | None = None
    memory_origin = "the caller" if "s_per_byte" in (fit_kw.get("held") or {}) else None
    if row_s is not None:
        # measured by the pair, held in every fit, and with ``hold_memory_rate`` the rate its
        # bytes stream at (where the pair's working set lies past the cache held); the pair
        # itself stays out
        # and by the row's length where the ladder measured it: each product's rows weighed by
        # their length's cost over the pair's
        row_table = weight_row_costs(micro, held_cache_bytes, shares) if row_s > 0 else None
        rate = pair_memory_rate(micro, row_s, held_cache_bytes, row_table, shares) if hold_memory_rate else None
        memory_origin = memory_origin or ("the pair" if rate else None)
        fit_kw["held"] = {"s_per_weight_row": row_s, **({"s_per_byte": rate} if rate else {}),
                          **(fit_kw.get("held") or {})}
        micro = [ob for ob in micro if not ob.label.startswith(_PAIR)]
    if past_held and memory_origin is None:
        # most models stream inside the cache and leave the rate past it to the largest ones' last
        # few bytes (fitted on them it came out at 0.2-0.4 times this rate): measured by the
        # working sets past the cache and held
        fit_kw["held"] = {"s_per_byte": past, **(fit_kw.get("held") or {})}
        memory_origin = "the working sets"
    for ob in measured:  # each product takes the gap of its layout and inner size off h
        ob.small_m_gaps = layout_gaps
        ob.row_costs = (row_table, row_s * 1e9) if row_table is not None and row_s else None
        # each phase's bytes and stored rows divided between the cache and memory as the working
        # sets measured the share, not as min(1, cache / bytes)
        ob.cache_shares = shares
    fixed = [ob for ob in micro if not _streams_only(ob)]
    result = fit(fixed + measured, **fit_kw)
    if not result.coefficients["s_per_byte"] > 0 and len(fixed) < len(micro):
        fixed = list(micro)
        result = fit(fixed + measured, **fit_kw)
    result.small_m_gaps = layout_gaps
    result.pack_note = pack[1] + (fast_pack_text(pack_fast) if pack_fast else "") if pack is not None else None
    result.pack_fast = pack_fast
    result.few_rows = few
    result.weight_row_costs = row_table
    result.cache_shares = shares if result.cache_bytes else None
    if held_cache:
        result.cache_note = measured_cache_note(cache, result, levels, memory_origin)
    return result, fixed


def _streams_only(ob: Observation) -> bool:
    """A micro-kernel that moves bytes and computes nothing (the memory-rate anchor)."""
    return ob.phase == "micro" and not np.any(ob.flops) and bool(np.any(ob.bytes_))


def _best_of(runs: list[Measurement]) -> Measurement:
    out = runs[0]
    for m in runs[1:]:
        out = out.merged(m)
    return out


def pass_drift_pct(runs: list[list[Measurement]]) -> float | None:
    """How far the machine's speed moved between round-robin passes, in percent.

    ``runs``: for each configuration, its measurement in each pass (in pass order). Each pass's
    level is the median, over configurations, of its time (TTFT + decode) relative to the same
    configuration's fastest pass; the result is the slowest pass level over the fastest, minus 1.
    A pass that met a busy moment for one configuration barely moves a median; a machine that ran
    slower for a whole pass does. None with fewer than two passes.
    """
    levels = pass_levels(runs)
    if len(levels) < 2:
        return None
    return 100.0 * (max(levels) / min(levels) - 1.0)


def pass_levels(runs: list[list[Measurement]]) -> list[float]:
    """Each round-robin pass's level (see :func:`pass_drift_pct`): the median, over
    configurations, of its time (TTFT + decode) relative to the same configuration's fastest pass."""
    passes = min((len(r) for r in runs), default=0)
    totals = [[m.ttft_s + m.decode_s for m in r[:passes]] for r in runs]
    return [percentile(sorted(t[p] / min(t) for t in totals), 50) for p in range(passes)]


def run_scatter(runs: list[list[Measurement]]) -> list[float]:
    """How far one run strays on this machine: every configuration's TTFT and decode time in each
    round-robin pass, on the raw clock, over the same configuration's and phase's median over its
    passes (configurations measured in fewer than two passes add nothing).

    A user's run is one such pass: the median of a few calls over a fraction of a second, read on
    the wall clock with whatever the machine was doing then. The reference workload's levels
    (:meth:`ReferenceTimer.levels`) say how far the machine's speed moved over the calibration,
    each the reference's time over tens of milliseconds; a configuration's own passes also carry
    the short stalls a call of a few milliseconds meets and the reference averages away. On a
    shared 2-core x86 host the reference's levels spanned 0.89-1.12 (5th-95th percentile) while
    single passes of the measured models spanned 0.82-1.27 around their medians, and intervals
    drawn with the levels held 72 % of single passes of the Llama sizes
    (docs/simulation-accuracy-log.md, "One run on the raw clock against the interval")."""
    out: list[float] = []
    for r in runs:
        if len(r) < 2:
            continue
        for values in ([m.ttft_s for m in r], [m.decode_s for m in r]):
            med = float(statistics.median(values))
            if med > 0:
                out.extend(v / med for v in values)
    return out


def passes_settled(levels: list[float], within_pct: float, need: int = 3) -> bool:
    """Whether the median of the passes rests on ``need`` passes that agree: ``need`` passes,
    consecutive in order of level and covering the median, whose slowest is at most
    ``within_pct`` percent above their fastest. With ``need`` passes this is their whole drift;
    with more, one or two passes that met a slower (or faster) stretch of the machine are
    outvoted. Fewer passes than ``need``: settled (nothing more can be said)."""
    ordered = sorted(levels)
    n = len(ordered)
    if n < need:
        return True
    lo_mid, hi_mid = (n - 1) // 2, n // 2
    for start in range(max(0, hi_mid - need + 1), min(lo_mid, n - need) + 1):
        window = ordered[start:start + need]
        if window[-1] <= window[0] * (1.0 + within_pct / 100.0):
            return True
    return False


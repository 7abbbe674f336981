"""The workload runner: filtering, sorting, batching, arrival delays, and full runs in a session."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import perfsdk
from perfsdk.config import ArrivalConfig, ConfigError, GenerateConfig, WorkloadConfig
from perfsdk.models.runner import (
    arrival_delays,
    count_tokens,
    filter_by_length,
    generate_kwargs,
    make_batches,
    order_by_length,
    plan_workload,
    run_workload,
    warmup_count,
)


@pytest.fixture(scope="module", autouse=True)
def _cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.getbasetemp() / "perfsdk-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSDK_CACHE_DIR", str(root))
        yield root


class WordTokenizer:
    """One token per whitespace-separated word: lengths are easy to compute by hand."""

    def __call__(self, prompts: list[str], **_: Any) -> dict[str, list[list[int]]]:
        return {"input_ids": [[0] * len(p.split()) for p in prompts]}


def _prompt(n: int) -> str:
    return " ".join(["w"] * n)


# -- pure pieces ----------------------------------------------------------------------------


def test_filter_and_order() -> None:
    keep, dropped = filter_by_length([3, 10, 11, 2, 10], 10)
    assert (keep, dropped) == ([0, 1, 3, 4], 1)
    assert order_by_length([0, 1, 2, 3], [5, 2, 5, 1]) == [3, 1, 0, 2]


def test_fixed_batches() -> None:
    assert make_batches([5] * 7, batch_size=3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert make_batches([5] * 2, batch_size=4) == [[0, 1]]


def test_adaptive_batches() -> None:
    lengths = [4, 6, 10, 20, 30, 100]
    # 3 x (10 + 10) = 60 <= 64; 4 x (20 + 10) = 120 > 64; 100 + 10 alone is over budget: own batch
    assert make_batches(lengths, batch_size=None, max_batch_tokens=64, max_new_tokens=10) == [[0, 1, 2], [3], [4], [5]]
    # with a batch_size cap as well
    assert make_batches(lengths, batch_size=2, max_batch_tokens=64, max_new_tokens=10) == [[0, 1], [2, 3], [4], [5]]
    # forward workloads count no new tokens
    assert make_batches([8, 8, 8, 8, 8], batch_size=None, max_batch_tokens=24) == [[0, 1, 2], [3, 4]]


def test_plan_filters_sorts_and_batches() -> None:
    wl = WorkloadConfig(max_input_tokens=6, batching={"max_batch_tokens": 30},  # type: ignore[arg-type]
                        generate={"max_new_tokens": 4})  # type: ignore[arg-type]
    prompts = [_prompt(n) for n in (5, 1, 9, 3, 2, 6, 7, 2)]
    plan = plan_workload(wl, WordTokenizer(), prompts)
    assert plan.filtered == 2  # 9 and 7 words
    assert plan.lengths == [1, 2, 2, 3, 5, 6]
    # [1,2,2]: 3 x (2+4) = 18; +3 -> 4 x 7 = 28; +5 -> 5 x 9 = 45 > 30; [5,6]: 2 x 10 = 20
    assert plan.batch_lengths == [[1, 2, 2, 3], [5, 6]]
    assert [len(b) for b in plan.batches] == [4, 2]


def test_plan_unsorted_fixed() -> None:
    wl = WorkloadConfig(sort_by_length=False, batching={"batch_size": 2})  # type: ignore[arg-type]
    plan = plan_workload(wl, WordTokenizer(), [_prompt(n) for n in (5, 1, 3)])
    assert plan.batch_lengths == [[5, 1], [3]]
    assert plan.filtered == 0


def test_plan_all_filtered() -> None:
    wl = WorkloadConfig(max_input_tokens=2)
    with pytest.raises(ConfigError, match=r"^workload\.max_input_tokens: all 2 prompts are longer than 2 tokens"):
        plan_workload(wl, WordTokenizer(), [_prompt(3), _prompt(4)])


def test_arrival_delays() -> None:
    take = lambda cfg, seed=0, n=8: list(itertools.islice(arrival_delays(cfg, seed), n))
    assert take(ArrivalConfig()) == [0.0] * 8
    assert take(ArrivalConfig(pattern="constant", delay_s=0.25), n=4) == [0.0, 0.25, 0.25, 0.25]
    assert take(ArrivalConfig(pattern="burst", burst_size=3, burst_interval_s=1.5)) == [0, 0, 0, 1.5, 0, 0, 1.5, 0]
    poisson = ArrivalConfig(pattern="poisson", rate_per_s=2.0)
    rng = random.Random(7)
    assert take(poisson, seed=7, n=5) == [0.0] + [rng.expovariate(2.0) for _ in range(4)]
    assert take(poisson, seed=7) == take(poisson, seed=7)
    assert take(poisson, seed=7) != take(poisson, seed=8)


def test_generate_kwargs() -> None:
    assert generate_kwargs(GenerateConfig()) == {"max_new_tokens": 32, "do_sample": False}
    sampled = GenerateConfig(max_new_tokens=8, min_new_tokens=2, do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    assert generate_kwargs(sampled) == {"max_new_tokens": 8, "min_new_tokens": 2, "do_sample": True,
                                        "temperature": 0.7, "top_k": 20, "top_p": 0.9}
    # sampling knobs are ignored for greedy decoding
    assert generate_kwargs(GenerateConfig(top_k=5, temperature=0.5)) == {"max_new_tokens": 32, "do_sample": False}


def test_count_tokens_with_embedded_tokenizer() -> None:
    from perfsdk.models.tiny import build_tokenizer

    tok = build_tokenizer()
    assert count_tokens(tok, ["The processor", "The processor reads memory through a cache."]) == [3, 9]
    assert count_tokens(tok, []) == []


# -- full runs in a session -----------------------------------------------------------------


def _config(**workload: Any) -> perfsdk.Config:
    base: dict[str, Any] = {
        "prompts": "builtin:short",
        "num_prompts": 4,
        "batching": {"batch_size": 2},
        "generate": {"max_new_tokens": 4, "min_new_tokens": 4},
        "warmup_runs": 1,
        "min_iterations": 1,
    }
    base.update(workload)
    return perfsdk.Config(name="runner-test", workload=base, collectors={"energy": False, "utilization": False})


def test_run_workload_generate() -> None:
    progress: list[tuple[int, int]] = []
    sleeps: list[float] = []
    cfg = _config(arrival={"pattern": "constant", "delay_s": 0.5}, min_iterations=2)
    with perfsdk.session(cfg, store=None) as s:
        info = run_workload(s, progress=lambda d, t: progress.append((d, t)), sleep=sleeps.append)
    # 4 prompts -> 2 batches of 2; 1 warm-up + 2 passes x 2 batches
    assert [st.kind for st in s.steps] == ["generate"] * 5
    assert [st.warmup for st in s.steps] == [True, False, False, False, False]
    assert [st.batch_size for st in s.steps] == [2] * 5
    assert [st.output_tokens for st in s.steps] == [[4, 4]] * 5
    assert [st.input_tokens for st in s.steps] == [[8, 8], [8, 8], [9, 11], [8, 8], [9, 11]]
    assert len(s.measured_steps) == 4
    assert sleeps == [0.5, 0.5, 0.5]  # no wait before the first timed batch
    assert progress == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert info.model_dump() == {
        "prompts_source": "builtin:short", "num_prompts": 4, "prompts_filtered": 0, "max_input_tokens": 512,
        "batch_size": 2,
        "max_batch_tokens": None, "num_batches": 2, "max_new_tokens": 4, "warmup_runs": 1, "timed_runs": 4,
        "iterations": 2, "input_tokens_mean": 9.0, "input_tokens_max": 11, "arrival_pattern": "constant",
        "labelled_prompts": 0, "label_map": None,
        # a text model: no images, no vision tokens
        "images_source": None, "image_size": None, "num_crops": None, "image_views_mean": None,
        "vision_tokens_mean": None, "vision_tokens_max": None,
    }
    assert s.result is not None and s.result.workload == info
    assert s.result.status == "ok", s.result.errors
    assert len(s.tokenize_events) == 2
    latency = s.result.collectors.get("latency")
    if latency is not None:
        assert latency["output_tokens"] == 32


def test_warmup_covers_every_batch_on_cuda_by_default() -> None:
    w = WorkloadConfig(warmup_runs=2)
    # auto: every batch once on CUDA (torch.device or a string), warmup_runs elsewhere
    assert warmup_count(w, 8, torch.device("cuda", 0)) == 8
    assert warmup_count(w, 8, "cuda:1") == 8
    assert warmup_count(w, 8, torch.device("cpu")) == 2
    assert warmup_count(w, 8, None) == 2
    assert warmup_count(w, 1, torch.device("cuda")) == 2  # never fewer than warmup_runs
    # warm-up switched off stays off in auto mode; an explicit setting wins on any device
    assert warmup_count(WorkloadConfig(warmup_runs=0), 8, torch.device("cuda")) == 0
    assert warmup_count(WorkloadConfig(warmup_runs=0, warmup_every_batch=True), 8, torch.device("cpu")) == 8
    assert warmup_count(WorkloadConfig(warmup_runs=3, warmup_every_batch=False), 8, torch.device("cuda")) == 3


def test_run_workload_warms_every_batch_when_asked() -> None:
    cfg = _config(warmup_every_batch=True, num_prompts=6)
    with perfsdk.session(cfg, store=None) as s:
        info = run_workload(s)
    # 6 prompts -> 3 batches: 3 warm-up runs (one per batch, in order), then one timed pass
    assert [(st.warmup, st.input_tokens) for st in s.steps[:3]] == \
        [(True, st.input_tokens) for st in s.measured_steps]
    assert (info.warmup_runs, info.timed_runs) == (3, 3)


def test_run_workload_filters_and_min_duration() -> None:
    batches_done = [0]
    clock = lambda: float(batches_done[0])
    cfg = _config(max_input_tokens=8, warmup_runs=0, min_duration_s=3.0, arrival={"pattern": "burst", "burst_size": 2,
                                                                                     "burst_interval_s": 2.0})
    sleeps: list[float] = []

    def progress(done: int, total: int) -> None:
        batches_done[0] = done

    with perfsdk.session(cfg, store=None) as s:
        info = run_workload(s, progress=progress, sleep=sleeps.append, clock=clock)
    # prompts of 9 and 11 tokens are dropped: one batch of the two 8-token prompts remains;
    # one batch per pass -> passes until 3 "seconds" have gone by
    assert (info.num_prompts, info.prompts_filtered, info.num_batches) == (2, 2, 1)
    assert (info.iterations, info.timed_runs, info.warmup_runs) == (3, 3, 0)
    assert sleeps == [2.0]  # burst of 2, then the interval before the third submission
    assert [st.warmup for st in s.steps] == [False] * 3


def test_sampling_is_reproducible_with_seed() -> None:
    def outputs() -> list[torch.Tensor]:
        cfg = _config(warmup_runs=0, generate={"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": True,
                                               "temperature": 1.5, "top_k": 50, "top_p": 0.95})
        with perfsdk.session(cfg, store=None) as s:
            run_workload(s)
        return [st.outputs for st in s.steps]

    first, second = outputs(), outputs()
    assert len(first) == 2
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_run_workload_forward_and_adaptive() -> None:
    cfg = _config(task="forward", warmup_runs=2, batching={"max_batch_tokens": 20})
    with perfsdk.session(cfg, store=None) as s:
        info = run_workload(s)
    # lengths 8, 8, 9, 11: 2 x 8 = 16 fits, 3 x 9 = 27 does not; 2 x 11 = 22 does not
    assert [st.batch_size for st in s.measured_steps] == [2, 1, 1]
    assert [st.kind for st in s.steps] == ["forward"] * 5
    assert [st.warmup for st in s.steps] == [True, True, False, False, False]
    assert info.max_new_tokens is None and info.batch_size is None and info.max_batch_tokens == 20
    assert s.steps[2].outputs.logits.shape == (2, 8, 4096)


def test_check_workload(tmp_path: Path) -> None:
    from perfsdk.models.runner import check_workload

    check_workload(perfsdk.Config())  # the quickstart is valid
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ConfigError, match=r"^workload\.prompts: .*p\.jsonl line 2: missing"):
        check_workload(perfsdk.Config(workload={"prompts": str(bad)}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^model\.id: folder \./nowhere not found"):
        check_workload(perfsdk.Config(model={"id": "./nowhere"}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^model\.id: unknown built-in model"):
        check_workload(perfsdk.Config(model={"id": "builtin:nope"}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^model\.quantization: bnb-4bit needs a CUDA GPU"):
        check_workload(perfsdk.Config(model={"quantization": "bnb-4bit"}))  # type: ignore[arg-type]


def test_load_is_the_new_spelling_of_arrival_in_process() -> None:
    from perfsdk.config import ConfigError as CE
    from perfsdk.models.runner import in_process_arrival

    wl = perfsdk.Config(workload={"load": {"mode": "rate", "rate_per_s": 4, "arrival": "constant"}}).workload
    a = in_process_arrival(wl)
    assert a.pattern == "constant" and a.delay_s == 0.25
    wl = perfsdk.Config(workload={"load": {"mode": "rate", "rate_per_s": 2, "arrival": "poisson"}}).workload
    assert in_process_arrival(wl).pattern == "poisson" and in_process_arrival(wl).rate_per_s == 2
    old = perfsdk.Config(workload={"arrival": {"pattern": "poisson", "rate_per_s": 3}}).workload
    assert in_process_arrival(old).rate_per_s == 3  # old configs keep working
    with pytest.raises(CE, match="workload.load.concurrency: 4 concurrent users need a served model"):
        in_process_arrival(perfsdk.Config(workload={"load": {"mode": "concurrency", "concurrency": 4}}).workload)
    with pytest.raises(CE, match="gamma arrivals need a served model"):
        in_process_arrival(perfsdk.Config(workload={"load": {"mode": "rate", "rate_per_s": 1, "arrival": "gamma"}}).workload)
    with pytest.raises(Exception, match="set load or arrival, not both"):
        perfsdk.Config(workload={"arrival": {"pattern": "constant", "delay_s": 1},
                                 "load": {"mode": "rate", "rate_per_s": 1}})

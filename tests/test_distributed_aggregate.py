"""Rank detection, prompt sharding and aggregation of rank payloads (no process group)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from perfsdk import distributed
from perfsdk.distributed import (
    RankInfo,
    aggregate,
    aggregate_energy,
    aggregate_latency,
    detect_rank,
    shard_prompts,
)
from perfsdk.schemas import ErrorRecord, RunResult, WorkloadInfo


def test_detect_rank_torchrun_env() -> None:
    info = detect_rank({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, use_torch=False)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 4, 1, "torchrun")
    assert info.is_distributed and not info.is_main


def test_detect_rank_accelerate_and_mpi_env() -> None:
    acc = detect_rank({"RANK": "0", "WORLD_SIZE": "2", "ACCELERATE_MIXED_PRECISION": "no"}, use_torch=False)
    assert (acc.rank, acc.world_size, acc.source) == (0, 2, "accelerate")
    mpi = detect_rank({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                       "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, use_torch=False)
    assert (mpi.rank, mpi.world_size, mpi.local_rank, mpi.source) == (1, 2, 1, "mpi")


@pytest.mark.parametrize("env", [{}, {"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"},
                                 {"RANK": "0", "WORLD_SIZE": "0"}])
def test_detect_rank_single_or_inconsistent(env: dict[str, str]) -> None:
    info = detect_rank(env, use_torch=False)
    assert (info.rank, info.world_size, info.source) == (0, 1, "single")
    assert not info.is_distributed


def test_shard_prompts_covers_every_prompt_once() -> None:
    prompts = [f"p{i}" for i in range(7)]
    shards = [shard_prompts(prompts, r, 3) for r in range(3)]
    assert shards == [["p0", "p3", "p6"], ["p1", "p4"], ["p2", "p5"]]
    assert sorted(sum(shards, [])) == sorted(prompts)
    assert shard_prompts(prompts, 0, 1) == prompts
    with pytest.raises(ValueError):
        shard_prompts(prompts, 3, 3)


def test_current_shard_reads_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.current_shard(list(range(5))) == [1, 3]
    monkeypatch.setenv("PERFSDK_DISTRIBUTED", "0")
    assert distributed.current_shard(list(range(5))) == [0, 1, 2, 3, 4]


def _lat(requests: int, out: int, inp: int, wall: float) -> dict:
    return {"requests": requests, "output_tokens": out, "input_tokens": inp, "wall_s": wall, "steps": 1,
            "warmup_steps": 1, "failed_steps": 0, "eos_stopped_requests": 0}


def _payload(rank: int, host: str, samples: dict, steps: dict, collectors: dict, status: str = "ok",
             errors: list | None = None) -> dict:
    base = {k: [] for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "decode_s", "forward_s", "tokenize_s")}
    base.update(samples)
    return {"rank": rank, "world_size": 2, "hostname": host, "status": status, "collectors": collectors,
            "errors": errors or [], "workload": {"num_prompts": 3, "prompts_filtered": 1}, "records": [],
            "samples": base, "step_s": steps, "series": {"token_times": [{"t_s": rank}]}}


def test_latency_pools_samples_and_takes_slowest_step() -> None:
    p0 = _payload(0, "a", {"ttft_s": [1.0, 2.0], "itl_s": [0.1, 0.3]}, {0: 1.0, 1: 2.0},
                  {"latency": _lat(2, 10, 6, 4.0)})
    p1 = _payload(1, "a", {"ttft_s": [3.0], "itl_s": [0.2]}, {0: 1.5}, {"latency": _lat(1, 6, 4, 5.0)})
    lat = aggregate_latency([p0, p1])
    assert lat is not None
    # pooled [1, 2, 3]: the median of the pool, not the mean of per-rank medians (1.5 and 3)
    assert lat["ttft_s"]["count"] == 3 and lat["ttft_s"]["p50"] == 2.0 and lat["ttft_s"]["max"] == 3.0
    assert lat["prefill_s"]["p50"] == 2.0
    assert lat["itl_s"]["count"] == 3 and lat["itl_s"]["p50"] == pytest.approx(0.2)
    # step 0: slowest of 1.0 and 1.5; step 1: only rank 0 had it
    assert lat["step_s"]["count"] == 2 and lat["step_s"]["min"] == 1.5 and lat["step_s"]["max"] == 2.0
    assert lat["busy_s"] == 3.5 and lat["steps"] == 2
    assert (lat["requests"], lat["output_tokens"], lat["input_tokens"], lat["warmup_steps"]) == (3, 16, 10, 2)
    assert lat["wall_s"] == 5.0
    assert lat["output_tokens_per_s"] == pytest.approx(16 / 5.0)
    assert lat["total_tokens_per_s"] == pytest.approx(26 / 5.0)


def test_energy_counts_host_wide_counters_once() -> None:
    e0 = {"status": "ok", "energy_j": {"rapl:package": 10.0, "nvml:gpu:0": 5.0, "codecarbon:process": 1.0},
          "steps_energy_j": {"rapl:package": 8.0, "nvml:gpu:0": 4.0, "codecarbon:process": 1.0},
          "measured_keys": ["nvml:gpu:0", "rapl:package"], "output_tokens": 8}
    e1 = {"status": "ok", "energy_j": {"rapl:package": 12.0, "nvml:gpu:1": 7.0, "codecarbon:process": 2.0},
          "steps_energy_j": {"rapl:package": 10.0, "nvml:gpu:1": 6.0, "codecarbon:process": 2.0},
          "measured_keys": ["nvml:gpu:1", "rapl:package"], "output_tokens": 12}
    e2 = {"status": "ok", "energy_j": {"rapl:package": 20.0}, "steps_energy_j": {"rapl:package": 18.0},
          "measured_keys": ["rapl:package"], "output_tokens": 0}
    p = [_payload(0, "a", {}, {}, {"energy": e0}), _payload(1, "a", {}, {}, {"energy": e1}),
         _payload(2, "b", {}, {}, {"energy": e2})]
    en = aggregate_energy(p, 20)
    assert en is not None
    # same host "a": the package counter is read twice -> max 12; host "b" adds 20
    assert en["energy_j"] == {"rapl:package": 32.0, "nvml:gpu:0": 5.0, "nvml:gpu:1": 7.0, "codecarbon:process": 3.0}
    assert en["output_tokens"] == 20
    # steps: package max(8, 10) on host a + 18 on host b = 28; GPUs 4 + 6; codecarbon is not measuring
    assert en["steps_energy_j"]["rapl:package"] == 28.0
    assert en["j_per_output_token_by_source"]["rapl:package"] == pytest.approx(28.0 / 20)
    assert en["output_tokens_per_j_by_source"]["nvml:gpu:1"] == pytest.approx(20 / 6.0)
    assert en["measured_keys"] == ["nvml:gpu:0", "nvml:gpu:1", "rapl:package"]
    assert en["j_per_output_token"] == pytest.approx((28.0 + 4.0 + 6.0) / 20)
    assert en["output_tokens_per_j"] == pytest.approx(20 / 38.0)


def test_aggregate_builds_ranks_section_and_merges_errors() -> None:
    now = datetime.now(timezone.utc)
    result = RunResult(run_id="r1", name="x", status="ok", started_at=now, perfsdk_version="0",
                       collectors={"latency": _lat(2, 10, 6, 4.0), "memory": {"rss_peak_bytes": 5}},
                       workload=WorkloadInfo(num_prompts=3, prompts_filtered=1))
    err = ErrorRecord(source="memory", hook="perfsdk_finalize", type="ValueError", message="boom").model_dump()
    p0 = _payload(0, "a", {"ttft_s": [1.0]}, {0: 1.0}, dict(result.collectors))
    p1 = _payload(1, "b", {"ttft_s": [3.0]}, {0: 2.0}, {"latency": _lat(1, 6, 4, 5.0)}, status="partial",
                  errors=[err])
    out, series = aggregate(result, [p0, p1])
    assert out.status == "partial"
    assert [r.rank for r in out.ranks or []] == [0, 1]
    assert out.ranks is not None and out.ranks[1].hostname == "b" and out.ranks[1].errors[0].message == "boom"
    assert [e.source for e in out.errors] == ["rank1:memory"]
    assert out.collectors["latency"]["requests"] == 3
    assert out.collectors["memory"] == {"rss_peak_bytes": 5}
    assert out.workload is not None and (out.workload.num_prompts, out.workload.prompts_filtered) == (6, 2)
    assert out.environment.extra["distributed"]["world_size"] == 2
    assert out.environment.extra["distributed"]["hosts"] == ["a", "b"]
    assert series == {"rank1.token_times": [{"t_s": 1}]}


def test_single_process_session_is_untouched(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    import perfsdk

    with perfsdk.session({"collectors": {"energy": False, "utilization": False}}, store=tmp_path) as s:
        s.record("x", 1)
    assert isinstance(s.rank_info, RankInfo) and not s.rank_info.is_distributed
    assert s.result is not None and s.result.ranks is None
    assert "distributed" not in s.result.environment.extra
    assert (tmp_path / "runs" / s.result.run_id / "result.json").is_file()


def test_current_shard_refuses_an_empty_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfsdk.config import ConfigError

    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match="cannot be split over 3 ranks"):
        distributed.current_shard(["a", "b"])


def test_interrupted_rank_stores_alone_without_a_collective() -> None:
    from types import SimpleNamespace

    now = datetime.now(timezone.utc)
    err = ErrorRecord(source="interrupt", type="RunInterrupted", message="interrupted by SIGTERM")
    result = RunResult(run_id="r1", name="x", status="failed", started_at=now, perfsdk_version="0", errors=[err])
    # gather_ok with no process group: any collective here would raise
    for rank, run_id, store in ((0, "r1", "kept"), (1, "r1-rank1", "/st")):
        info = RankInfo(rank=rank, world_size=2, gather_ok=True, store_dir="/st")
        sess = SimpleNamespace(rank_info=info, store_dir="kept" if rank == 0 else None)
        out = distributed.post_process(sess, result)
        assert (out.run_id, out.tags["rank"], out.status, sess.store_dir) == (run_id, str(rank), "failed", store)

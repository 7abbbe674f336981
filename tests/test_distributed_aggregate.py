"""Rank detection, prompt sharding and aggregation of rank payloads (no process group)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from perfsdk import distributed
from perfsdk.collector import Collector, CollectorResult, RankShare
from perfsdk.collectors.energy import EnergyCollector, EnergyResult
from perfsdk.collectors.latency import LatencyCollector, LatencyResult
from perfsdk.distributed import RankInfo, detect_rank, shard_prompts
from perfsdk.schemas import ErrorRecord, RunResult, WorkloadInfo
from perfsdk.stats import Stats


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


def _lat(requests: int, out: int, inp: int, wall: float) -> LatencyResult:
    empty = Stats()
    return LatencyResult(ttft_s=empty, tpot_s=empty, itl_s=empty, e2e_s=empty, prefill_s=empty, decode_s=empty,
                         forward_s=empty, step_s=empty, tokenize_s=empty, requests=requests, output_tokens=out,
                         input_tokens=inp, wall_s=wall, steps=1, warmup_steps=1)


def _samples(**given: list[float]) -> dict:
    base: dict = {k: [] for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "decode_s", "forward_s", "tokenize_s")}
    base.update(given)
    return base


def _payload(rank: int, host: str, collectors: dict, payloads: dict | None = None, status: str = "ok",
             errors: list | None = None) -> dict:
    """What distributed.rank_payload ships, with results in their stored (JSON) form."""
    return {"rank": rank, "world_size": 2, "hostname": host, "status": status,
            "collectors": {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v) for k, v in collectors.items()},
            "payloads": payloads or {}, "errors": errors or [], "workload": {"num_prompts": 3, "prompts_filtered": 1},
            "records": [], "series": {"token_times": [{"t_s": rank}]}}


def test_latency_pools_samples_and_takes_slowest_step() -> None:
    s0 = RankShare(0, 2, "a", _lat(2, 10, 6, 4.0), {"samples": _samples(ttft_s=[1.0, 2.0], itl_s=[0.1, 0.3]),
                                                     "step_s": [1.0, 2.0]})
    s1 = RankShare(1, 2, "a", _lat(1, 6, 4, 5.0), {"samples": _samples(ttft_s=[3.0], itl_s=[0.2]), "step_s": [1.5]})
    lat = LatencyCollector.merge_ranks([s0, s1])
    # pooled [1, 2, 3]: the median of the pool, not the mean of per-rank medians (1.5 and 3)
    assert lat.ttft_s.count == 3 and lat.ttft_s.p50 == 2.0 and lat.ttft_s.max == 3.0
    assert lat.prefill_s.p50 == 2.0
    assert lat.itl_s.count == 3 and lat.itl_s.p50 == pytest.approx(0.2)
    # step 0: slowest of 1.0 and 1.5; step 1: only rank 0 had it
    assert lat.step_s.count == 2 and lat.step_s.min == 1.5 and lat.step_s.max == 2.0
    assert lat.busy_s == 3.5 and lat.steps == 2
    assert (lat.requests, lat.output_tokens, lat.input_tokens, lat.warmup_steps) == (3, 16, 10, 2)
    assert lat.wall_s == 5.0
    assert lat.output_tokens_per_s == pytest.approx(16 / 5.0)
    assert lat.total_tokens_per_s == pytest.approx(26 / 5.0)


def _energy(**fields: object) -> EnergyResult:
    return EnergyResult.model_validate({"status": "ok", "sources": [], **fields})


def test_energy_counts_host_wide_counters_once() -> None:
    e0 = _energy(energy_j={"rapl:package": 10.0, "nvml:gpu:0": 5.0, "codecarbon:process": 1.0},
                 steps_energy_j={"rapl:package": 8.0, "nvml:gpu:0": 4.0, "codecarbon:process": 1.0},
                 measured_keys=["nvml:gpu:0", "rapl:package"], output_tokens=8)
    e1 = _energy(energy_j={"rapl:package": 12.0, "nvml:gpu:1": 7.0, "codecarbon:process": 2.0},
                 steps_energy_j={"rapl:package": 10.0, "nvml:gpu:1": 6.0, "codecarbon:process": 2.0},
                 measured_keys=["nvml:gpu:1", "rapl:package"], output_tokens=12)
    e2 = _energy(energy_j={"rapl:package": 20.0}, steps_energy_j={"rapl:package": 18.0},
                 measured_keys=["rapl:package"], output_tokens=0)
    en = EnergyCollector.merge_ranks([RankShare(0, 3, "a", e0), RankShare(1, 3, "a", e1), RankShare(2, 3, "b", e2)])
    # same host "a": the package counter is read twice -> max 12; host "b" adds 20
    assert en.energy_j == {"rapl:package": 32.0, "nvml:gpu:0": 5.0, "nvml:gpu:1": 7.0, "codecarbon:process": 3.0}
    assert en.output_tokens == 20
    # steps: package max(8, 10) on host a + 18 on host b = 28; GPUs 4 + 6; codecarbon is not measuring
    assert en.steps_energy_j["rapl:package"] == 28.0
    assert en.j_per_output_token_by_source["rapl:package"] == pytest.approx(28.0 / 20)
    assert en.output_tokens_per_j_by_source["nvml:gpu:1"] == pytest.approx(20 / 6.0)
    assert en.measured_keys == ["nvml:gpu:0", "nvml:gpu:1", "rapl:package"]
    assert en.j_per_output_token == pytest.approx((28.0 + 4.0 + 6.0) / 20)
    assert en.output_tokens_per_j == pytest.approx(20 / 38.0)


class _Calls(CollectorResult):
    calls: int = 0


class _SummingCounter(Collector):
    name = "calls_summed"
    Result = _Calls

    @classmethod
    def merge_ranks(cls, shares: list[RankShare]) -> _Calls:
        return _Calls(calls=sum(s.result.calls for s in shares))


class _PlainCounter(Collector):
    name = "calls_plain"
    Result = _Calls


def test_aggregate_merges_through_each_collector_and_marks_the_rest_rank0_only() -> None:
    now = datetime.now(timezone.utc)
    result = RunResult(run_id="r1", name="x", status="ok", started_at=now, perfsdk_version="0",
                       collectors={"latency": _lat(2, 10, 6, 4.0).model_dump(mode="json"),
                                   "calls_summed": {"calls": 2}, "calls_plain": {"calls": 2}},
                       workload=WorkloadInfo(num_prompts=3, prompts_filtered=1))
    err = ErrorRecord(source="memory", hook="perfsdk_finalize", type="ValueError", message="boom").model_dump()
    lat_pay = {"samples": _samples(ttft_s=[1.0]), "step_s": [1.0]}
    p0 = _payload(0, "a", {"latency": _lat(2, 10, 6, 4.0), "calls_summed": {"calls": 2}, "calls_plain": {"calls": 2}},
                  {"latency": lat_pay})
    p1 = _payload(1, "b", {"latency": _lat(1, 6, 4, 5.0), "calls_summed": {"calls": 3}, "calls_plain": {"calls": 3}},
                  {"latency": {"samples": _samples(ttft_s=[3.0]), "step_s": [2.0]}}, status="partial", errors=[err])
    classes = {"latency": LatencyCollector, "calls_summed": _SummingCounter, "calls_plain": _PlainCounter}
    out, series = distributed.aggregate(result, [p0, p1], classes)
    assert out.status == "partial"
    assert [r.rank for r in out.ranks or []] == [0, 1]
    assert out.ranks is not None and out.ranks[1].hostname == "b" and out.ranks[1].errors[0].message == "boom"
    assert [e.source for e in out.errors] == ["rank1:memory"]
    assert out.collectors["latency"]["requests"] == 3
    assert out.collectors["latency"]["ttft_s"]["count"] == 2
    # a counter with a merge sums; one without keeps rank 0's value, marked, and both ranks' values
    assert out.collectors["calls_summed"] == {"calls": 5}
    assert out.collector_meta["calls_summed"].scope == "merged"
    assert out.collectors["calls_plain"] == {"calls": 2}
    assert out.collector_meta["calls_plain"].scope == "rank0-only"
    assert [r.collectors["calls_plain"]["calls"] for r in out.ranks] == [2, 3]
    assert out.workload is not None and (out.workload.num_prompts, out.workload.prompts_filtered) == (6, 2)
    assert out.environment.extra["distributed"]["world_size"] == 2
    assert out.environment.extra["distributed"]["hosts"] == ["a", "b"]
    assert out.environment.extra["distributed"]["rank0_only"] == ["calls_plain"]
    assert series == {"rank1.token_times": [{"t_s": 1}]}


def test_a_failing_merge_keeps_rank0_value_and_names_the_collector() -> None:
    class Broken(_SummingCounter):
        name = "broken"

        @classmethod
        def merge_ranks(cls, shares: list[RankShare]) -> _Calls:
            raise RuntimeError("cannot merge")

    now = datetime.now(timezone.utc)
    result = RunResult(run_id="r1", name="x", status="ok", started_at=now, perfsdk_version="0")
    p0 = _payload(0, "a", {"broken": {"calls": 1}})
    p1 = _payload(1, "a", {"broken": {"calls": 4}})
    out, _ = distributed.aggregate(result, [p0, p1], {"broken": Broken})
    assert out.collectors["broken"] == {"calls": 1}
    assert out.collector_meta["broken"].scope == "rank0-only"
    assert out.status == "partial"
    assert [(e.source, e.hook) for e in out.errors] == [("broken", "merge_ranks")]


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

"""Multi-process runs: rank detection, gathering to rank 0, aggregation, prompt sharding.

Under ``torchrun``, Accelerate or ``mpirun`` every process runs its own :class:`~perfsdk.Session`.
This module makes those sessions one run:

1. At session set-up :func:`attach` detects the rank (an initialized ``torch.distributed``
   first, then the launcher's environment), joins a process group if none is initialized
   (``gloo``, from the ``env://`` variables the launcher sets) and broadcasts rank 0's run id,
   so every rank carries the same id. Ranks other than 0 never write to the store.
2. At finalize :func:`post_process` sends each rank's share (collector results, each
   collector's ``rank_payload``, errors, time series) to rank 0 with ``gather_object`` over a
   gloo group, and rank 0 stores one run with a ``ranks`` section. Each collector's top-level
   result is combined by its own ``merge_ranks`` (latency pools samples, energy counts host-wide
   counters once, ...); a collector without a merge keeps rank 0's result at the top level,
   marked ``rank0-only`` in ``collector_meta``, and every rank's result in ``ranks``. This module
   only moves data between processes; it knows no collector's fields.

3. ``perfsdk run`` gives each rank ``shard_prompts(prompts, rank, world_size)``.

Single-process runs pass through untouched. Environment switches: ``PERFSDK_DISTRIBUTED=0``
turns all of this off; ``PERFSDK_DIST_TIMEOUT_S`` (default 600) bounds how long a rank waits
for the others.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from perfsdk.collector import RankShare
from perfsdk.schemas import CollectorMeta, ErrorRecord, RankResult, RunResult, WorkloadInfo

log = structlog.get_logger("perfsdk.distributed")

T = TypeVar("T")

#: (rank, world size, local rank) variables, in the order they are looked for.
_ENV_SETS: tuple[tuple[str, str, str, str], ...] = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)

_STATUS_ORDER = {"ok": 0, "partial": 1, "failed": 2}

@dataclass
class RankInfo:
    """Where this process sits in a multi-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    source: str = "single"  # single | torchrun | accelerate | mpi | torch.distributed
    hostname: str = field(default_factory=socket.gethostname)
    backend: str | None = None
    initialized_here: bool = False
    gather_ok: bool = False
    group: Any = None
    store_dir: str | None = None  # where this rank would store on its own (gathering skipped or failed)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int_env(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def detect_rank(env: Mapping[str, str] | None = None, use_torch: bool = True) -> RankInfo:
    """This process's rank, from an initialized ``torch.distributed`` or the launcher's env.

    ``torchrun`` and ``accelerate launch`` set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
    Open MPI and PMI launchers set their own variables. Without any, a single process.
    """
    env = os.environ if env is None else env
    if use_torch:
        dist = _torch_dist()
        if dist is not None and dist.is_initialized():
            local = _int_env(env, "LOCAL_RANK")
            return RankInfo(rank=dist.get_rank(), world_size=dist.get_world_size(),
                            local_rank=local if local is not None else 0, source="torch.distributed",
                            backend=str(dist.get_backend()))
    for source, rk, ws, lr in _ENV_SETS:
        rank, world = _int_env(env, rk), _int_env(env, ws)
        if rank is None or world is None:
            continue
        if world < 1 or not 0 <= rank < world:
            log.warning("ignoring inconsistent rank variables", rank=rank, world_size=world)
            continue
        if source == "torchrun" and any(k.startswith("ACCELERATE_") for k in env):
            source = "accelerate"
        local = _int_env(env, lr)
        return RankInfo(rank=rank, world_size=world, local_rank=local if local is not None else 0, source=source)
    return RankInfo()


def _torch_dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() else None


def _timeout() -> _dt.timedelta:
    from perfsdk.envflags import number

    secs = number("PERFSDK_DIST_TIMEOUT_S", 600.0)
    return _dt.timedelta(seconds=max(secs, 1.0))


def disabled() -> bool:
    """``PERFSDK_DISTRIBUTED=0`` turns rank awareness off (every process is its own run)."""
    from perfsdk.envflags import flag_off

    return flag_off("PERFSDK_DISTRIBUTED")


def init_group(info: RankInfo) -> RankInfo:
    """Make sure a process group exists and pick a gloo group for object collectives.

    If the user initialized ``torch.distributed`` (any backend), it is used; a gloo group is
    added when the default backend is not gloo, because objects travel on the host. Otherwise
    the group is created here from the launcher's ``env://`` variables with the gloo backend
    and destroyed again by :func:`shutdown`.
    """
    if not info.is_distributed:
        return info
    dist = _torch_dist()
    if dist is None:
        log.warning("torch.distributed unavailable: ranks cannot be gathered")
        return info
    try:
        if not dist.is_initialized():
            env = os.environ
            if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
                raise RuntimeError("MASTER_ADDR/MASTER_PORT not set by the launcher")
            os.environ.setdefault("RANK", str(info.rank))
            os.environ.setdefault("WORLD_SIZE", str(info.world_size))
            dist.init_process_group(backend="gloo", rank=info.rank, world_size=info.world_size, timeout=_timeout())
            info.initialized_here = True
        info.backend = str(dist.get_backend())
        info.group = None if info.backend == "gloo" else dist.new_group(backend="gloo", timeout=_timeout())
        info.gather_ok = True
    except Exception as exc:
        log.error("could not join the process group; each rank keeps its own run", error=repr(exc))
        info.gather_ok = False
    return info


def broadcast_object(obj: T, info: RankInfo) -> T:
    """Rank 0's ``obj`` on every rank (unchanged when not distributed)."""
    if not (info.is_distributed and info.gather_ok):
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=info.group)
    return box[0]


def gather_to_main(obj: Any, info: RankInfo) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (in rank order); ``None`` on the other ranks."""
    if not (info.is_distributed and info.gather_ok):
        return [obj]
    import torch.distributed as dist

    out: list[Any] | None = [None] * info.world_size if info.is_main else None
    dist.gather_object(obj, out, dst=0, group=info.group)
    return out


def shutdown(info: RankInfo) -> None:
    """Destroy the process group if this module created it."""
    if not info.initialized_here:
        return
    dist = _torch_dist()
    if dist is not None and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # never fail a run on teardown
            log.warning("could not destroy the process group", error=repr(exc))
    info.initialized_here = False


def shard_prompts(prompts: Sequence[T], rank: int, world_size: int) -> list[T]:
    """This rank's share of the prompts for data-parallel runs.

    Strided (``prompts[rank::world_size]``) so that, with prompts sorted by length, every rank
    gets a similar mix; shares differ by at most one prompt, and together cover every prompt
    exactly once.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    return list(prompts[rank::world_size])


def current_shard(prompts: Sequence[T]) -> list[T]:
    """``shard_prompts`` for the rank this process detects (all prompts when single)."""
    if disabled():
        return list(prompts)
    info = detect_rank()
    share = shard_prompts(prompts, info.rank, info.world_size)
    if prompts and not share:
        from perfsdk.config import ConfigError

        raise ConfigError(f"workload.num_prompts: {len(prompts)} prompt(s) cannot be split over "
                          f"{info.world_size} ranks (rank {info.rank} would get none)")
    return share


# -- session integration --------------------------------------------------------------------


def attach(session: Any) -> RankInfo:
    """At session set-up (``perfsdk_session_configure``): detect the rank, join the group, share the run id.

    Non-zero ranks get ``store_dir = None``: only rank 0 stores.
    """
    if disabled():
        return RankInfo()
    info = detect_rank()
    if not info.is_distributed:
        return info
    init_group(info)
    info.store_dir = session.store_dir
    if info.gather_ok:
        session.run_id = broadcast_object(session.run_id, info)
        if not info.is_main:
            session.store_dir = None
    session.tags.setdefault("world_size", str(info.world_size))
    if not info.gather_ok:
        session.tags["rank"] = str(info.rank)
        session.errors.append(ErrorRecord(source="distributed", hook=None, type="GatherUnavailable",
                                          message=f"rank {info.rank}/{info.world_size}: process group unavailable; "
                                                  "this rank's results are stored on their own"))
    return info


def rank_payload(session: Any, result: RunResult) -> dict[str, Any]:
    """What one rank sends to rank 0: its results, and each collector's ``rank_payload``."""
    extra: dict[str, Any] = {}
    for name, inst in session.collectors.items():
        try:
            extra[name] = inst.rank_payload(session)
        except Exception as exc:  # one collector's payload never stops the gathering
            session.record_error(name, "rank_payload", exc)
    return {
        "rank": session.rank_info.rank,
        "world_size": session.rank_info.world_size,
        "hostname": session.rank_info.hostname,
        "status": result.status,
        "collectors": result.collectors,
        "payloads": extra,
        "errors": [e.model_dump(mode="json") for e in result.errors],
        "workload": result.workload.model_dump(mode="json") if result.workload else None,
        "records": [r.model_dump(mode="json") for r in result.records],
        "series": dict(session.series),
    }


def _worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _STATUS_ORDER.get(s, 2))


def merge_collectors(payloads: list[dict[str, Any]], classes: Mapping[str, Any]
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, CollectorMeta], list[ErrorRecord]]:
    """Each collector's top-level result, combined by its own ``merge_ranks``.

    A collector without a merge (or not known here) keeps rank 0's result at the top level,
    marked ``rank0-only``; every rank's own result stays in the run's ``ranks`` entries.
    """
    names: list[str] = []
    for p in payloads:
        names += [n for n in p["collectors"] if n not in names]
    merged: dict[str, dict[str, Any]] = {}
    meta: dict[str, CollectorMeta] = {}
    errors: list[ErrorRecord] = []
    n = len(payloads)
    for name in names:
        cls = classes.get(name)
        present = [p for p in payloads if name in p["collectors"]]
        rank0 = payloads[0]["collectors"].get(name)
        if cls is not None and cls.has_merge():
            try:
                shares = [RankShare(rank=p["rank"], world_size=p["world_size"], hostname=p["hostname"],
                                    result=cls.Result.model_validate(p["collectors"][name]),
                                    payload=(p.get("payloads") or {}).get(name)) for p in present]
                out = cls.merge_ranks(shares)
                if out is not NotImplemented and out is not None:
                    merged[name] = cls.Result.model_validate(
                        out.model_dump() if hasattr(out, "model_dump") else out).model_dump(mode="json")
                    meta[name] = CollectorMeta(scope="merged", ranks=len(present))
                    continue
            except Exception as exc:  # a merge bug keeps rank 0's value, named as such
                log.error("merging ranks failed", collector=name, error=repr(exc))
                errors.append(ErrorRecord(source=name, hook="merge_ranks", type=type(exc).__name__,
                                          message=f"merging {len(present)} ranks failed: {exc}"))
        if rank0 is not None:
            merged[name] = rank0
        meta[name] = CollectorMeta(scope="rank0-only", ranks=n)
    return merged, meta, errors


def aggregate(result: RunResult, payloads: list[dict[str, Any]], classes: Mapping[str, Any] | None = None
              ) -> tuple[RunResult, dict[str, list[dict[str, Any]]]]:
    """Rank 0's stored run: merged collectors, ``ranks`` section, merged errors and series."""
    if classes is None:
        from perfsdk.plugins import installed_registry

        classes = installed_registry().collectors
    collectors, meta, merge_errors = merge_collectors(payloads, classes)
    ranks = [
        RankResult(rank=p["rank"], world_size=p["world_size"], hostname=p["hostname"], status=p["status"],  # type: ignore[arg-type]
                   collectors=p["collectors"], errors=[ErrorRecord.model_validate(e) for e in p["errors"]])
        for p in payloads
    ]
    errors = list(result.errors) + merge_errors
    for p in payloads[1:]:
        for e in p["errors"]:
            errors.append(ErrorRecord.model_validate({**e, "source": f"rank{p['rank']}:{e['source']}"}))
    status = _worst([p["status"] for p in payloads] + (["partial"] if merge_errors else []))
    workload = result.workload
    wls = [p["workload"] for p in payloads if p.get("workload")]
    if workload is not None and wls:
        workload = WorkloadInfo.model_validate({
            **workload.model_dump(mode="json"),
            "num_prompts": sum(int(w.get("num_prompts") or 0) for w in wls),
            "prompts_filtered": sum(int(w.get("prompts_filtered") or 0) for w in wls),
        })
    env = result.environment
    extra = dict(env.extra)
    extra["distributed"] = {
        "world_size": len(payloads),
        "hosts": sorted({p["hostname"] for p in payloads}),
        "merged": sorted(k for k, m in meta.items() if m.scope == "merged"),
        "rank0_only": sorted(k for k, m in meta.items() if m.scope == "rank0-only"),
    }
    series: dict[str, list[dict[str, Any]]] = {}
    for p in payloads[1:]:
        for name, rows in p["series"].items():
            series[f"rank{p['rank']}.{name}"] = rows
    full_meta = {**result.collector_meta, **{k: (result.collector_meta[k].model_copy(update={"scope": m.scope, "ranks": m.ranks})
                                               if k in result.collector_meta else m) for k, m in meta.items()}}
    out = result.model_copy(update={
        "collectors": collectors, "ranks": ranks, "errors": errors, "status": status, "workload": workload,
        "environment": env.model_copy(update={"extra": extra}), "collector_meta": full_meta,
    })
    return RunResult.model_validate(out.model_dump()), series


def _store_alone(session: Any, result: RunResult, info: RankInfo) -> RunResult:
    """This rank's own run: rank 0 keeps the run id, rank N stores ``<run id>-rank<N>``."""
    if info.is_main:
        return result.model_copy(update={"tags": {**result.tags, "rank": "0"}})
    session.store_dir = info.store_dir
    return result.model_copy(update={"tags": {**result.tags, "rank": str(info.rank)},
                                     "run_id": f"{result.run_id}-rank{info.rank}"})


def post_process(session: Any, result: RunResult) -> RunResult:
    """At finalize (``perfsdk_session_result``): gather to rank 0 and aggregate there.

    On rank 0 returns the aggregated run; on other ranks their own result (not stored).
    """
    info: RankInfo | None = getattr(session, "rank_info", None)
    if info is None or not info.is_distributed or not info.gather_ok:
        return result
    if any(e.source == "interrupt" for e in result.errors):
        # The launcher is tearing the job down: the other ranks may be gone, so no collective
        # that could hang; every rank stores what it measured on its own.
        log.warning("interrupted: storing this rank's run without gathering", rank=info.rank)
        return _store_alone(session, result, info)
    try:
        payloads = gather_to_main(rank_payload(session, result), info)
    except Exception as exc:
        log.error("gathering ranks failed", rank=info.rank, error=repr(exc))
        err = ErrorRecord(source="distributed", type=type(exc).__name__, message=f"gather failed: {exc}")
        out = result.model_copy(update={"errors": [*result.errors, err],
                                        "status": "failed" if result.status == "failed" else "partial"})
        shutdown(info)
        return _store_alone(session, out, info)
    if not info.is_main or payloads is None:
        shutdown(info)
        return result
    try:
        classes = {**session.registry.collectors, **{n: type(c) for n, c in session.collectors.items()}}
        out, extra_series = aggregate(result, payloads, classes)
        session.series.update(extra_series)
    except Exception as exc:  # a bug in aggregation must not lose rank 0's run
        log.error("aggregating ranks failed", error=repr(exc))
        err = ErrorRecord(source="distributed", type=type(exc).__name__, message=f"aggregation failed: {exc}")
        out = result.model_copy(update={"errors": [*result.errors, err], "status": "partial"
                                        if result.status == "ok" else result.status})
    shutdown(info)
    return out


# -- the session plugin ----------------------------------------------------------------------

from perfsdk.plugins import hookimpl  # noqa: E402


@hookimpl
def perfsdk_session_configure(session: Any) -> None:
    """Rank detection, process group and a shared run id for every session."""
    session.rank_info = attach(session)


@hookimpl
def perfsdk_session_result(session: Any, result: RunResult) -> RunResult:
    """Rank 0's run gathered from every rank (single-process runs pass through)."""
    return post_process(session, result)

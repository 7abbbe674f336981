"""Memory of long runs, without waiting for them: synthetic time fed straight to the probes.

Part A — a 30-minute run sampled at 10 Hz (18,000 samples): the sampler probes of the memory
and utilization collectors, and a probe that keeps its rows in a ``BoundedSeries``, are called
with synthetic timestamps 0.1 s apart (the sampler thread is stopped; nothing sleeps). Python
heap growth is measured with ``tracemalloc`` at 3, 30 and (for the bounded series) 300 minutes.

Part B — a million-token run: synthetic ``Step`` objects (the per-token timestamps a real
``generate`` would produce) go through the session's ``perfsdk_after_generate`` dispatch into
the latency collector, then the session finalizes (series capping included). Reported: heap held
by the steps, and the peak during finalize.

Usage: ``python benchmarks/bounded_memory.py [--quick]``. Figures depend on the Python version,
not on the machine's speed; ``tracemalloc`` counts Python allocations only, RSS is reported beside.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import tracemalloc
from typing import Any

import psutil

MB = 1024 * 1024
PROC = psutil.Process()


def _heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _session(collectors: dict[str, Any]) -> Any:
    import perfsdk

    cfg = {"collectors": {"energy": False, "utilization": False, "memory": False, "latency": False, **collectors},
           "exporters": []}
    s = perfsdk.session(cfg, store=None)
    s.start()
    s.sampler.stop()  # the probes are driven by hand below, with synthetic time
    return s


def sampling(minutes_list: list[float], hz: float = 10.0) -> dict[str, Any]:
    """Heap growth of each sampler probe over a long synthetic run."""
    from perfsdk.series import BoundedSeries

    out: dict[str, Any] = {}
    probes: dict[str, Any] = {}
    s_mem = _session({"memory": {"interval_s": 0.1}})
    probes["memory"] = (s_mem, [p for p in s_mem.sampler._probes if p.name == "memory.rss"][0].fn)
    s_util = _session({"utilization": {"interval_s": 0.1}})
    probes["utilization"] = (s_util, [p for p in s_util.sampler._probes if p.name == "utilization"][0].fn)
    bounded = BoundedSeries(10_000)

    def bounded_probe(t_ns: int) -> None:
        bounded.append({"t_s": t_ns / 1e9, "phase": "decode", "rss_bytes": 123456789, "cpu_pct": 50.0})

    probes["bounded_series"] = (None, bounded_probe)
    for name, (sess, fn) in probes.items():
        limits = minutes_list if name == "bounded_series" else [m for m in minutes_list if m <= 30]
        tracemalloc.start()
        base, rss0 = _heap(), PROC.memory_info().rss
        t0 = time.perf_counter()
        k, rows = 0, {}
        t_origin = sess.clock.now_ns() if sess is not None else 0
        for minutes in limits:
            target = int(minutes * 60 * hz)
            while k < target:
                fn(t_origin + int(k * 1e9 / hz))
                k += 1
            rows[f"{minutes:g}min"] = {"samples": k, "heap_growth_bytes": _heap() - base,
                                      "rss_growth_bytes": PROC.memory_info().rss - rss0}
        tracemalloc.stop()
        wall = time.perf_counter() - t0
        out[name] = {"points": rows, "wall_s": round(wall, 2), "s_per_sample_incl_tracemalloc": round(wall / max(k, 1), 6)}
        if name == "bounded_series":
            out[name]["kept_rows"] = len(bounded)
            out[name]["stride"] = bounded.stride
        if sess is not None:
            sess.finalize()
    return out


def million_tokens(batch: int, new_tokens: int = 128, total: int = 1_000_000) -> dict[str, Any]:
    """Latency collector over ``total`` generated tokens in synthetic steps."""
    from perfsdk.events import Step

    s = _session({"latency": {}})
    steps = total // (batch * new_tokens)
    tracemalloc.start()
    base, rss0 = _heap(), PROC.memory_info().rss
    t = s.clock.now_ns()
    for i in range(steps):
        st = Step(kind="generate", index=i, batch_size=batch, input_tokens=[32] * batch)
        st.start_ns = t
        st.token_times_ns = [t + 2_000_000 + k * 1_000_000 for k in range(new_tokens)]
        st.end_ns = st.token_times_ns[-1] + 100_000
        st.output_tokens = [new_tokens] * batch
        st.gen_kwargs = {"max_new_tokens": new_tokens}
        t = st.end_ns + 10_000
        s.steps.append(st)
        s._dispatch("perfsdk_after_generate", session=s, step=st)
    held = _heap() - base
    tracemalloc.reset_peak()
    s.finalize()
    _, peak = tracemalloc.get_traced_memory()
    after = _heap() - base
    tracemalloc.stop()
    lat = s.result.collectors["latency"]
    meta = json.loads(s.artifacts.get("series_meta.json", b"{}") or b"{}")
    return {"batch": batch, "steps": steps, "output_tokens": lat["output_tokens"], "itl_samples": lat["itl_s"]["count"],
            "heap_held_by_steps_bytes": held, "finalize_peak_heap_bytes": peak,
            "heap_after_finalize_bytes": after, "rss_growth_bytes": PROC.memory_info().rss - rss0,
            "token_times_rows": {k: v for k, v in meta.get("token_times", {}).items()}
            or {"rows_kept": len(s.series.get("token_times", []))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (smoke test)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    minutes = [0.3, 3] if args.quick else [3, 30, 300]
    total = 20_000 if args.quick else 1_000_000
    report = {"sampling_10hz": sampling(minutes), "tokens": [million_tokens(1, total=total),
                                                              million_tokens(8, total=total)]}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

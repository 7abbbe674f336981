"""The terminal summary of a run (rich tables), used by ``perfsdk run``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from perfsdk.schemas import RunResult


def fmt_s(v: float | None) -> str:
    """Seconds with a readable unit."""
    if v is None:
        return "-"
    if v < 1e-3:
        return f"{v * 1e6:.1f} µs"
    if v < 1:
        return f"{v * 1e3:.2f} ms"
    return f"{v:.3f} s"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.1f} {unit}" if unit != "B" else f"{int(v)} B"
        v /= 1024
    return str(v)


def fmt_num(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1e12:
        return f"{v / 1e12:.{digits}f} T"
    if abs(v) >= 1e9:
        return f"{v / 1e9:.{digits}f} G"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.{digits}f} M"
    return f"{v:,.{digits}f}"


def latency_table(lat: dict[str, Any]) -> Table:
    t = Table(title="Latency", show_edge=False)
    for col in ("metric", "count", "mean", "p50", "p90", "p95", "p99", "max"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "e2e"),
                       ("prefill_s", "prefill"), ("decode_s", "decode"), ("forward_s", "forward")):
        st = lat.get(key) or {}
        if not st.get("count"):
            continue
        flag = " *" if st.get("low_sample_count") else ""
        t.add_row(label + flag, str(st["count"]), *(fmt_s(st.get(k)) for k in ("mean", "p50", "p90", "p95", "p99", "max")))
    for name, st in (lat.get("stages") or {}).items():
        if st.get("count"):
            t.add_row(f"stage:{name}", str(st["count"]), *(fmt_s(st.get(k)) for k in ("mean", "p50", "p90", "p95", "p99", "max")))
    return t


def headline_rows(run: RunResult) -> list[tuple[str, str]]:
    """Key figures as (label, value) rows."""
    c = run.collectors
    rows: list[tuple[str, str]] = []
    lat = c.get("latency") or {}
    if lat:
        rows += [
            ("output tokens/s", fmt_num(lat.get("output_tokens_per_s"))),
            ("total tokens/s", fmt_num(lat.get("total_tokens_per_s"))),
            ("requests/s", fmt_num(lat.get("requests_per_s"))),
            ("tokens in / out", f"{lat.get('input_tokens', 0)} / {lat.get('output_tokens', 0)}"),
            ("steps (warm-up)", f"{lat.get('steps', 0)} ({lat.get('warmup_steps', 0)})"),
            ("load time", fmt_s(lat.get("load_s"))),
        ]
    mem = c.get("memory") or {}
    if mem:
        rows += [("peak RSS", fmt_bytes(mem.get("rss_peak_bytes"))), ("weights", fmt_bytes(mem.get("weights_bytes"))),
                 ("KV cache (largest batch)", fmt_bytes(mem.get("kv_cache_bytes")))]
        if mem.get("cuda_peak_allocated_bytes") is not None:
            rows.append(("CUDA peak allocated", fmt_bytes(mem.get("cuda_peak_allocated_bytes"))))
    en = c.get("energy") or {}
    if en:
        jpt = en.get("j_per_output_token")
        if isinstance(jpt, (int, float)):
            rows.append(("energy J/token (measured)", f"{jpt:.4g}"))
            for phase, v in (en.get("j_per_output_token_per_phase") or {}).items():
                if phase in ("prefill", "decode") and isinstance(v, (int, float)):
                    rows.append((f"  {phase} J/token", f"{v:.4g}"))
        else:
            missing = [r.split(":", 1)[0] for r in en.get("reasons") or []]
            rows.append(("energy (measured)", f"unavailable: {', '.join(missing) or 'no source'} (see perfsdk doctor)"))
        cc = en.get("codecarbon") or {}
        if cc.get("energy_j") is not None:
            rows.append(("CodeCarbon estimate (session)",
                         f"{cc['energy_j']:.4g} J, {cc.get('co2_kg', 0) * 1e3:.3g} g CO2 ({cc.get('country_iso_code') or '?'})"))
    fl = c.get("flops") or {}
    if fl:
        rows.append(("FLOPs prefill / decode", f"{fmt_num(fl.get('flops_prefill'))} / {fmt_num(fl.get('flops_decode'))}"))
        if fl.get("mfu_pct") is not None:
            rows.append(("MFU", f"{fl['mfu_pct']:.2f} %"))
    return rows


def print_summary(run: RunResult, console: Console | None = None, run_dir: str | None = None) -> None:
    """Print the run's summary tables."""
    console = console or Console()
    status_style = {"ok": "green", "partial": "yellow", "failed": "red"}[run.status]
    model = run.model.model_id if run.model else "-"
    console.print(f"[bold]{run.name}[/] run [cyan]{run.run_id}[/] status [{status_style}]{run.status}[/]  model {model}")
    wl = run.workload
    if wl is not None and wl.prompts_filtered:
        limit = f" ({wl.max_input_tokens} tokens)" if wl.max_input_tokens else ""
        console.print(f"[yellow]note[/] {wl.prompts_filtered} of {wl.prompts_filtered + (wl.num_prompts or 0)} prompts "
                      f"left out: longer than workload.max_input_tokens{limit}")
    lat = run.collectors.get("latency")
    if lat:
        console.print(latency_table(lat))
    t = Table(title="Summary", show_header=False, show_edge=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for label, value in headline_rows(run):
        t.add_row(label, value)
    console.print(t)
    from perfsdk.collectors.profiling_plugin import profiling_tables

    for table in profiling_tables(run.collectors):
        console.print(table)
    from perfsdk.simulation.plugin import simulation_tables

    for table in simulation_tables(run.collectors):
        console.print(table)
    if lat and any((lat.get(k) or {}).get("low_sample_count") for k in ("ttft_s", "tpot_s")):
        console.print("* fewer than 100 samples: tail percentiles (p95/p99) are extrapolations")
    for err in run.errors:
        console.print(f"[red]error[/] {err.source}{'/' + err.hook if err.hook else ''}: {err.type}: {err.message}")
    if run_dir:
        console.print(f"stored in {run_dir}")

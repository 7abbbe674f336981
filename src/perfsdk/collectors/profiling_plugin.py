"""Built-in plugin: the opt-in ``layers`` and ``torch_profiler`` collectors."""

from __future__ import annotations

from typing import Any, Callable

from perfsdk.collectors.layers import LayersCollector
from perfsdk.collectors.torch_profiler import TorchProfilerCollector
from perfsdk.plugins import hookimpl


@hookimpl
def perfsdk_register_collectors(register: Callable[[type], None]) -> None:
    """Register the per-layer timing and operator profiling collectors."""
    register(LayersCollector)
    register(TorchProfilerCollector)


from perfsdk.fmt import fmt_ms as _ms
from perfsdk.fmt import fmt_pct as _pct


def profiling_tables(collectors: dict[str, Any], max_rows: int = 15) -> list[Any]:
    """Rich tables for a run's ``layers`` and ``torch_profiler`` results (empty when absent)."""
    return layers_tables(collectors.get("layers"), max_rows) + profiler_tables(collectors.get("torch_profiler"), max_rows)


def layers_tables(lay: dict[str, Any] | None, max_rows: int = 15) -> list[Any]:
    """Rich tables of a ``layers`` result (its JSON form): per-phase module times, coverage."""
    from rich.table import Table

    tables: list[Any] = []
    if lay and lay.get("status") == "ok":
        for phase in ("encode", "prefill", "decode", "forward"):
            rows = [r for r in lay.get("modules", []) if r["phase"] == phase and r["depth"] > 0]
            if not rows:
                continue
            ph = next((p for p in lay.get("phases", []) if p["phase"] == phase), None)
            title = f"Layers — {phase}"
            if ph:
                title += f" ({ph['forwards']} forwards, {_ms(ph['total_s'])} ms)"
            t = Table(title=title)
            for col, just in (("module", "left"), ("type", "left"), ("calls", "right"), ("total ms", "right"),
                              ("mean ms", "right"), ("% step", "right"), (f"% {phase}", "right")):
                t.add_column(col, justify=just)  # type: ignore[arg-type]
            for r in sorted(rows, key=lambda r: -r["total_s"])[:max_rows]:
                t.add_row(r["path"], r["module_type"], str(r["calls"]), _ms(r["total_s"]), _ms(r["mean_s"]),
                          _pct(r["share_pct"]), _pct(r.get("phase_share_pct")))
            tables.append(t)
        t = Table(title="Layers — coverage and overhead", show_header=False)
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("instrumented steps", f"{lay['steps_instrumented']} ({lay['steps_selection']})")
        t.add_row("coverage of step time", f"{_pct(lay.get('coverage_pct'))} %")
        t.add_row("coverage of model forward time", f"{_pct(lay.get('forward_coverage_pct'))} %")
        ovh = lay.get("overhead_pct")
        t.add_row("overhead vs un-instrumented steps", f"{ovh:.1f} %" if ovh is not None else "n/a")
        t.add_row("time inside hooks", f"{_pct(lay.get('hook_time_pct'))} %")
        tables.append(t)
    return tables


def profiler_tables(prof: dict[str, Any] | None, max_rows: int = 15) -> list[Any]:
    """Rich table of a ``torch_profiler`` result (its JSON form): the top operators."""
    from rich.table import Table

    tables: list[Any] = []
    if prof and prof.get("status") == "ok":
        cuda = prof.get("sort_by") == "self_cuda_time_s"
        t = Table(title=f"Top operators ({prof['steps_profiled']} profiled steps, by {prof['sort_by']})")
        cols = ["operator", "calls", "self CPU ms", "CPU total ms"] + (["self CUDA ms"] if cuda else []) + ["%"]
        for i, col in enumerate(cols):
            t.add_column(col, justify="left" if i == 0 else "right")
        for r in prof.get("operators", [])[:max_rows]:
            cells = [r["name"], str(r["calls"]), _ms(r["self_cpu_time_s"]), _ms(r["cpu_time_total_s"])]
            if cuda:
                cells.append(_ms(r.get("self_cuda_time_s")))
            cells.append(_pct(r["share_pct"]))
            t.add_row(*cells)
        tables.append(t)
    return tables

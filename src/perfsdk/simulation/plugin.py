"""The simulation plugin: the ``simulation`` collector and the ``simulate``, ``hardware`` and
``calibrate`` commands. Built in, registered through the same hooks as third-party plugins."""

from __future__ import annotations

import json
from typing import Any

import click
import structlog
from pydantic import Field

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.hardware.catalog import Catalog
from perfsdk.hardware.profile import HardwareProfile, HardwareProfileError, profile_to_yaml
from perfsdk.plugins import hookimpl
from perfsdk.simulation.mapping import MappingError, mapping_from
from perfsdk.simulation.predictor import SimulationResult, Simulator, rescale_ops, simulate_model

log = structlog.get_logger("perfsdk.simulation")


# -- collector ------------------------------------------------------------------------------------


class SimulationConfig(CollectorConfig):
    """Settings of the ``simulation`` collector."""

    targets: list[str] = Field(default_factory=list, description="Profiles to predict for (names or YAML paths)")
    host: str | None = Field(default=None, description="Profile of the measured device (default: host-cpu on CPU, "
                                                        "the matching GPU profile on CUDA)")
    mapping: dict[str, Any] | str | None = Field(default=None, description="Mapping (inline or a YAML path)")
    hardware_files: list[str] = Field(default_factory=list, description="Extra profile files")
    dtype: str | None = Field(default=None, description="Predict as if run in this dtype (default: as measured)")
    top_n: int = Field(default=5, ge=0, description="Layers listed per phase and target")


class LayerSummary(CollectorResult):
    name: str
    phase: str
    time_s: float
    bound: str


class TargetPrediction(CollectorResult):
    """Predicted performance of the captured step on one profile."""

    ttft_s: float
    tpot_s: float | None
    output_tokens_per_s: float
    energy_j_per_output_token: float
    fits_in_memory: bool
    prefill_time_s: float
    decode_time_s: float
    prefill_avg_power_w: float | None
    decode_avg_power_w: float | None
    top_layers: list[LayerSummary] = Field(default_factory=list)


class PhaseError(CollectorResult):
    measured_s: float | None
    predicted_s: float | None
    error_pct: float | None


class SimulationCollectorResult(CollectorResult):
    """Predictions for each target and, for the measured device, predicted vs measured."""

    status: str = "ok"
    reason: str | None = None
    captured_step: int | None = None
    captured_ops: int = 0
    op_source: str = "captured"
    note: str = ("ops captured by replaying the first measured generate step after the run (same inputs, same "
                 "number of tokens), so no measured window carries capture overhead")
    batch_size: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    measured_profile: str | None = None
    predictions: dict[str, TargetPrediction] = Field(default_factory=dict)
    comparison: dict[str, PhaseError] = Field(default_factory=dict)
    errors: dict[str, str] = Field(default_factory=dict)


def _guess_measured_profile(device: Any) -> str:
    if device is not None and getattr(device, "type", str(device)) == "cuda":
        try:
            import torch

            name = torch.cuda.get_device_name(device).lower()
        except Exception:
            name = ""
        for key, prof in (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"), ("a100", "a100-80gb-sxm"),
                          ("l4", "l4")):
            if key in name:
                return prof
    return "host-cpu"


def _summarize(res: SimulationResult, top_n: int) -> TargetPrediction:
    return TargetPrediction(
        ttft_s=res.ttft_s, tpot_s=res.tpot_s, output_tokens_per_s=res.output_tokens_per_s,
        energy_j_per_output_token=res.energy_j_per_output_token, fits_in_memory=res.fits_in_memory,
        prefill_time_s=res.phases["prefill"].time_s, decode_time_s=res.phases["decode"].time_s,
        prefill_avg_power_w=res.phases["prefill"].avg_power_w, decode_avg_power_w=res.phases["decode"].avg_power_w,
        top_layers=[LayerSummary(name=l.name, phase=l.phase, time_s=l.time_s, bound=l.bound)
                    for ph in ("prefill", "decode") for l in [x for x in res.layers if x.phase == ph][:top_n]],
    )


def _err(pred: float | None, meas: float | None) -> PhaseError:
    e = 100.0 * (pred - meas) / meas if pred is not None and meas else None
    return PhaseError(measured_s=meas, predicted_s=pred, error_pct=e)


class SimulationCollector(Collector):
    """Predicts the measured workload on other hardware, and checks the prediction on this one.

    Opt-in. After the run, the first measured ``generate`` step is replayed once under operation
    capture (outside every measured window); its ops are costed on each target profile and on the
    measured device's profile, whose prediction is compared with the step's measurement.
    """

    name = "simulation"
    Config = SimulationConfig
    Result = SimulationCollectorResult
    default_enabled = False
    description = "Predicted TTFT/TPOT/energy on other hardware profiles; predicted vs measured here"

    def __init__(self, config: SimulationConfig | None = None) -> None:
        super().__init__(config)
        self._step: Any = None

    @hookimpl
    def perfsdk_after_generate(self, session: Any, step: Any) -> None:
        if self._step is None and step.kind == "generate" and not step.warmup and step.error is None \
                and len(step.token_times_ns) >= 1:
            self._step = step

    def _replay(self, step: Any) -> list[Any]:
        import torch

        from perfsdk.capture import OperationCapture

        kwargs = dict(step.inputs)
        kwargs.update(step.gen_kwargs or {})
        n = len(step.token_times_ns)
        kwargs["max_new_tokens"] = n
        kwargs["min_new_tokens"] = n
        kwargs.pop("streamer", None)
        kwargs.pop("max_length", None)
        with torch.inference_mode(), OperationCapture(step.model, auto_phase=True) as cap:
            step.model.generate(**kwargs)
        return cap.records

    @hookimpl
    def perfsdk_finalize(self, session: Any) -> SimulationCollectorResult:
        cfg: SimulationConfig = self.config  # type: ignore[assignment]
        step = self._step
        if step is None:
            return SimulationCollectorResult(status="unavailable", reason="no measured generate step to simulate")
        try:
            ops = self._replay(step)
        except Exception as exc:
            return SimulationCollectorResult(status="unavailable", reason=f"operation capture failed: {exc!r}")
        target_ops = rescale_ops(ops, cfg.dtype) if cfg.dtype else ops
        catalog = Catalog.load(cfg.hardware_files)
        mapping = mapping_from(cfg.mapping)
        weight_bytes = None
        try:
            from perfsdk.models.info import weight_bytes as _wb

            weight_bytes = int(_wb(step.model))
        except Exception:
            pass
        b = step.batch_size
        in_tok = max((o.context_len or 0) for o in ops if o.phase == "prefill") if ops else None
        measured_name = cfg.host or _guess_measured_profile(getattr(session, "device", None))
        out = SimulationCollectorResult(captured_step=step.index, captured_ops=len(ops), batch_size=b,
                                        input_tokens=in_tok, output_tokens=len(step.token_times_ns),
                                        measured_profile=measured_name)
        preds: dict[str, TargetPrediction] = {}
        errors: dict[str, str] = {}
        full: dict[str, Any] = {}
        for target in [*cfg.targets, measured_name]:
            if target in preds:
                continue
            try:
                prof = _profile(target, catalog)
                here = target == measured_name  # the measured device: as run, no mapping, no dtype change
                sim = Simulator(prof, None if here else mapping, catalog)
                res = sim.predict(ops if here else target_ops, batch_size=b, input_tokens=in_tok, top_n=cfg.top_n, weight_bytes=weight_bytes,
                                  model=getattr(session.model_info, "model_id", None) if session.model_info else None,
                                  dtype=None if here else cfg.dtype)
            except (HardwareProfileError, MappingError, ValueError) as exc:
                errors[target] = str(exc)
                continue
            preds[target] = _summarize(res, cfg.top_n)
            full[target] = res.model_dump(mode="json")
        comparison: dict[str, PhaseError] = {}
        if measured_name in preds:
            p = preds[measured_name]
            ttft = (step.token_times_ns[0] - step.start_ns) / 1e9
            n = len(step.token_times_ns)
            decode = (step.token_times_ns[-1] - step.token_times_ns[0]) / 1e9 if n > 1 else None
            comparison = {
                "prefill": _err(p.prefill_time_s, ttft),
                "decode": _err(p.decode_time_s if n > 1 else None, decode),
                "tpot": _err(p.tpot_s, decode / (n - 1) if decode is not None else None),
            }
        try:
            session.add_artifact("simulation.json", json.dumps(full, indent=1))
        except Exception as exc:  # the summary in the result is what matters
            log.warning("could not attach simulation details", error=repr(exc))
        return out.model_copy(update={"predictions": preds, "comparison": comparison, "errors": errors})


def _profile(name_or_path: str, catalog: Catalog) -> HardwareProfile:
    if name_or_path.endswith((".yaml", ".yml")):
        from perfsdk.hardware.catalog import get_profile

        return get_profile(name_or_path)
    return catalog.get(name_or_path)


def simulation_tables(collectors: dict[str, Any]) -> list[Any]:
    """Rich tables for a run summary: predictions per target, and predicted vs measured."""
    from rich.table import Table

    res = collectors.get("simulation")
    if not res:
        return []
    if res.get("status") != "ok":
        t = Table(title="Simulation", show_header=False, show_edge=False)
        t.add_row("simulation", f"unavailable: {res.get('reason')}")
        return [t]
    pt = Table(title=f"Simulation (ops of step {res.get('captured_step')}, batch {res.get('batch_size')}, "
                     f"{res.get('input_tokens')} in / {res.get('output_tokens')} out)", show_edge=False)
    for c in ("profile", "TTFT", "TPOT", "tokens/s", "J/token", "fits"):
        pt.add_column(c, justify="right" if c != "profile" else "left")
    for name, p in res.get("predictions", {}).items():
        label = f"{name} (measured here)" if name == res.get("measured_profile") else name
        pt.add_row(label, _fmt_s(p["ttft_s"]), _fmt_s(p["tpot_s"]), f"{p['output_tokens_per_s']:.1f}",
                   f"{p['energy_j_per_output_token']:.3g}", "yes" if p["fits_in_memory"] else "NO")
    tables = [pt]
    comp = res.get("comparison") or {}
    if comp:
        ct = Table(title=f"Predicted vs measured on {res.get('measured_profile')}", show_edge=False)
        for c in ("phase", "measured", "predicted", "error"):
            ct.add_column(c, justify="right" if c != "phase" else "left")
        for ph, e in comp.items():
            err = "-" if e.get("error_pct") is None else f"{e['error_pct']:+.1f}%"
            ct.add_row(ph, _fmt_s(e.get("measured_s")), _fmt_s(e.get("predicted_s")), err)
        tables.append(ct)
    return tables


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(SimulationCollector)


# -- commands -------------------------------------------------------------------------------------


def _fail(msg: str) -> None:
    from perfsdk.terminal import fail

    fail(msg)


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1:
        return f"{v:.3f} s"
    if v >= 1e-3:
        return f"{v * 1e3:.3f} ms"
    return f"{v * 1e6:.1f} us"


@click.command("simulate")
@click.option("--model", "model_spec", required=True, help="Config name (llama-2-7b ...), config.json path, builtin:... or cached HF id")
@click.option("--hardware", default="h100-sxm", show_default=True, help="Profile name or YAML path (the default device)")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False), help="Extra profile YAML files")
@click.option("--mapping", "mapping_file", type=click.Path(dir_okay=False), help="Mapping YAML: layers to devices, transfer points")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--input-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--output-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--dtype", default="bfloat16", show_default=True,
              type=click.Choice(["float32", "float16", "bfloat16", "float8_e4m3fn", "int8", "int4"]))
@click.option("--top", "top_n", default=10, show_default=True, type=click.IntRange(min=0), help="Layers listed per phase")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON")
def simulate_command(model_spec: str, hardware: str, hardware_files: tuple[str, ...], mapping_file: str | None,
                     batch_size: int, input_tokens: int, output_tokens: int, dtype: str, top_n: int,
                     as_json: bool) -> None:
    """Predict TTFT, TPOT, tokens/s, energy and memory fit of MODEL on HARDWARE (analytic ops)."""
    from perfsdk.simulation.shape import resolve_model_shape

    try:
        catalog = Catalog.load(hardware_files)
        profile = _profile(hardware, catalog)
        mapping = mapping_from(mapping_file)
        shape = resolve_model_shape(model_spec)
        sim_profiles = [profile] + ([catalog.get(p) for p in mapping.devices.values()] if mapping else [])
        if not mapping or not mapping.default:
            sim_profiles[0].dtype_key(dtype)
        res = simulate_model(shape, profile, batch_size=batch_size, input_tokens=input_tokens,
                             output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n, catalog=catalog)
    except (HardwareProfileError, MappingError, ValueError) as exc:
        _fail(str(exc))
        return
    if as_json:
        click.echo(res.model_dump_json(indent=2))
        return
    _print_simulation(res)


def _print_simulation(res: SimulationResult) -> None:
    from rich.table import Table

    from perfsdk.terminal import make_console

    con = make_console()
    con.print(f"[bold]{res.model}[/] on [bold]{res.hardware}[/] — batch {res.batch_size}, "
              f"{res.input_tokens} in / {res.output_tokens} out tokens, {res.dtype} ({res.op_source} ops)")
    t = Table(show_header=True)
    for c in ("metric", "value"):
        t.add_column(c)
    t.add_row("TTFT", _fmt_s(res.ttft_s))
    t.add_row("TPOT", _fmt_s(res.tpot_s))
    t.add_row("output tokens/s", f"{res.output_tokens_per_s:.1f}")
    t.add_row("energy per output token", f"{res.energy_j_per_output_token:.4g} J")
    t.add_row("fits in memory", f"{'yes' if res.fits_in_memory else 'NO'} ({res.memory_required_bytes / 1e9:.2f} GB needed)")
    con.print(t)
    pt = Table(title="phases", show_header=True)
    for c in ("phase", "time", "energy J", "avg power W", "bound", "compute", "memory", "transfer", "overhead"):
        pt.add_column(c)
    for name, ph in res.phases.items():
        pt.add_row(name, _fmt_s(ph.time_s), f"{ph.energy_j:.4g}", f"{ph.avg_power_w:.1f}" if ph.avg_power_w else "-",
                   ph.bound, _fmt_s(ph.compute_s), _fmt_s(ph.memory_s), _fmt_s(ph.transfer_s), _fmt_s(ph.overhead_s))
    con.print(pt)
    if len(res.devices) > 1 or not res.fits_in_memory:
        dt = Table(title="devices", show_header=True)
        for c in ("device", "profile", "busy", "weights GB", "KV GB", "capacity GB", "fits"):
            dt.add_column(c)
        for d in res.devices:
            dt.add_row(d.name, d.profile, _fmt_s(d.busy_s), f"{d.weight_bytes / 1e9:.3f}", f"{d.kv_cache_bytes / 1e9:.3f}",
                       f"{d.capacity_bytes / 1e9:.1f}", "yes" if d.fits_in_memory else "NO")
        con.print(dt)
    if res.layers:
        lt = Table(title="top layers by time", show_header=True)
        for c in ("phase", "layer", "device", "time", "share %", "bound"):
            lt.add_column(c)
        for l in res.layers:
            lt.add_row(l.phase, l.name, l.device, _fmt_s(l.time_s), f"{l.share_pct:.1f}", l.bound)
        con.print(lt)


@click.group("hardware")
def hardware_group() -> None:
    """Hardware profiles for the simulation: built-in, from plugins, from files."""


@hardware_group.command("list")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def hardware_list(hardware_files: tuple[str, ...], as_json: bool) -> None:
    """List known hardware profiles."""
    try:
        cat = Catalog.load(hardware_files)
    except HardwareProfileError as exc:
        _fail(str(exc))
        return
    rows: list[dict[str, Any]] = []
    for name in cat.names():
        p = cat.profiles[name]
        peak = p.peak_tflops.available()
        rows.append({"name": name, "kind": p.kind, "variant": p.variant, "origin": cat.origins[name],
                     "memory_bandwidth_gbs": p.memory_bandwidth_gbs, "memory_capacity_gb": p.memory_capacity_gb,
                     "peak_tflops": peak})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    from perfsdk.terminal import make_console, warn

    t = Table(show_header=True)
    for c in ("name", "kind", "memory GB/s", "capacity GB", "peak TFLOPS", "origin"):
        t.add_column(c, no_wrap=c == "name")
    for r in rows:
        peaks = ", ".join(f"{k} {v:g}" for k, v in r["peak_tflops"].items())
        t.add_row(r["name"], r["kind"], f"{r['memory_bandwidth_gbs']:g}", f"{r['memory_capacity_gb']:g}", peaks, r["origin"])
    make_console().print(t)
    for err in cat.errors:
        warn(str(err))


@hardware_group.command("show")
@click.argument("name")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def hardware_show(name: str, hardware_files: tuple[str, ...], as_json: bool) -> None:
    """Show one profile (NAME, or the path of a YAML file)."""
    try:
        prof = _profile(name, Catalog.load(hardware_files))
    except HardwareProfileError as exc:
        _fail(str(exc))
        return
    if as_json:
        click.echo(prof.model_dump_json(indent=2, exclude_none=True))
    else:
        click.echo(profile_to_yaml(prof), nl=False)


@click.command("calibrate")
@click.option("--model", "models", multiple=True,
              default=["builtin:tiny-llama-medium", "builtin:tiny-llama-medium@layers=4",
                       "builtin:tiny-llama-medium@layers=2", "builtin:tiny-llama-medium@layers=1"],
              show_default=True, help="Models to measure (random weights); spec@layers=N changes the depth")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", type=click.IntRange(min=1), help="torch threads (default: torch's)")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="cpu: time with process CPU time (use with --threads 1 on a busy shared machine)")
@click.option("--name", default="host-calibrated", show_default=True, help="Name of the fitted profile")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the profile YAML here (default: stdout)")
@click.option("--json", "as_json", is_flag=True, help="Print the fit (coefficients, in-sample errors) as JSON")
@click.option("--from-store", "from_store", type=click.Path(file_okay=False),
              help="Fit from the measured runs in this store instead of measuring (see --run)")
@click.option("--run", "run_ids", multiple=True, help="With --from-store: only these run ids (default: all runs)")
def calibrate_command(models: tuple[str, ...], repeats: int, threads: int | None, clock: str, name: str,
                      output: str | None, as_json: bool, from_store: str | None, run_ids: tuple[str, ...]) -> None:
    """Fit a host profile (FLOP/s, bandwidth, per-op and per-step overhead) from short measured runs,
    or with --from-store from runs already measured and stored."""
    from perfsdk.simulation.calibration import calibrate_from_store, calibrate_here, profile_from_fit

    def progress(m: Any) -> None:
        click.echo(f"measured {m.model} batch {m.batch_size} in {m.input_tokens} out {m.output_tokens}: "
                   f"TTFT {_fmt_s(m.ttft_s)}, TPOT {_fmt_s(m.tpot_s)}", err=True)

    if run_ids and not from_store:
        _fail("--run needs --from-store")
        return
    try:
        if from_store:
            result, used, skipped = calibrate_from_store(from_store, list(run_ids) or None)
            for note in skipped:
                click.echo(f"skipped {note}", err=True)
            for m in used:
                click.echo(f"using {m.model} batch {m.batch_size} in {m.input_tokens} out {m.output_tokens}: "
                           f"TTFT {_fmt_s(m.ttft_s)}, TPOT {_fmt_s(m.tpot_s)}", err=True)
            note = (f"Stored runs of {from_store}: {', '.join(run_ids) if run_ids else 'all'} "
                    f"({len(used)} measured shapes).")
        else:
            result, _ = calibrate_here(list(models), repeats=repeats, threads=threads, progress=progress, clock=clock)
            note = f"Models: {', '.join(models)}."
        profile = profile_from_fit(result, name=name, note=note)
    except ValueError as exc:
        _fail(str(exc))
        return
    text = profile_to_yaml(profile)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
        click.echo(f"wrote {output}", err=True)
    if as_json:
        click.echo(json.dumps({"coefficients": result.coefficients, "errors_pct": result.errors_pct,
                               "matmul_half_rows": result.matmul_half_rows, "matmul_pack_rows": result.pack_rows,
                               "cache_bytes": result.cache_bytes,
                               "observations": result.observations}, indent=2))
    elif not output:
        click.echo(text, nl=False)


@hookimpl
def perfsdk_register_commands(cli: click.Group) -> None:
    cli.add_command(simulate_command)
    cli.add_command(hardware_group)
    cli.add_command(calibrate_command)

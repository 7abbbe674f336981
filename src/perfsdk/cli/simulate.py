"""``perfsdk simulate``, ``perfsdk hardware list|show|convert`` and ``perfsdk calibrate``."""

from __future__ import annotations

import json
import statistics
from typing import Any

import click
import structlog

from perfsdk.collectors.simulation import _eff, _profile, _window_text, _yes, apply_overrides
from perfsdk.fmt import fmt_s as _fmt_s
from perfsdk.hardware.catalog import Catalog, get_profile, is_profile_path
from perfsdk.hardware.profile import (HardwareProfile, HardwareProfileError, profile_to_yaml, profiles_to_yaml,
                                      read_profile_file)
from perfsdk.plugins import hookimpl
from perfsdk.terminal import wide_option
from perfsdk.simulation.calibration.measure import (DEFAULT_CALIBRATION_MODELS, DEFAULT_MAX_PASSES, DEFAULT_PASSES,
                                                    PASS_SETTLE_PCT)
from perfsdk.simulation.mapping import MappingError, mapping_from
from perfsdk.simulation.predictor import SimulationResult, simulate_model
from perfsdk.stats import percentile

#: Data types ``perfsdk simulate --dtype`` accepts.
SIMULATED_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "int8", "int4")

log = structlog.get_logger("perfsdk.cli.simulate")


# -- commands -------------------------------------------------------------------------------------


def _fail(msg: str) -> None:
    from perfsdk.terminal import fail

    fail(msg)


def _auto_dtype(config: Any, profile: HardwareProfile) -> tuple[str, str]:
    """The dtype ``--dtype auto`` simulates, and why (empty: the one the config states)."""
    stated = getattr(config, "dtype", None)
    name = str(stated).removeprefix("torch.") if stated is not None else ""
    why = "the config states none"
    if name in SIMULATED_DTYPES:
        try:
            profile.dtype_key(name)
            return name, ""
        except HardwareProfileError:
            why = f"the config's {name} has no peak on {profile.name}"
    if profile.kind == "cpu":
        return "float32", f"a cpu profile, {why}"
    return "bfloat16", why


@click.command("simulate")
@click.option("--model", "model_spec", required=True, help="Config name (llama-2-7b ...), config.json path, builtin:... or cached HF id")
@click.option("--hardware", default="h100-sxm", show_default=True,
              help="Profile name or YAML path (the default device); a file may be in perfsdk's format or device-keyed")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False),
              help="Extra profile YAML files (any format): their devices can be named in --hardware and the mapping")
@click.option("--mapping", "mapping_file", type=click.Path(dir_okay=False), help="Mapping YAML: layers to devices, transfer points")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--input-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--output-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--images", default=None, type=click.IntRange(min=0),
              help="Images per sequence of a vision-language model [default: 1]")
@click.option("--dtype", default="auto", show_default=True,
              type=click.Choice(["auto", *SIMULATED_DTYPES]),
              help="auto: the dtype the model's config states, else float32 on a cpu profile (what PyTorch "
                   "runs there by default, and what calibrate measures) and bfloat16 on other devices")
@click.option("--kv-heads", "--num-key-value-heads", "kv_heads", type=click.IntRange(min=1),
              help="Simulate with this many KV heads instead of the model's (must divide the attention heads)")
@click.option("--sliding-window", type=click.IntRange(min=0),
              help="Simulate with this attention window instead of the model's (0: full attention)")
@click.option("--top", "top_n", default=10, show_default=True, type=click.IntRange(min=0), help="Layers listed per phase")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON")
@click.option("--at-current-speed", "current_speed", is_flag=True,
              help="With a profile calibrated on this host: time its reference workload again (three seconds) "
                   "and predict at the machine's speed now rather than the calibration's; the interval "
                   "widens by how far such a window strays from the machine's level")
def simulate_command(model_spec: str, hardware: str, hardware_files: tuple[str, ...], mapping_file: str | None,
                     batch_size: int, input_tokens: int, output_tokens: int, images: int | None, dtype: str,
                     kv_heads: int | None, sliding_window: int | None, top_n: int, as_json: bool,
                     current_speed: bool) -> None:
    """Predict TTFT, TPOT, tokens/s, energy and memory fit of MODEL on HARDWARE (analytic ops).

    Encoder-decoder (T5) and vision-language (LLaVA) models get an encode phase: the encoder, or
    the vision tower and projector; TTFT spans encode and prefill.
    """
    from perfsdk.collectors.flops import analytic_unavailable
    from perfsdk.flops.meta import _architecture_or_none
    from perfsdk.models.resolve import resolve_config
    from perfsdk.simulation.predictor import simulate_config

    dtype_why = ""
    try:
        catalog = Catalog.load(hardware_files)
        profile = _profile(hardware, catalog)
        speed_note = None
        if current_speed:
            from perfsdk.simulation.calibration.measure import at_current_speed

            profile, _, speed_note = at_current_speed(profile)
        mapping = mapping_from(mapping_file)
        config = resolve_config(model_spec)[0]
        base = _architecture_or_none(config)
        if base is None and (kv_heads is not None or sliding_window is not None):
            raise ValueError(f"--kv-heads / --sliding-window: {analytic_unavailable(config)}, and these overrides "
                             f"change the analytic description")
        if dtype == "auto":
            dtype, dtype_why = _auto_dtype(config, profile)
        sim_profiles = [profile] + ([catalog.get(p) for p in mapping.devices.values()] if mapping else [])
        if not mapping or not mapping.default:
            sim_profiles[0].dtype_key(dtype)
        # a calibrated host prices every ATen call of the model's own code: simulate_config counts
        # them (the overrides change the description, so they keep the analytic ops, with a note)
        per_call = profile.call_overhead_s is not None and kv_heads is None and sliding_window is None
        if base is None or per_call:
            res = simulate_config(config, profile, batch_size=batch_size, input_tokens=input_tokens,
                                  output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n,
                                  catalog=catalog, images=images, name=model_spec)
        else:
            arch = apply_overrides(base, kv_heads, sliding_window)
            res = simulate_model(arch, profile, batch_size=batch_size, input_tokens=input_tokens,
                                 output_tokens=output_tokens, dtype=dtype, mapping=mapping, top_n=top_n,
                                 catalog=catalog, images=images, name=model_spec)
    except (HardwareProfileError, MappingError, ValueError) as exc:
        _fail(str(exc))
        return
    notes: list[str] = []
    if speed_note:
        res = res.model_copy(update={"notes": [*res.notes, speed_note]})
    if dtype_why:
        res = res.model_copy(update={"notes": [*res.notes, f"dtype {dtype} ({dtype_why}; --dtype to choose)"]})
    if kv_heads is not None and base is not None:
        notes.append(f"KV heads {arch.num_kv_heads} (model: {base.num_kv_heads})")
    if sliding_window is not None and base is not None:
        notes.append(f"attention window {_window_text(arch)} (model: {_window_text(base)})")
    if notes:
        res = res.model_copy(update={"notes": [*res.notes, "overrides: " + ", ".join(notes)]})
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
    level = res.interval_level
    t = Table(show_header=True)
    for c in ("metric", "value") + ((f"{100 * level:.0f} % interval",) if level else ()):
        t.add_column(c)

    def row(label: str, value: str, metric: str | None = None, fmt: Any = _fmt_s) -> None:
        cells = [label, value]
        if level:
            b = res.interval(metric) if metric else None
            cells.append("-" if b is None else f"{fmt(b[0])} – {fmt(b[1])}")
        t.add_row(*cells)

    if res.ttft_s is not None:
        row("TTFT", _fmt_s(res.ttft_s), "ttft_s")
        row("TPOT", _fmt_s(res.tpot_s), "tpot_s")
    if res.output_tokens_per_s is not None:
        row("output tokens/s", f"{res.output_tokens_per_s:.1f}", "output_tokens_per_s", lambda v: f"{v:.1f}")
    if res.energy_j_per_output_token is not None:
        row("energy per output token", f"{res.energy_j_per_output_token:.4g} J")
    if res.forward_s is not None:
        row("forward pass", _fmt_s(res.forward_s), "forward_s")
    if res.energy_j_per_forward is not None:
        row("energy per forward pass", f"{res.energy_j_per_forward:.4g} J")
    row("fits in memory", f"{_yes(res.fits_in_memory)} ({res.memory_required_bytes / 1e9:.2f} GB needed)")
    con.print(t)
    con.print(f"times: {res.origin_detail or res.origin}")
    if level:
        con.print(f"interval: {100 * level:.0f} % of the measurements this calibration allows for (its coefficients "
                  "refitted on resampled timings, its errors on models and families left out of the fit, how far "
                  "one run strayed on the machine)")
        if res.interval_basis:
            con.print(f"model error: {res.interval_basis}")
        if res.interval_terms:
            con.print(interval_terms_text(res))
    elif res.interval_note:
        con.print(res.interval_note)
    if res.energy_origin:
        con.print(f"energy: {res.energy_origin}")
    pt = Table(title="phases", show_header=True)
    for c in ("phase", "time", "energy J", "avg power W", "bound", "compute", "memory", "transfer", "overhead"):
        pt.add_column(c)
    for name, ph in res.phases.items():
        pt.add_row(name, _fmt_s(ph.time_s), f"{ph.energy_j:.4g}", f"{ph.avg_power_w:.1f}" if ph.avg_power_w else "-",
                   ph.bound, _fmt_s(ph.compute_s), _fmt_s(ph.memory_s), _fmt_s(ph.transfer_s), _fmt_s(ph.overhead_s))
    con.print(pt)
    # always shown: whether each device was costed at its peak or at a stated efficiency
    dt = Table(title="devices", show_header=True)
    for c in ("device", "profile", "busy", "weights GB", "KV GB", "capacity GB", "fits", "compute eff.", "memory eff."):
        dt.add_column(c)
    for d in res.devices:
        cap = "-" if d.capacity_bytes is None else f"{d.capacity_bytes / 1e9:.1f}"
        dt.add_row(d.name, d.profile, _fmt_s(d.busy_s), f"{d.weight_bytes / 1e9:.3f}", f"{d.kv_cache_bytes / 1e9:.3f}",
                   cap, _yes(d.fits_in_memory), f"{d.compute_efficiency:.2f}", f"{d.memory_efficiency:.2f}")
    con.print(dt)
    peak = [d.name for d in res.devices if d.peak_assumed]
    if peak:
        con.print(f"costed at peak (efficiency 1.0): {', '.join(peak)}")
    if res.layers:
        lt = Table(title="top layers by time", show_header=True)
        for c in ("phase", "layer", "device", "time", "share %", "compute", "memory", "transfer", "bound"):
            lt.add_column(c)
        for l in res.layers:
            lt.add_row(l.phase, l.name, l.device, _fmt_s(l.time_s), f"{l.share_pct:.1f}", _fmt_s(l.compute_s),
                       _fmt_s(l.memory_s), _fmt_s(l.transfer_s), l.bound)
        con.print(lt)
    for note in res.notes:
        con.print(f"note: {note}")


@click.group("hardware")
def hardware_group() -> None:
    """Hardware profiles for the simulation: built-in, from plugins, from files."""


@hardware_group.command("list")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
@wide_option
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
                     "peak_tflops": peak, "compute_efficiency": p.compute_efficiency,
                     "memory_efficiency": p.memory_efficiency})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    from perfsdk.terminal import make_console, optional_columns, warn

    t = Table(show_header=True)
    for c in ("name", "kind", "memory GB/s", "capacity GB", "peak TFLOPS", "efficiency", "origin"):
        # a dtype and its peak share a line that never wraps, so the two stay together
        t.add_column(c, no_wrap=c in ("name", "peak TFLOPS"))
    optional_columns(t, "origin")
    for r in rows:
        peaks = "\n".join(f"{k} {v:g}" for k, v in r["peak_tflops"].items())
        cap = "-" if r["memory_capacity_gb"] is None else f"{r['memory_capacity_gb']:g}"
        eff = ("peak" if r["compute_efficiency"] == 1.0 and r["memory_efficiency"] == 1.0 else
               f"{r['compute_efficiency']:g} / {r['memory_efficiency']:g}")
        t.add_row(r["name"], r["kind"], f"{r['memory_bandwidth_gbs']:g}", cap, peaks, eff, r["origin"])
    make_console().print(t)
    for err in cat.errors:
        warn(str(err))


def _file_profiles(path: str) -> list[HardwareProfile]:
    return read_profile_file(path)[0]


@hardware_group.command("show")
@click.argument("name")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def hardware_show(name: str, hardware_files: tuple[str, ...], as_json: bool) -> None:
    """Show a profile: NAME, or every device of the YAML file NAME (perfsdk's fields)."""
    try:
        profs = _file_profiles(name) if is_profile_path(name) else [Catalog.load(hardware_files).get(name)]
    except HardwareProfileError as exc:
        _fail(str(exc))
        return
    if as_json:
        docs = [p.model_dump(mode="json", exclude_none=True) for p in profs]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        click.echo(profiles_to_yaml(profs), nl=False)


@hardware_group.command("convert")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write here (default: stdout)")
def hardware_convert(path: str, output: str | None) -> None:
    """Convert a hardware file (device-keyed, or perfsdk's) to perfsdk's profile format (YAML):
    one profile as a mapping, several as a "profiles" list."""
    try:
        profs = _file_profiles(path)
    except HardwareProfileError as exc:
        _fail(str(exc))
        return
    text = f"# converted by perfsdk hardware convert from {path}\n" + profiles_to_yaml(profs)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
        click.echo(f"wrote {output} ({len(profs)} profile{'s' if len(profs) != 1 else ''}: "
                   f"{', '.join(p.name for p in profs)})", err=True)
    else:
        click.echo(text, nl=False)


#: above this pass-to-pass drift (percent) calibrate says the machine did not hold its speed
CALIBRATION_DRIFT_WARN_PCT = 5.0


def _warn_drift(drift_pct: float | None, normalised_pct: float | None = None, *, isolated: bool = False,
                tracking: float | None = None, passes: tuple[int, int | None] | None = None) -> None:
    """Say how steady the machine was while calibrating, and warn when the drift that remains
    after normalising to the reference workload (or, without one, the raw drift) is large.

    ``isolated``: the calibration already ran on one thread with the CPU clock, so the advice to
    do that is left out. ``passes``: (passes asked for, passes run), said when more were run."""
    if drift_pct is None:
        return
    msg = f"passes: the same configurations ran {drift_pct:.1f} % slower in the slowest pass than in the fastest"
    if passes is not None and passes[1] is not None and passes[1] > passes[0]:
        msg = (f"passes: {passes[1]} ({passes[1] - passes[0]} more than {passes[0]}: the median pass did not yet rest "
               f"on three that agree within {PASS_SETTLE_PCT:g} %); the same configurations ran {drift_pct:.1f} % "
               "slower in the slowest pass than in the fastest")
    remaining = drift_pct
    if normalised_pct is not None:
        msg += f"; {normalised_pct:.1f} % once each was divided by the reference workload timed around it"
        if tracking is not None:
            msg += f" (to the power {tracking:.2f}: how closely the passes followed it)"
        remaining = normalised_pct
    if remaining > CALIBRATION_DRIFT_WARN_PCT:
        msg = (f"warning: this machine's speed moved while calibrating ({msg}): the fitted rates carry what the "
               "reference could not follow, and a calibration repeated now may differ by as much. Calibrate with "
               "nothing else running" + ("" if isolated else ", or with --threads 1 on a shared machine"))
    click.echo(msg, err=True)


def _say_held(result: Any) -> None:
    """The coefficients the micro-kernels measured and the fit kept as they were."""
    row = result.held.get("s_per_weight_row")
    if row is not None:
        click.echo(f"measured, not fitted: {row * 1e9:.1f} ns per stored weight row (two one-row products over "
                   "weights of the same bytes, streamed from memory)", err=True)
        table = result.weight_row_costs
        if table is not None:
            by_length = ", ".join(f"{c:.1f} ns at {b:.0f} B" for b, c in zip(table.row_bytes, table.ns))
            click.echo(f"measured, not fitted: by the row's length, {by_length} (one-row products over weights of "
                       "the same bytes, streamed from memory)", err=True)
    step = result.held.get("step_overhead_s")
    if step is not None:
        click.echo(f"measured, not fitted: {step * 1e3:.3f} ms per forward pass outside the model's forward (the "
                   "generate loop and the session between two forwards, the median decode step)", err=True)


def _say_uncertainty(result: Any) -> None:
    """What the calibration keeps for the intervals of its predictions."""
    if not result.replicates and not result.held_out:
        return
    held = [abs(x) for pair in result.held_out for x in pair]
    typical = f", median |error| {100 * statistics.median(held):.1f} %" if held else ""
    left = (f"{len(result.held_out)} configurations predicted with their model (another family: all of it) left out "
            f"of the fit{typical}" if result.held_out else
            "no model could be left out of the fit (one model measured): its predictions carry no interval")
    whole = [pair for pair, w in zip(result.held_out, result.held_out_whole_family) if w]
    if whole:
        errs = [abs(x) for pair in whole for x in pair]
        left += (f" ({len(whole)} of them with their whole family left out, median |error| "
                 f"{100 * statistics.median(errs):.1f} %: what the interval of a model of a family other than "
                 f"{', '.join(result.families)} draws on, each taken both ways)")
    machine = (f"the machine's level (the reference timed around) at {len(result.levels)} timings" if result.levels
               else "no reference workload was timed (stored runs): no term for the machine's drift")
    if result.run_scatter:
        rel = sorted(result.run_scatter)
        machine += (f"; one run on the raw clock (each configuration's passes over their median, {len(rel)} times) "
                    f"strayed {percentile(rel, 5):.2f}–{percentile(rel, 95):.2f} times (5th–95th percentile), "
                    "the level the intervals draw a run at")
    click.echo(f"uncertainty: {len(result.replicates)} bootstrap refits over configurations and passes; {left}; "
               f"{machine}", err=True)


def _say_level(result: Any) -> None:
    """What the fit's seconds mean: the reference workload's median while calibrating, and how far
    the machine's level around the configurations stood from it. Two calibrations agree in seconds
    no more closely than their medians do."""
    if not result.reference_s:
        return
    spread = ""
    if result.levels:
        rel = sorted(result.levels)
        spread = (f"; the machine's level around the configurations stood at {percentile(rel, 10):.2f}–"
                  f"{percentile(rel, 90):.2f} times it (10th–90th percentile)")
    click.echo(f"seconds: at this machine's speed while calibrating, the reference workload's median of "
               f"{result.reference_s * 1e3:.2f} ms{spread}; a calibration at another moment states every time in "
               "proportion to its own median (perfsdk simulate --at-current-speed rescales to the speed of the "
               "moment)", err=True)
    if result.memory_reference_s:
        click.echo(f"memory reference ({result.memory_reference}): its median {result.memory_reference_s * 1e3:.2f} ms "
                   "while calibrating, timed right after each reference timing; perfsdk simulate --at-current-speed "
                   "scales the memory traffic by its ratio, the memory's rate and the rest's drift apart", err=True)
    if result.compute_reference_s:
        click.echo(f"compute reference ({result.compute_reference}): its median "
                   f"{result.compute_reference_s * 1e3:.2f} ms while calibrating; perfsdk simulate --at-current-speed "
                   "scales the arithmetic by its ratio", err=True)


@click.command("calibrate")
@click.option("--model", "models", multiple=True,
              default=DEFAULT_CALIBRATION_MODELS, show_default=True,
              help="Models to measure (random weights); spec@layers=N changes the depth, spec@hidden=N the width")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Timed calls per configuration in each pass (after a warm-up call)")
@click.option("--passes", default=DEFAULT_PASSES, show_default=True, type=click.IntRange(min=1),
              help="Round-robin passes over all configurations; each configuration's time is the median over them "
                   "(fewer: a shorter calibration that a second one agrees with less closely)")
@click.option("--max-passes", "max_passes", default=DEFAULT_MAX_PASSES, show_default=True, type=click.IntRange(min=1),
              help="Run more passes, one at a time up to this many, while the median pass does not yet rest on "
                   "three passes that agree (after dividing by the reference workload); --max-passes equal to "
                   "--passes runs exactly --passes")
@click.option("--cache/--no-cache", "cache", default=False, show_default=True,
              help="Choose the cache size on a grid with the models' fit (kept only where it also predicts the "
                   "models left out of the fit better) instead of measuring it with the micro-kernels' working sets; "
                   "two calibrations of one machine did not agree on a size chosen that way")
@click.option("--min-time", "min_time", default=0.2, show_default=True, type=click.FloatRange(min=0.0),
              help="Seconds each configuration is timed for at least, per pass (cheap ones are repeated more)")
@click.option("--threads", type=click.IntRange(min=1),
              help="torch threads (default: torch's); the profile predicts runs with as many, and a session "
                   "run with another number is told so")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="wall: what a run measures, and what predictions are of; cpu: process CPU time")
@click.option("--name", default="host-calibrated", show_default=True, help="Name of the fitted profile")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the profile YAML here (default: stdout)")
@click.option("--json", "as_json", is_flag=True, help="Print the fit (coefficients, in-sample errors) as JSON")
@click.option("--from-store", "from_store", type=click.Path(file_okay=False),
              help="Fit from the measured runs in this store instead of measuring (see --run)")
@click.option("--run", "run_ids", multiple=True, help="With --from-store: only these run ids (default: all runs)")
def calibrate_command(models: tuple[str, ...], repeats: int, passes: int, max_passes: int, cache: bool,
                      min_time: float, threads: int | None,
                      clock: str,
                      name: str, output: str | None, as_json: bool, from_store: str | None, run_ids: tuple[str, ...]) -> None:
    """Fit a host profile (FLOP/s, bandwidth, per-op and per-step overhead) from short measured runs,
    or with --from-store from runs already measured and stored."""
    from perfsdk.simulation.calibration import calibrate_from_store, calibrate_here, profile_from_fit
    from perfsdk.simulation.calibration.measure import few_row_text, small_m_text

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
            _say_uncertainty(result)
            note = (f"Stored runs of {from_store}: {', '.join(run_ids) if run_ids else 'all'} "
                    f"({len(used)} measured shapes).")
        else:
            result, _ = calibrate_here(list(models), repeats=repeats, threads=threads, progress=progress, clock=clock,
                                       passes=passes, max_passes=max(passes, max_passes), min_time_s=min_time,
                                       cache=cache)
            note = f"Models: {', '.join(models)}."
            _warn_drift(result.drift_pct, result.normalised_drift_pct, isolated=threads == 1,
                        tracking=result.reference_tracking, passes=(passes, result.passes))
            _say_held(result)
            _say_uncertainty(result)
            _say_level(result)
            if result.tracking_note:
                click.echo(f"memory traffic and the rest, how closely each followed the reference workload (by each "
                           f"phase's share of memory traffic in this fit): {result.tracking_note}" + (
                               "; --at-current-speed scales each by its own" if result.memory_tracking is not None
                               else ""), err=True)
            click.echo(f"decode warm-up: the first decode steps took {result.decode_warmup_steps:.2f} steady steps "
                       "beyond their count (median over the passes of configurations with 8 or more decode steps; "
                       "the fit prices the steady step, predictions add it back by the decode's length)", err=True)
        if result.cache_note:
            click.echo(f"cache: {result.cache_note}", err=True)
        if result.pack_note:
            click.echo(f"repacking: {result.pack_note}", err=True)
        if result.few_rows is not None:
            click.echo(f"few rows: {few_row_text(result.few_rows)}", err=True)
        profile = profile_from_fit(result, name=name, note=note)
        if profile.fresh_write_gbs:
            click.echo(f"fresh memory: {profile.fresh_write_gbs:.1f} GB/s on top of the bytes' own time, written by "
                       "decode steps into outputs that grow with the context (the KV cache concatenated one "
                       "position longer: the allocator maps new pages and each is faulted in)", err=True)
        else:
            click.echo("fresh memory: no cost fitted for outputs that grow with the context", err=True)
        if result.small_m_gaps is not None:
            click.echo(f"layouts: {small_m_text(result.small_m_gaps, profile)}", err=True)
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
                               "matmul_small_m_gaps": (profile.matmul_small_m_gaps.model_dump()
                                                       if profile.matmul_small_m_gaps else None),
                               "cache_bytes": result.cache_bytes, "cache_note": result.cache_note,
                               "cache_shares": (profile.cache_shares.model_dump()
                                                if profile.cache_shares else None),
                               "pack_note": result.pack_note,
                               "matmul_pack_fast_mb": profile.matmul_pack_fast_mb,
                               "matmul_pack_fast_share": profile.matmul_pack_fast_share,
                               "matmul_few_rows": (profile.matmul_few_rows.model_dump()
                                                   if profile.matmul_few_rows else None),
                               "matmul_weight_row_costs": (profile.matmul_weight_row_costs.model_dump()
                                                           if profile.matmul_weight_row_costs else None),
                               "decode_warmup_steps": result.decode_warmup_steps,
                               "drift_pct": result.drift_pct,
                               "normalised_drift_pct": result.normalised_drift_pct, "passes": result.passes,
                               "reference": result.reference, "reference_s": result.reference_s,
                               "reference_tracking": result.reference_tracking,
                               "rest_tracking": result.rest_tracking, "memory_tracking": result.memory_tracking,
                               "tracking_note": result.tracking_note,
                               "memory_reference": result.memory_reference,
                               "memory_reference_s": result.memory_reference_s,
                               "compute_reference": result.compute_reference,
                               "compute_reference_s": result.compute_reference_s,
                               "fixed_cost": "per ATen call" if result.per_call else "per operation",
                               "measured_not_fitted": result.held,
                               "bootstrap_refits": len(result.replicates), "held_out": result.held_out,
                               "held_out_whole_family": result.held_out_whole_family, "families": result.families,
                               "observations": result.observations}, indent=2))
    elif not output:
        click.echo(text, nl=False)


@hookimpl
def perfsdk_register_commands(cli: click.Group) -> None:
    cli.add_command(simulate_command)
    cli.add_command(hardware_group)
    cli.add_command(calibrate_command)


def interval_terms_text(res: SimulationResult) -> str:
    """Each source of the TTFT, TPOT and forward-pass intervals on its own (``interval_terms``), in
    percent of the prediction: what widens an interval most."""
    from perfsdk.simulation.uncertainty import TERM_NAMES, widest_source

    shown = {"ttft_s": "TTFT", "tpot_s": "TPOT", "forward_s": "forward pass"}
    parts = []
    for metric, label in shown.items():
        terms = res.interval_terms.get(metric)
        if terms:
            widest = widest_source({src: (t.low, t.high) for src, t in terms.items()})
            parts.append(f"{label} " + ", ".join(
                f"{TERM_NAMES.get(src, src)} {100 * (t.low - 1):+.0f}…{100 * (t.high - 1):+.0f} %"
                for src, t in terms.items()) + (f" (widest: {TERM_NAMES.get(widest, widest)})" if widest else ""))
    return "each source alone (the others at the prediction): " + "; ".join(parts)

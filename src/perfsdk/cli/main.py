"""The ``perfsdk`` command line (click). Plugins add commands through ``perfsdk_register_commands``.

Exit codes: 0 ok, 1 run failed or partial, 2 invalid config or usage, 130/143 interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click
import structlog
from rich.console import Console

from perfsdk.config import ConfigError, load_config, quickstart_config
from perfsdk.terminal import PerfsdkGroup, echo_error, fail, make_console, warn

log = structlog.get_logger("perfsdk.cli")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SIGNAL_EXIT: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


class RunInterrupted(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM/SIGINT arrives during a run (the session records
    it as an ``interrupt``, like Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def configure_logging(verbose: int = 0) -> None:
    """Library code is quiet: warnings and errors only, unless -v."""
    import logging

    from perfsdk.logs import configure_default, default_level

    level = default_level() if verbose == 0 else (logging.INFO if verbose == 1 else logging.DEBUG)
    configure_default(level, force=True)


def fail_usage(message: str) -> None:
    """Print ``perfsdk: error: message`` and exit 2 (invalid config or usage)."""
    fail(message, EXIT_USAGE)


@click.group(cls=PerfsdkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--plugins", "plugins_allow", default=None, metavar="A,B",
              help="Load only these entry-point plugins (same as PERFSDK_PLUGINS).")
@click.option("--no-plugin-autoload", is_flag=True, help="Do not load entry-point plugins (same as PERFSDK_DISABLE_PLUGIN_AUTOLOAD=1).")
@click.version_option(package_name="perfsdk", prog_name="perfsdk")
def cli(verbose: int, plugins_allow: str | None, no_plugin_autoload: bool) -> None:
    """perfsdk: measure and simulate PyTorch / transformers inference."""
    configure_logging(verbose)
    changes: dict[str, str] = {}
    if plugins_allow is not None:
        changes["PERFSDK_PLUGINS"] = plugins_allow
    if no_plugin_autoload:
        changes["PERFSDK_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if changes:
        # the switches apply to this invocation only (matters when the CLI runs in-process)
        saved = {k: os.environ.get(k) for k in changes}
        os.environ.update(changes)

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        click.get_current_context().call_on_close(restore)


def preflight(cfg: Any) -> None:
    """Checks that need the file system (or a quick look for the Hub), done before anything is
    written, so that invalid input exits 2 with nothing stored."""
    prompts = cfg.workload.prompts
    if not prompts.startswith("builtin:") and not Path(prompts).is_file():
        raise ConfigError(f"workload.prompts: prompt file {prompts} not found")
    mid = cfg.model.id
    served = cfg.model.endpoint is not None  # model.id is then the server's name for the model
    if not served and mid.startswith((".", "/", "~")) and not Path(mid).expanduser().exists():
        raise ConfigError(f"model.id: model folder {mid} not found")
    check_exporters(cfg.exporters)
    from perfsdk.models.loader import check_model_available
    from perfsdk.models.runner import check_workload

    check_workload(cfg)  # bad prompt lines, unknown built-ins, impossible model settings
    if not served:
        check_model_available(cfg.model)  # weights in a local folder; a Hub id cached or reachable


def check_exporters(names: list[str]) -> None:
    """Every exporter named in the config exists (``exporters[i]: unknown exporter``)."""
    from perfsdk.plugins import collect_registry, get_plugin_manager
    from perfsdk.suggest import did_you_mean

    known = collect_registry(get_plugin_manager(), strict=False).exporters
    for i, name in enumerate(names):
        if name not in known:
            raise ConfigError(f"exporters[{i}]: unknown exporter {name!r}{did_you_mean(name, known)} "
                              f"(available: {', '.join(sorted(known))})")


def _install_signal_handlers() -> dict[int, Any]:
    previous: dict[int, Any] = {}

    stopping: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        # Only the first signal stops the run; later ones must not break storing it.
        if stopping:
            return
        stopping.append(signum)
        raise RunInterrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    return previous


@cli.command("run")
@click.argument("config_path", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config field.")
@click.option("--store", "store_dir", default=None, help="Result store folder (default: the config's store field).")
@click.option("--json", "as_json", is_flag=True, help="Print the run result as JSON instead of tables.")
@click.option("--quiet", "-q", is_flag=True, help="No summary, only the run id.")
def run_cmd(config_path: str | None, overrides: tuple[str, ...], store_dir: str | None, as_json: bool, quiet: bool) -> None:
    """Run a benchmark from CONFIG (YAML); without CONFIG, the built-in quickstart."""
    from perfsdk.session import Session

    try:
        if config_path is None:
            cfg = load_config(quickstart_config(), list(overrides))
        else:
            cfg = load_config(config_path, list(overrides))
        if store_dir is not None:
            cfg = cfg.model_copy(update={"store": store_dir})
        preflight(cfg)
        if cfg.workload.load is not None and cfg.workload.load.mode == "sweep":
            sys.exit(execute_load_sweep(cfg, quiet=quiet, as_json=as_json))
        sess = Session(cfg)
    except ConfigError as err:
        fail_usage(str(err))
        return
    code = execute_run(sess, quiet=quiet, as_json=as_json)
    sys.exit(code)


def execute_load_sweep(cfg: Any, quiet: bool = False, as_json: bool = False) -> int:
    """Sweep a served model's load up through saturation (:mod:`perfsdk.experiments.load_sweep`),
    store every point, print the table; returns the exit code (1 when a point failed)."""
    from perfsdk.experiments.load_sweep import LoadSweep, print_load_sweep

    console = make_console()
    say = (lambda msg: None) if quiet or as_json else (lambda msg: console.print(f"[dim]{msg}[/]"))
    sweep = LoadSweep(cfg, cfg.store, progress=say)
    manifest = sweep.run()
    if as_json:
        click.echo(json.dumps(manifest, indent=2, default=str))
    elif quiet:
        click.echo(manifest["sweep_id"])
    else:
        print_load_sweep(manifest, console)
        console.print(f"stored {len(manifest['points']) + len(manifest['repeats'])} runs of sweep "
                      f"{manifest['sweep_id']} in {cfg.store}")
    return EXIT_OK if all(p["status"] == "ok" for p in manifest["points"]) else EXIT_FAILED


def execute_run(sess: Any, quiet: bool = False, as_json: bool = False) -> int:
    """Run the configured workload in ``sess`` and print the summary; returns the exit code.

    Invalid input found only once the run has started (a model that cannot be read, prompts all
    over ``max_input_tokens``) stores nothing: the error is printed once and the code is 2.
    """
    from perfsdk.models.runner import run_workload
    from perfsdk.summary import print_summary

    console = make_console()
    previous = _install_signal_handlers()
    code = EXIT_OK
    failure: str | None = None
    try:
        with _progress(quiet or as_json) as progress:
            try:
                sess.start()
                run_workload(sess, progress=progress)
            except ConfigError as err:
                sess.store_dir = None  # invalid config or usage: no run is stored
                sess.finalize(err)
                echo_error(str(err))
                return EXIT_USAGE
            except BaseException as exc:
                if isinstance(exc, RunInterrupted):
                    sess.interrupted = str(exc)
                    code = SIGNAL_EXIT.get(exc.signum, 130)
                elif isinstance(exc, KeyboardInterrupt):
                    code = 130
                elif isinstance(exc, Exception):  # the run is saved as failed; report and exit 1
                    code = EXIT_FAILED
                    failure = f"run failed: {type(exc).__name__}: {exc}"
                sess.finalize(exc)
                if not isinstance(exc, Exception | KeyboardInterrupt):
                    raise
            else:
                sess.finalize()
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
    result = sess.result
    if result is None:
        if failure:
            echo_error(failure)
        return code or EXIT_FAILED
    rank = getattr(getattr(sess, "rank_info", None), "rank", 0)
    if rank != 0:
        # under torchrun every rank runs this; rank 0 prints the gathered run
        click.echo(f"rank {rank}: run {result.run_id} {result.status} (gathered on rank 0)", err=True)
    elif as_json:
        click.echo(result.model_dump_json(indent=2))
    elif quiet:
        click.echo(result.run_id)
    else:
        print_summary(result, console, sess.run_dir, registry=sess.registry)  # lists the run's errors
        failure = None
    if failure:
        echo_error(failure)
    if code == EXIT_OK and result.status != "ok":
        code = EXIT_FAILED
    return code


class _NoProgress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _progress(disabled: bool) -> Any:
    """A rich progress bar on a terminal (stderr), nothing otherwise."""
    if disabled or not sys.stderr.isatty():
        return _NoProgress()
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    class _Bar:
        def __enter__(self) -> Any:
            self.p = Progress(TextColumn("batches"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                              TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.p.start()
            self.task = self.p.add_task("run", total=None)
            return self.update

        def update(self, done: int, total: int | None) -> None:
            self.p.update(self.task, completed=done, total=total)

        def __exit__(self, *a: Any) -> None:
            self.p.stop()

    return _Bar()


@cli.command("export")
@click.option("--format", "fmt", required=True, help="Output format (json, jsonl, csv, markdown, parquet, or a plugin's).")
@click.option("--output", "-o", default="-",
              help="Output file, or - for standard output; for formats that send runs elsewhere (mlflow), the destination (a tracking URI).")
@click.option("--store", "store_dir", default="perfsdk-results", show_default=True, help="Result store folder.")
@click.option("--run", "run_ids", multiple=True,
              help="Only these runs (repeatable; an id, a unique id prefix or latest); default all.")
@click.option("--name", default=None, help="Only runs with this name.")
@click.option("--status", type=click.Choice(["ok", "partial", "failed"]), default=None, help="Only runs with this status.")
def export_cmd(fmt: str, output: str, store_dir: str, run_ids: tuple[str, ...], name: str | None, status: str | None) -> None:
    """Export stored runs: one row per run, nested fields flattened with dots."""
    from perfsdk.plugins import collect_registry, get_plugin_manager
    from perfsdk.store import Store, StoreError

    reg = collect_registry(get_plugin_manager())
    cls = reg.exporters.get(fmt)
    if cls is None:
        from perfsdk.suggest import did_you_mean

        fail_usage(f"--format: unknown format {fmt!r}{did_you_mean(fmt, reg.exporters)}; "
                   f"valid formats: {', '.join(sorted(reg.exporters))}")
        return
    store = Store(store_dir)
    if not Path(store_dir).is_dir():
        fail_usage(f"--store {store_dir}: no such result store")
    try:
        ids = [store.resolve_run_id(i) for i in run_ids] if run_ids else None  # prefixes and latest too
        runs = store.list_runs(ids, name=name, status=status)
    except StoreError as err:
        fail_usage(str(err))
        return
    exporter = cls()
    if cls.destination:
        if output == "-":
            fail_usage(f"format {fmt} sends runs to a destination: give it with --output (e.g. a tracking URI)")
        ok = exporter.export_to(runs, output, store)
        if ok:
            click.echo(f"exported {len(runs)} run(s) to {output}", err=True)
    elif output == "-":
        if cls.binary:
            if sys.stdout.isatty():
                fail_usage(f"format {fmt} is binary: use --output FILE")
            import io

            buf = io.BytesIO()
            ok = exporter.export(runs, buf)
            sys.stdout.buffer.write(buf.getvalue())
            sys.stdout.flush()
        else:
            import io

            sbuf = io.StringIO()
            ok = exporter.export(runs, sbuf)
            click.echo(sbuf.getvalue(), nl=False)
    else:
        from perfsdk.store import atomic_write

        import io

        buf2: Any = io.BytesIO() if cls.binary else io.StringIO()
        ok = exporter.export(runs, buf2)
        if ok:
            data = buf2.getvalue()
            atomic_write(Path(output), data if isinstance(data, bytes) else data.encode("utf-8"))
            click.echo(f"wrote {len(runs)} run(s) to {output}", err=True)
    if not ok:
        fail(f"exporter {fmt} failed", EXIT_FAILED)


@cli.command("plugins")
@click.option("--all", "show_all", is_flag=True, help="Include the built-in plugins.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plugins_cmd(show_all: bool, as_json: bool) -> None:
    """List installed plugins, what they provide and the distribution each comes from."""
    from rich.table import Table

    from perfsdk.plugins import get_plugin_manager, plugin_inventory

    rows = plugin_inventory(get_plugin_manager(), include_builtin=show_all)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no third-party plugins installed (use --all to list built-ins)")
        return
    t = Table(show_edge=False)
    for col in ("plugin", "distribution", "collectors", "exporters", "backends", "hardware", "hooks"):
        t.add_column(col, no_wrap=col == "plugin")
    for r in rows:
        t.add_row(r["name"], r["distribution"] or "-", ", ".join(r["collectors"]), ", ".join(r["exporters"]),
                  ", ".join(r["backends"]), ", ".join(r["hardware"]),
                  ", ".join(h.replace("perfsdk_", "") for h in r["hooks"]))
    make_console().print(t)


def schema_documents() -> dict[str, dict[str, Any]]:
    """The JSON Schemas perfsdk publishes, by file name."""
    from perfsdk.config import Config
    from perfsdk.schemas import RunResult

    docs = {
        "config.schema.json": Config.model_json_schema(),
        "run-result.schema.json": RunResult.model_json_schema(),
    }
    try:
        from perfsdk.hardware.profile import HardwareProfile

        docs["hardware.schema.json"] = HardwareProfile.model_json_schema()
    except ImportError:
        pass
    for name, doc in docs.items():
        doc.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
        doc.setdefault("$id", f"perfsdk/{name}")
    return docs


@cli.command("schema")
@click.option("--output-dir", default="schemas", show_default=True, help="Folder to write the schemas into.")
def schema_cmd(output_dir: str) -> None:
    """Write JSON Schemas of the config, the run result and the hardware profile."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, doc in schema_documents().items():
        (out / name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        click.echo(f"wrote {out / name}")


@cli.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor_cmd(as_json: bool) -> None:
    """What can be measured here: CUDA, NVML, RAPL, CodeCarbon, bitsandbytes, float8 — and why not."""
    from rich.markup import escape
    from rich.table import Table

    from perfsdk.doctor import run_checks

    checks = run_checks()
    if as_json:
        click.echo(json.dumps([c.model_dump() for c in checks], indent=2))
        return
    # the fix goes under the reason: three columns leave room for long setting names on one line
    t = Table(show_edge=False)
    for col in ("source", "available", "reason and fix"):
        t.add_column(col, no_wrap=col != "reason and fix")
    for c in checks:
        text = escape(c.reason or "") + (f"\n[bold]fix:[/] {escape(c.fix)}" if c.fix else "")
        t.add_row(c.name, "[green]yes[/]" if c.available else "[red]no[/]", text)
    make_console().print(t)


def _prescan_plugin_flags(argv: list[str]) -> None:
    """Honour --plugins / --no-plugin-autoload before plugin commands are registered."""
    for i, a in enumerate(argv):
        if a == "--no-plugin-autoload":
            os.environ["PERFSDK_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        elif a == "--plugins" and i + 1 < len(argv):
            os.environ["PERFSDK_PLUGINS"] = argv[i + 1]
        elif a.startswith("--plugins="):
            os.environ["PERFSDK_PLUGINS"] = a.split("=", 1)[1]
        elif not a.startswith("-"):
            break


_commands_registered = False


def register_plugin_commands() -> None:
    """Let plugins add commands to the ``perfsdk`` group (once per process)."""
    global _commands_registered
    if _commands_registered:
        return
    _commands_registered = True
    from perfsdk.plugins import shared_plugin_manager

    try:
        pm = shared_plugin_manager()
    except Exception as exc:
        warn(f"plugins could not be loaded: {exc}")
        return
    for impl in reversed(pm.hook.perfsdk_register_commands.get_hookimpls()):
        try:
            impl.function(cli=cli)
        except Exception as exc:
            warn(f"plugin {impl.plugin_name} failed to add commands: {exc}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    args = list(sys.argv[1:] if argv is None else argv)
    _prescan_plugin_flags(args)
    configure_logging(0)
    register_plugin_commands()
    cli.main(args=args, prog_name="perfsdk")


if __name__ == "__main__":  # python -m perfsdk.cli.main
    main()

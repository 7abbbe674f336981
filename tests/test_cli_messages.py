"""Docs and messages: one error prefix, "did you mean" hints, plain help texts, a README that
lists every command and whose Python example runs as printed, energy in the report as tables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error" in line.lower()]


@pytest.mark.parametrize("args, needle", [
    (["run", "--set", "workload.batching.batchsize=2"],
     "workload.batching.batchsize: unknown key (did you mean 'batch_size'?)"),
    (["run", "--set", "model.dtyp=float16"], "model.dtyp: unknown key (did you mean 'dtype'?)"),
    (["run", "--set", "collectors.latancy={}"], "collectors.latancy: unknown collector (did you mean 'latency'?)"),
    (["run", "--set", "collectors.energy.sorces=[rapl]"],
     "collectors.energy.sorces: unknown key (did you mean 'sources'?)"),
    (["run", "--set", "exporters=[jsn]"], "exporters[0]: unknown exporter 'jsn' (did you mean 'json'"),
    (["run", "--nope"], "No such option"),
    (["export", "--format", "csvv", "--store", "{tmp}"], "--format: unknown format 'csvv' (did you mean 'csv'?)"),
    (["flops", "gpt2", "--backend", "torhc"], "--backend: unknown backend 'torhc' (did you mean 'torch'?)"),
    (["flops", "no-such-architecture"], "no-such-architecture"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxn"],
     "unknown hardware profile 'h100-sxn' (did you mean 'h100-sxm'"),
    (["hardware", "show", "h200x"], "unknown hardware profile 'h200x' (did you mean 'h200'"),
    (["store", "check", "--store", "{tmp}/nope"], "no such result store"),
    (["runs", "--store", "{tmp}/nope"], "no such result store"),
    (["compare", "a", "b", "--store", "{tmp}/nope"], "no such result store"),
    (["report", "a", "--store", "{tmp}/nope"], "no such result store"),
    (["sweep", "{tmp}/nope.yaml"], "nope.yaml"),
    (["calibrate", "--run", "x"], "--run needs --from-store"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
])
def test_one_error_prefix_and_hints(perfsdk_cli, tmp_path, args, needle):
    r = perfsdk_cli([a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.exit_code == 2, r.output
    errors = _errors(r.output)
    assert len(errors) == 1 and errors[0].startswith("perfsdk: error: "), r.output
    assert needle in errors[0]
    assert not re.search(r"^(Error|perfsdk: (?!error: ))", r.output, re.M)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append(prefix + (name,))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, prefix + (name,))
    return out


def test_help_texts_are_plain(perfsdk_cli):
    from perfsdk.cli import cli

    paths = _commands(cli)
    assert ("store", "repair") in paths and ("runs",) in paths
    for path in [()] + paths:
        r = perfsdk_cli([*path, "--help"])
        assert r.exit_code == 0, path
        assert "`" not in r.output, (path, r.output)
    # every command says what it does, in its own help and in the list of perfsdk --help
    top = perfsdk_cli(["--help"]).output.splitlines()
    for name, cmd in cli.commands.items():
        assert (cmd.help or "").strip(), f"perfsdk {name} has no help text"
        listed = [line for line in top if line.split()[:1] == [name]]
        assert listed and len(listed[0].split()) > 1, (name, listed)
    assert "Per-layer tables of a stored run" in perfsdk_cli(["layers", "--help"]).output
    assert "Fix what 'store check' reports" in perfsdk_cli(["store", "repair", "--help"]).output


def test_readme_lists_every_command():
    from perfsdk.cli import cli, register_plugin_commands

    register_plugin_commands()
    block = README.split("## On the command line", 1)[1].split("```", 2)[1]
    lines = [line.strip() for line in block.splitlines() if line.strip().startswith("perfsdk ")]
    for name, cmd in cli.commands.items():
        mine = [line for line in lines if line.split()[1] == name]
        assert mine, f"README does not show perfsdk {name}"
        if isinstance(cmd, click.Group):
            shown = set(re.split(r"[|\s]+", mine[0].split()[2]))
            assert set(cmd.commands) <= shown, (name, sorted(cmd.commands), mine[0])


def test_readme_python_example_runs_as_printed(tmp_path):
    code = README.split("```python", 1)[1].split("```", 1)[0]
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # run "from the repository root"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.splitlines()
    run_id, status = first.split()
    assert status == "ok"
    assert (tmp_path / "perfsdk-results" / "runs" / run_id / "result.json").is_file()
    assert second.startswith("TTFT p50 (s): ") and float(second.split(": ")[1]) > 0


def test_energy_report_section_is_tables(tmp_path):
    import torch

    import perfsdk
    from perfsdk.collectors.energy import EnergyCollector, EnergyConfig
    from perfsdk.energy.fake import FakeNvmlReader
    from perfsdk.testing import build_tiny_causal_lm

    # +1 J per read from a counter refreshing every 10 µs (the timed steps hold the ten updates a
    # per-token figure needs, however fast the machine)
    reader = FakeNvmlReader(names=["Fake GPU"], energy_mj=[list(range(0, 1_000_000, 1000))], update_period_s=1e-5)
    energy = EnergyCollector(EnergyConfig(codecarbon={"enabled": False}, sources=["nvml"]), nvml_reader=reader)
    model = build_tiny_causal_lm()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with perfsdk.session({"collectors": {"utilization": False}}, store=None, collectors=[energy]) as s:
        s.load(model=model, tokenizer=None)
        for _ in range(2):
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3)
    data = s.result.collectors["energy"]
    section = EnergyCollector.report_section(EnergyCollector.Result.model_validate(data), s.result)
    assert section.title == "Energy"
    html = "".join(section.html)
    assert html.count("<table") == 4  # headline, sources, per window kind and channel, per step
    assert "<caption>Measured energy</caption>" in html and "<caption>Sources</caption>" in html
    assert f"<tr><td>J per output token</td><td>{data['j_per_output_token']:.4g}</td></tr>" in html
    assert f"<tr><td>output tokens (timed steps)</td><td>{data['output_tokens']}</td></tr>" in html
    pp = data["per_phase"]["steps"]["nvml:gpu:0"]
    assert (f"<tr><td>steps</td><td>nvml:gpu:0</td><td>counter</td><td>{pp['energy_j']:.4g}</td>"
            f"<td>{pp['duration_s']:.4g}</td>") in html
    assert "<tr><td>nvml</td><td>yes</td>" in html
    assert "step:" not in html.split("Energy per timed step")[0].split("Energy per window kind")[1]
    assert "per_phase" not in html and "j_per_output_token" not in html  # no dump of flattened keys


def test_sweep_file_key_hint(perfsdk_cli, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("base: {}\naxes: {workload.num_prompts: [1, 2]}\nstratgy: grid\n")
    r = perfsdk_cli(["sweep", str(f), "--store", str(tmp_path / "store")])
    assert r.exit_code == 2
    assert _errors(r.output) == [f"perfsdk: error: {f}: invalid sweep: stratgy: unknown key (did you mean 'strategy' or 'strategies'?)"]

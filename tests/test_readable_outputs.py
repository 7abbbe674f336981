"""Figures and files that say what they are: per-token FLOPs named for what they divide, reports
that never land in the current folder, CPU figures on the axis of their own unit."""

from __future__ import annotations

import json

import pytest

from test_any_family import write_config


def figure_spy():
    """A stand-in for the report's figure factory that keeps the axes it made."""
    from perfsdk.experiments.report import figures

    made = []
    real = figures._figure

    def spy(nrows=1, ncols=1, **kw):
        fig, axes = real(nrows, ncols, **kw)
        made.append(axes)
        return fig, axes

    return spy, made


def test_per_token_flops_say_what_they_include(perfsdk_cli, tmp_path):
    """flops_per_output_token divides every FLOP, the prefill included; flops_per_decode_token
    divides the decode FLOPs by the tokens decode steps produced."""
    folder = write_config(tmp_path, "opt")
    got = json.loads(perfsdk_cli(["flops", folder, "-b", "2", "-t", "8", "-g", "5", "--json"]).output)
    assert got["flops_per_output_token"] == got["flops_total"] / (2 * 5)
    assert got["flops_per_decode_token"] == got["flops_decode"] / (2 * 4)
    assert got["flops_per_decode_token"] < got["flops_per_output_token"]


def test_report_without_output_never_writes_into_the_current_folder(tmp_path, monkeypatch, perfsdk_cli):
    import perfsdk

    with perfsdk.session({"workload": {"num_prompts": 2}, "collectors": {"utilization": False, "energy": False}},
                         store=str(tmp_path / "store")) as s:
        model, tok = s.load()
        s.generate(model, **s.tokenize(tok, ["hello there"]), max_new_tokens=3)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    r = perfsdk_cli(["report", s.result.run_id, "--store", str(tmp_path / "store")])
    assert r.exit_code == 0, r.output
    page = tmp_path / "store" / "reports" / f"{s.result.run_id}.html"
    assert page.is_file() and f"wrote {page}" in r.output
    assert list(cwd.iterdir()) == []


def test_utilisation_figure_draws_process_and_system_cpu_on_their_own_axes():
    """Process CPU is % of one core (up to 200 % on 2 cores), system CPU % of all CPUs: two
    panels, never one axis."""
    pytest.importorskip("matplotlib")
    from unittest import mock

    from perfsdk.experiments.report import figures

    rows = [{"t_s": i * 0.1, "phase": "decode", "cpu_process_pct": 180.0, "cpu_system_pct": 95.0} for i in range(5)]
    spy, made = figure_spy()
    with mock.patch.object(figures, "_figure", spy):
        assert figures.utilization_over_time(rows)
    axes = made[0][:, 0]
    assert [ax.get_ylabel() for ax in axes] == ["process CPU (% of one core)", "system CPU (% of all)"]
    assert [len(ax.get_lines()) for ax in axes] == [1, 1]


def test_the_torch_profiler_collector_prints_no_native_lines(tmp_path):
    """The native profiler writes `USDT: … profiler_start/stop` to file descriptor 2 when it
    starts and stops; a run with the collector prints none of them."""
    import subprocess
    import sys

    script = (
        "import perfsdk\n"
        "cfg = {'workload': {'num_prompts': 2}, 'collectors': {'torch_profiler': {}, 'utilization': False,"
        " 'energy': False}}\n"
        "with perfsdk.session(cfg, store=None) as s:\n"
        "    m, t = s.load()\n"
        "    for _ in range(2):\n"
        "        s.generate(m, **s.tokenize(t, ['hello there']), max_new_tokens=3)\n"
        "    s.run_instrumented()\n"
        "print('profiled', s.result.collectors['torch_profiler']['status'])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "profiled ok" in out.stdout
    assert "USDT:" not in out.stdout + out.stderr


def test_sweep_panel_titles_wrap_instead_of_being_cut_off():
    """A sweep's per-metric panels are 4 inches wide: a long title wraps between words."""
    pytest.importorskip("matplotlib")
    from unittest import mock

    from perfsdk.experiments.report import figures, sweep

    rows = [{"workload.batch_size": bs, "collectors.latency.output_tokens_per_s": 10.0 * bs,
             "collectors.latency.ttft_s.p50": 0.1 * bs, "collectors.latency.ttft_s.p95": 0.2 * bs,
             "collectors.memory.rss_peak_bytes": 2.0 ** 28} for bs in (1, 2, 4)]
    spy, made = figure_spy()
    with mock.patch.object(sweep, "_figure", spy):
        assert sweep.batch_size_panels(rows, [])
    titles = [ax.get_title() for ax in made[0][0]]
    assert titles and all(len(line) <= sweep.PANEL_TITLE_CHARS for t in titles for line in t.split("\n"))
    assert sweep.panel_title("latency: output tokens per s and something much longer") == \
        "latency: output tokens per s and\nsomething much longer"

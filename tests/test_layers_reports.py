"""Per-layer reports of a stored run: ``perfsdk layers RUN`` (layer table, ``--functions``,
``--log``), module settings in the result, and the HTML report section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import perfsdk
from perfsdk.collectors.layers import LayersCollector, LayersResult, module_params
from perfsdk.cli.layers import layers_command


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(100, 200)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(200, 10, bias=False)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.linear2(self.activation(self.linear1(x))))


STEPS = 2
CFG = {"collectors": {"layers": {"steps": {"first": STEPS}, "log_events": True, "per_function": True}}}


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, perfsdk.Session]:
    store = tmp_path_factory.mktemp("store")
    torch.manual_seed(0)
    model = TinyModel().eval()
    with perfsdk.session(CFG, store=str(store)) as s:
        for _ in range(STEPS):
            s.forward(model, torch.rand(1, 100))
    with perfsdk.session(None, store=str(store)) as plain:  # a run without the layers collector
        plain.forward(model, torch.rand(1, 100))
    return store, s.result.run_id, plain


def invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(layers_command, list(args), env={"COLUMNS": "250"})
    return r.exit_code, r.output


def test_module_params() -> None:
    assert module_params(nn.Linear(100, 200)) == {"in_features": 100, "out_features": 200, "bias": True}
    assert module_params(nn.Linear(3, 4, bias=False))["bias"] is False
    conv = module_params(nn.Conv2d(3, 16, 3, stride=2, padding=1))
    assert conv["kernel_size"] == [3, 3] and conv["stride"] == [2, 2] and conv["padding"] == [1, 1]
    assert conv["in_channels"] == 3 and conv["out_channels"] == 16 and conv["groups"] == 1 and conv["bias"] is True
    assert module_params(nn.LayerNorm(64)) == {"normalized_shape": [64], "eps": 1e-5, "elementwise_affine": True,
                                               "bias": True}
    assert module_params(nn.Softmax(dim=-1)) == {"dim": -1}
    assert module_params(nn.Embedding(10, 4)) == {"num_embeddings": 10, "embedding_dim": 4, "padding_idx": None}


def test_result_stores_settings_and_parameters(stored: tuple[Path, str, perfsdk.Session]) -> None:
    store, run_id, _ = stored
    res = perfsdk.store.Store(store).get(run_id).collectors["layers"]
    rows = {r["path"]: r for r in res["modules"]}
    assert rows["linear1"]["params"] == {"in_features": 100, "out_features": 200, "bias": True}
    assert rows["linear1"]["parameters"] == 100 * 200 + 200
    assert rows["linear2"]["params"]["bias"] is False and rows["linear2"]["parameters"] == 200 * 10
    assert rows["(root)"]["parameters"] == 100 * 200 + 200 + 200 * 10
    assert [rows[p]["order"] for p in ("(root)", "linear1", "activation", "linear2", "softmax")] == [0, 1, 2, 3, 4]


def test_layer_table(stored: tuple[Path, str, perfsdk.Session]) -> None:
    store, run_id, _ = stored
    code, out = invoke(run_id, "--store", str(store))
    assert code == 0, out
    assert f"Layers of run {run_id} (2 instrumented step(s), first 2)" in out
    assert "in_features=100, out_features=200, bias=True" in out and "dim=-1" in out
    assert "(1, 100)" in out and "forward ms" in out and "% step" in out
    lines = [line for line in out.splitlines() if line.strip()]
    # the model's order, each module once
    first = [next(i for i, line in enumerate(lines) if f" {name} " in line or line.strip().startswith(name))
             for name in ("linear1", "activation", "linear2", "softmax")]
    assert first == sorted(first)
    code, out = invoke(run_id, "--store", str(store), "--json")
    [(title, rows)] = json.loads(out).items()
    by = {r["module"].strip(): r for r in rows}
    assert set(by) == {"(root)", "linear1", "activation", "linear2", "softmax"}
    assert by["linear2"]["parameters"] == "in_features=200, out_features=10, bias=False"
    assert by["linear1"]["calls"] == str(STEPS) and by["linear1"]["input shapes"] == "(1, 100)"
    assert by["linear1"]["type"] == "Linear" and float(by["(root)"]["% step"]) <= 100.0
    code, out = invoke(run_id, "--store", str(store), "--json", "--sort", "time", "--limit", "2")
    [(title, rows)] = json.loads(out).items()
    assert len(rows) == 2 and rows[0]["module"] == "(root)"  # the top module holds every other call


def test_functions_table(stored: tuple[Path, str, perfsdk.Session]) -> None:
    store, run_id, _ = stored
    code, out = invoke(run_id, "--store", str(store), "--functions", "--json")
    assert code == 0, out
    doc = json.loads(out)
    totals = {r["function"]: r for r in doc["Functions: measured time per kind"]}
    assert set(totals) == {"matmul", "activation", "softmax"}
    # per step: two linear layers, one ReLU, one softmax
    assert (totals["matmul"]["ops"], totals["activation"]["ops"], totals["softmax"]["ops"]) == (
        str(2 * STEPS), str(STEPS), str(STEPS))
    assert float(totals["matmul"]["GFLOP"]) == pytest.approx(STEPS * 2 * (100 * 200 + 200 * 10) / 1e9)
    assert all(float(r["time ms"]) > 0 for r in totals.values())
    ops = {r["operation"]: r for r in doc["Functions: per operation"]}
    assert ops["aten.softmax"]["calls"] == str(STEPS) and ops["aten.relu"]["function"] == "activation"
    code, out = invoke(run_id, "--store", str(store), "--functions")
    assert code == 0 and "Functions: measured time per kind" in out and "aten.linear" in out


def test_event_log(stored: tuple[Path, str, perfsdk.Session]) -> None:
    store, run_id, _ = stored
    code, out = invoke(run_id, "--store", str(store), "--log", "--json")
    assert code == 0, out
    [(title, rows)] = json.loads(out).items()
    assert title == f"Event log: {5 * STEPS} module calls, time-ordered"
    assert [r["module"].strip() for r in rows[:5]] == ["(root)", "linear1", "activation", "linear2", "softmax"]
    # the hooks ran on the instrumented copies of timed steps 0 and 1 (steps 2 and 3 of the session)
    assert [r["step"] for r in rows] == [str(STEPS)] * 5 + [str(STEPS + 1)] * 5
    starts = [float(r["start ms"]) for r in rows[:5]]
    assert starts == sorted(starts)
    assert rows[1]["input shapes"] == "(1, 100)" and rows[3]["input shapes"] == "(1, 200)"
    code, out = invoke(run_id, "--store", str(store), "--log")
    assert code == 0 and "duration ms" in out and "linear2" in out


def test_errors(stored: tuple[Path, str, perfsdk.Session], tmp_path: Path) -> None:
    store, run_id, plain = stored
    code, out = invoke("nope", "--store", str(store))
    assert code == 2 and "nope" in out
    code, out = invoke(plain.result.run_id, "--store", str(store))
    assert code == 2 and "has no layers result" in out
    code, out = invoke(run_id, "--store", str(tmp_path / "none"))
    assert code == 2 and "no such result store" in out


def test_missing_log_and_functions_named(tmp_path: Path) -> None:
    model = TinyModel().eval()
    with perfsdk.session({"collectors": {"layers": {}}}, store=str(tmp_path)) as s:
        s.forward(model, torch.rand(1, 100))
    code, out = invoke(s.result.run_id, "--store", str(tmp_path), "--log")
    assert code == 2 and "set collectors.layers.log_events: true" in out
    code, out = invoke(s.result.run_id, "--store", str(tmp_path), "--functions")
    assert code == 2 and "set collectors.layers.per_function: true" in out


def test_report_section(stored: tuple[Path, str, perfsdk.Session]) -> None:
    store, run_id, _ = stored
    st = perfsdk.store.Store(store)
    run = st.get(run_id)
    result = LayersResult.model_validate(run.collectors["layers"])
    section = LayersCollector.report_section(result, None)
    html = "".join(section.html)
    assert section.title == "Layers"
    assert "<table" in html and "in_features=100, out_features=200, bias=True" in html
    assert "Functions: measured time per kind" in html and "aten.softmax" in html
    assert "perfsdk layers RUN --log" in html  # no stored run to read the series from: a pointer to the command
    # from the stored run, the section reads the run's event log itself
    section = LayersCollector.report_section(result, run)
    html = "".join(section.html)
    assert "Event log" in html and html.count("<tr>") > 5 * STEPS


def test_command_is_registered() -> None:
    from perfsdk.cli import cli, register_plugin_commands

    register_plugin_commands()
    assert "layers" in cli.commands


def test_layers_at_80_columns(tmp_path: Path) -> None:
    """At 80 columns ``layers RUN`` ran to 1 186 lines with headers in two-letter pieces, and
    ``--log`` shrank the module column to nothing: now names stay whole, the columns that do not
    fit are left out with a note, and a long table shows its first rows with a pointer to --all."""
    import perfsdk.cli.layers as layers_cli

    from perfsdk.testing import build_tiny_causal_lm

    model = build_tiny_causal_lm()
    ids = torch.tensor([[5, 6, 7, 8]])
    with perfsdk.session({"collectors": {"layers": {"log_events": True}}}, store=str(tmp_path)) as s:
        s.load(model=model, tokenizer=None)
        s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2)
    rid = s.result.run_id
    code, doc = invoke(rid, "--store", str(tmp_path), "--json")
    [(_, rows)] = json.loads(doc).items()
    paths = [r["module"].strip() for r in rows]  # the model's order

    def narrow(*args: str) -> str:
        r = CliRunner().invoke(layers_command, [rid, "--store", str(tmp_path), *args], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        assert max(len(line) for line in r.output.splitlines()) <= 80 and "…" not in r.output
        return r.output

    out = narrow()
    n = len(paths)
    assert n > layers_cli.SUMMARY_ROWS
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if "━" in line)
    header = {w for line in lines[1:rule] for w in line.split() if w != "┃"}
    assert header == {"module", "calls", "prefill", "decode", "ms", "%", "step"}  # headers break between words only
    shown = [line.split()[0] for line in out.splitlines() if "│" in line]
    assert shown == paths[: layers_cli.SUMMARY_ROWS]  # whole paths, in the model's order
    assert f"first {layers_cli.SUMMARY_ROWS} of {n} rows; --all shows every row" in out
    assert "left out to fit 80 columns: parameters, input shapes, type (--wide shows them)" in out
    assert len(out.splitlines()) < layers_cli.SUMMARY_ROWS + 12
    every = narrow("--all")
    assert [line.split()[0] for line in every.splitlines() if "│" in line] == paths
    wide = CliRunner().invoke(layers_command, [rid, "--store", str(tmp_path), "--wide", "--limit", "3"],
                              env={"COLUMNS": "80"}).output
    assert "LlamaForCausalLM" in wide and "num_embeddings=" in wide and "left out" not in wide  # every column, wider
    log = narrow("--log")
    modules = [line.split("│")[-1].strip() for line in log.splitlines() if "│" in line]
    assert len(modules) == layers_cli.SUMMARY_ROWS and set(modules) <= set(paths) and "model.layers.0" in modules

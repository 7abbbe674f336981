"""Sweeps over any field, scored on any field: weighted objectives, numeric tag axes, model-config
axes, a workload named in the sweep file, strategies compared on shared points, heat maps."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfsdk.experiments.sweep import (Heatmap, SweepError, SweepRunner, WeightedObjective, config_hash,
                                       load_sweep, point_tags, read_manifest, sample_efficiency)

needs_optuna = pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="optuna not installed")

BASE = {"exporters": [], "collectors": {"energy": False, "memory": False, "utilization": False}}


def _write(tmp_path: Path, spec: dict[str, Any], name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


class Recorder:
    """A workload that records made-up results from the point's settings, counting calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, session: Any) -> None:
        cfg = session.config
        bs = cfg.workload.batching.batch_size
        knob = float(cfg.tags.get("knob", "0"))
        self.calls.append((bs, knob))
        session.record("accuracy", 0.5 + 0.1 * knob)
        session.record("latency_s", 0.01 * bs + 0.002 * knob)


def test_weighted_objective_score_and_validation() -> None:
    w = WeightedObjective(weights={"a": 2, "b": -1}, scale={"b": 0.01})
    assert w.score({"a": 0.5, "b": 0.03}) == 2 * 0.5 - 0.03 / 0.01
    assert w.score({"a": 0.5}) is None
    with pytest.raises(ValueError, match="scale.c: not one of the weighted fields"):
        WeightedObjective(weights={"a": 1}, scale={"c": 1})
    with pytest.raises(ValueError, match="a: a weight must be a non-zero number"):
        WeightedObjective(weights={"a": 0})


def test_numeric_tag_axis_and_workload_from_the_sweep_file(tmp_path: Path) -> None:
    (tmp_path / "bench.py").write_text(
        "def run(session):\n"
        "    knob = float(session.config.tags['knob'])\n"
        "    session.record('accuracy', 1 - abs(knob - 2) / 10)\n")
    spec = {"name": "knob", "base": BASE, "axes": {"tags.knob": [1, 2, 3.5]}, "workload": "bench.py:run",
            "objective": {"weights": {"records.accuracy": 1}}}
    sweep = load_sweep(_write(tmp_path, spec))
    assert sweep.workload == f"{tmp_path / 'bench.py'}:run"
    m = SweepRunner(sweep, tmp_path / "store").run()
    assert [(p["values"]["tags.knob"], p["objectives"]["score"]) for p in m["points"]] == [
        (1, 0.9), (2, 1.0), (3.5, 1 - 1.5 / 10)]
    from perfsdk.store import Store

    runs = Store(tmp_path / "store").list_runs(tags={"sweep_id": sweep.sweep_id})
    # numbers are stored as their JSON text, the same in config tags and axis tags
    assert sorted(r.tags["knob"] for r in runs) == ["1", "2", "3.5"]
    assert sorted(r.tags["tags.knob"] for r in runs) == ["1", "2", "3.5"]
    assert all(len(r.tags["config_hash"]) == 12 for r in runs)
    bad = dict(spec, workload="bench.py:missing")
    with pytest.raises(SweepError, match=r"workload: cannot load 'bench\.py:missing': AttributeError"):
        load_sweep(_write(tmp_path, bad, "bad.yaml"))


def test_model_config_and_quantization_axes_are_config_fields(tmp_path: Path) -> None:
    spec = {"name": "arch", "base": {"model": {"id": "builtin:tiny-llama-small", "device": "cpu"}, **BASE},
            "axes": {"model.config_overrides.num_hidden_layers": [1, 2], "model.quantization": ["none", "dynamic-int8"],
                     "model.bnb_4bit_quant_type": ["nf4"]}}
    sweep = load_sweep(_write(tmp_path, spec))
    cfg = sweep.validate_point({"model.config_overrides.num_hidden_layers": 1, "model.quantization": "dynamic-int8",
                                "model.bnb_4bit_quant_type": "nf4"})
    assert cfg.model.config_overrides == {"num_hidden_layers": 1} and cfg.model.quantization == "dynamic-int8"
    hashes = {config_hash(sweep.point_config({"model.config_overrides.num_hidden_layers": n, "model.quantization": q,
                                              "model.bnb_4bit_quant_type": "nf4"}))
              for n in (1, 2) for q in ("none", "dynamic-int8")}
    assert len(hashes) == 4
    # name, tags, store and exporters do not change what is measured
    base = sweep.point_config({"model.quantization": "none"})
    assert config_hash(base) == config_hash({**base, "name": "other", "tags": {"a": "b"}, "store": "x"})
    bad = dict(spec, axes={"model.dtype": ["float32", "float64"]})
    with pytest.raises(SweepError, match=r"point \(model\.dtype=float64\): invalid configuration: model\.dtype: "):
        load_sweep(_write(tmp_path, bad, "bad.yaml"))
    assert point_tags("s", "p", {"tags.knob": 2, "model.dtype": "float32"}, "h") == {
        "sweep_id": "s", "sweep_point": "p", "config_hash": "h", "tags.knob": "2", "model.dtype": "float32"}


@needs_optuna
def test_strategies_compared_share_measured_points(tmp_path: Path, perfsdk_cli: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from perfsdk.experiments.sweep import runner as sweep_runner

    rec = Recorder()
    monkeypatch.setattr(sweep_runner, "DEFAULT_WORKLOAD", rec)
    spec = {"name": "cmp", "base": BASE,
            "axes": {"workload.batching.batch_size": [1, 2, 4], "tags.knob": [0, 1, 2]},
            "objective": {"weights": {"records.accuracy": 1, "records.latency_s": -1}, "scale": {"records.latency_s": 0.01}},
            "budget": 5, "seed": 3, "strategy_options": {"n_startup_trials": 2}}
    path = _write(tmp_path, spec)
    res = perfsdk_cli(["sweep", str(path), "--store", str(tmp_path / "st"), "--compare-strategies", "grid,tpe,random"])
    assert res.exit_code == 0, res.output
    sweep = load_sweep(path, strategies=["grid", "tpe", "random"])
    m = read_manifest(tmp_path / "st", sweep.sweep_id)
    # score = accuracy - latency / 0.01 = (0.5 + 0.1 k) - (bs + 0.2 k): best at batch 1, knob 0
    for p in m["points"]:
        bs, k = p["values"]["workload.batching.batch_size"], p["values"]["tags.knob"]
        assert p["objectives"]["score"] == pytest.approx(0.5 + 0.1 * k - (bs + 0.2 * k))
    assert m["strategies"] == ["grid", "tpe", "random"]
    assert [len(m["trials"][s]) for s in ("grid", "tpe", "random")] == [9, 5, 5]
    # each configuration ran once however many strategies asked for it
    assert len(rec.calls) == len(set(rec.calls)) == len(m["points"]) == 9
    assert m["optimum"] == pytest.approx(-0.5) and m["optimum_source"] == "grid"
    # grid order: batch slowest, knob fastest -> (1, 0) is the very first trial
    assert m["efficiency"]["grid"]["trials_to_optimum"] == 1
    for name in ("tpe", "random"):
        curve = m["efficiency"][name]["best_so_far"]
        assert all(b is None or a is None or b >= a for a, b in zip(curve, curve[1:]))  # never gets worse
        reach = m["efficiency"][name]["trials_to_optimum"]
        first_hit = next((k + 1 for k, pid in enumerate(m["trials"][name])
                          if next(p for p in m["points"] if p["point_id"] == pid)["objectives"]["score"] == m["optimum"]),
                         None)
        assert reach == first_hit
    assert "sample efficiency: best score so far (maximize)" in res.output
    assert "to reach the grid's optimum (-0.5)" in res.output
    # running it again measures nothing
    rec.calls.clear()
    res = perfsdk_cli(["sweep", str(path), "--store", str(tmp_path / "st"), "--compare-strategies", "grid,tpe,random"])
    assert res.exit_code == 0 and rec.calls == []
    assert read_manifest(tmp_path / "st", sweep.sweep_id)["trials"] == m["trials"]


def test_sample_efficiency_by_hand() -> None:
    pts = [{"point_id": i, "status": "ok", "feasible": None, "objectives": {"f": v}}
           for i, v in (("a", 3.0), ("b", 1.0), ("c", 2.0))]
    pts.append({"point_id": "d", "status": "failed", "feasible": None, "objectives": {}})
    pts.append({"point_id": "e", "status": "ok", "feasible": False, "objectives": {"f": 0.5}})
    m = {"primary": {"field": "f", "direction": "minimize"}, "points": pts,
         "trials": {"grid": ["a", "b", "c", "d", "e"], "tpe": ["d", "c", "e", "b"]}}
    out = sample_efficiency(m)
    assert out["optimum"] == 1.0  # e is lower but violates a constraint, d failed
    assert out["efficiency"]["grid"] == {"trials": 5, "best": 1.0, "best_so_far": [3.0, 1.0, 1.0, 1.0, 1.0],
                                         "trials_to_optimum": 2}
    assert out["efficiency"]["tpe"] == {"trials": 4, "best": 1.0, "best_so_far": [None, 2.0, 2.0, 1.0],
                                        "trials_to_optimum": 4}


def test_compare_needs_an_objective(tmp_path: Path) -> None:
    spec = {"name": "x", "base": BASE, "axes": {"tags.knob": [1, 2]}, "strategies": ["grid", "random"]}
    with pytest.raises(SweepError, match="comparing strategies needs an objective"):
        load_sweep(_write(tmp_path, spec))
    with pytest.raises(SweepError, match="strategy tpe needs an objective"):
        load_sweep(_write(tmp_path, {**spec, "strategies": None, "strategy": "tpe"}))


def test_heatmaps_in_the_sweep_report(tmp_path: Path, perfsdk_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from perfsdk.experiments.sweep import runner as sweep_runner

    monkeypatch.setattr(sweep_runner, "DEFAULT_WORKLOAD", Recorder())
    spec = {"name": "hm", "base": BASE, "axes": {"workload.batching.batch_size": [1, 2], "tags.knob": [0, 1]},
            "objectives": [{"maximize": "records.accuracy"}],
            "report": {"heatmaps": ["x=batch_size,y=knob,metric=records.latency_s"]}}
    path = _write(tmp_path, spec)
    assert load_sweep(path).spec.report.heatmaps == [Heatmap(x="batch_size", y="knob", metric="records.latency_s")]
    assert perfsdk_cli(["sweep", str(path), "--store", str(tmp_path / "st"), "-q"]).exit_code == 0
    sid = load_sweep(path).sweep_id
    out = tmp_path / "r.html"
    res = perfsdk_cli(["report", sid, "--store", str(tmp_path / "st"), "-o", str(out),
                       "--heatmap", "x=tags.knob,y=workload.batching.batch_size,metric=records.accuracy"])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert "<h2>Heat maps</h2>" in html
    assert "records.accuracy over tags.knob and workload.batching.batch_size" in html
    assert "records.latency_s over workload.batching.batch_size and tags.knob" in html
    pngs = sorted(p.name for p in (tmp_path / "r_files").iterdir())
    assert [n[3:] for n in pngs if "heatmap" in n] == ["heatmap-records-accuracy-knob-batch-size.png",
                                                       "heatmap-records-latency-s-batch-size-knob.png"]
    res = perfsdk_cli(["report", sid, "--store", str(tmp_path / "st"), "-o", str(out), "--heatmap", "x=bs,y=knob,metric=m"])
    assert res.exit_code == 2
    assert "heat map axis 'bs' is not an axis of this sweep (axes: workload.batching.batch_size, tags.knob)" in res.output
    res = perfsdk_cli(["report", sid, "--store", str(tmp_path / "st"), "--heatmap", "x=a"])
    assert res.exit_code == 2 and "expected x=AXIS,y=AXIS,metric=FIELD" in res.output


def test_heatmap_cells_are_means(tmp_path: Path) -> None:
    from perfsdk.experiments.report import heatmap_figure

    points = [{"status": "ok", "run_id": None, "values": {"x": x, "y": y, "z": z}, "objectives": {"m": float(x + 10 * y + z)}}
              for x in (1, 2) for y in (0, 1) for z in (0, 2)]
    png = heatmap_figure(points, {}, {"x": [1, 2], "y": [0, 1], "z": [0, 2]}, "x", "y", "m")
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert heatmap_figure(points, {}, {"x": [1, 2], "y": [0, 1], "z": [0, 2]}, "x", "y", "other") is None

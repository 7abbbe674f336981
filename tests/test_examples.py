"""Every example script runs and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, tmp_path: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--store", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _one_run(tmp_path: Path) -> dict:
    import json

    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    return json.loads((runs[0] / "result.json").read_text())


def test_hf_model_example(tmp_path):
    out = _run("hf_model.py", tmp_path, "--max-new-tokens", "6")
    assert "TTFT p50" in out and "status ok" in out
    r = _one_run(tmp_path)
    lat = r["collectors"]["latency"]
    assert lat["steps"] == 3 and lat["warmup_steps"] == 1 and lat["requests"] == 12
    assert 12 <= lat["output_tokens"] <= 72


def test_plain_module_example(tmp_path):
    out = _run("plain_module.py", tmp_path, "--steps", "5")
    assert "5 forward steps" in out and "logits (8, 10)" in out
    r = _one_run(tmp_path)
    assert r["collectors"]["latency"]["forward_s"]["count"] == 5
    assert r["model"]["model_class"] == "Sequential"
    assert r["model"]["parameters"] == (3 * 16 * 9 + 16) + (1024 * 128 + 128) + (128 * 10 + 10)


def test_stages_and_metrics_example(tmp_path):
    out = _run("stages_and_metrics.py", tmp_path)
    assert "stage preprocess: 3 calls" in out and "stage vision_encoder: 3 calls" in out
    r = _one_run(tmp_path)
    assert [rec["name"] for rec in r["records"]] == ["accuracy", "encoder_feature_norm"]
    assert r["collectors"]["latency"]["stages"]["vision_encoder"]["count"] == 3


def test_custom_collector_example(tmp_path):
    out = _run("custom_collector.py", tmp_path)
    assert "'steps': 4" in out
    r = _one_run(tmp_path)
    assert r["collectors"]["decode_rate"]["steps"] == 4
    assert r["collectors"]["decode_rate"]["fastest_decode_tokens_per_s"] > 0


def test_pim_two_linear_example(tmp_path):
    out = _run("pim_two_linear.py", tmp_path)
    assert out.count("equal to the hand formulas: yes") == 2 and "NO" not in out
    assert "linear1 on PIM-AI-1chip (memory-bound)" in out and "linear2 on PIM-AI-1chip (transfer-bound)" in out
    assert "activation stays on host-cpu" in out
    r = _one_run(tmp_path)
    sim = r["collectors"]["simulation"]
    assert sim["status"] == "ok" and sim["step_kind"] == "forward" and sim["captured_step"] == 1
    assert r["collectors"]["layers"]["events"] == 5  # root, two Linear, ReLU, softmax
    assert (tmp_path / "runs" / r["run_id"] / r["series"]["layers_events"]).is_file()


def test_quality_sweep_example(tmp_path):
    """Quality against latency over quantization x batch size, grid and TPE compared."""
    import json

    proc = subprocess.run([sys.executable, "-m", "perfsdk", "sweep", str(EXAMPLES / "quality_sweep.yaml"),
                           "--store", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sample efficiency: best score so far (maximize)" in proc.stdout
    assert "to reach the grid's optimum" in proc.stdout
    assert "8 trials over 2 strategies needed 4 measured points" in proc.stdout
    (manifest_file,) = (tmp_path / "sweeps").glob("*.json")
    m = json.loads(manifest_file.read_text())
    # every configuration was measured once, whichever strategy asked for it first
    assert len(list((tmp_path / "runs").iterdir())) == 4
    assert [len(m["trials"][s]) for s in ("grid", "tpe")] == [4, 4]
    assert sorted(m["trials"]["grid"]) == sorted(m["trials"]["tpe"])
    assert {tuple(p["strategies"]) for p in m["points"]} == {("grid", "tpe")}
    for p in m["points"]:
        o = p["objectives"]
        acc, fwd = o["collectors.quality.accuracy"], o["collectors.latency.forward_s.p50"]
        assert 0 <= acc <= 1 and fwd > 0
        assert o["score"] == -fwd / 0.01 + acc / 0.1
    best = max(p["objectives"]["score"] for p in m["points"])
    assert m["optimum"] == best and m["optimum_source"] == "grid"
    assert m["efficiency"]["grid"]["best_so_far"][-1] == best
    grid_order = [next(p for p in m["points"] if p["point_id"] == pid) for pid in m["trials"]["grid"]]
    assert m["efficiency"]["grid"]["trials_to_optimum"] == 1 + [p["objectives"]["score"] for p in grid_order].index(best)
    run = json.loads(next((tmp_path / "runs").iterdir()).joinpath("result.json").read_text())
    assert run["collectors"]["quality"]["scored_requests"] == 8
    assert run["collectors"]["quality"]["method"] == "label scoring"

"""``perfsdk run`` on vision-language and encoder-decoder models, images in workloads, and the
sweep report's vision-token figure."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfsdk.models.images import builtin_shapes
from perfsdk.store import Store

SMALL = ["--set", "workload.num_prompts=2", "--set", "workload.prompts=builtin:short", "--set",
         "workload.batching.batch_size=2", "--set", "workload.warmup_runs=0", "--set", "workload.min_iterations=1",
         "--set", "workload.generate.max_new_tokens=2", "--set", "workload.generate.min_new_tokens=2",
         "--set", "collectors.energy=false"]


def _latency_rows(output: str) -> list[str]:
    """Metric names of the printed latency table, in order."""
    rows = []
    for line in output.splitlines():
        m = re.match(r"\s*([A-Za-z0-9:_-]+)( \*)?\s+│\s+\d+\s+│", line)
        if m:
            rows.append(m.group(1))
    return rows


@pytest.mark.parametrize("model, vision", [("builtin:tiny-llava", "16.0"), ("builtin:tiny-t5", None)])
def test_run_prints_encode_prefill_decode(perfsdk_cli: Any, tmp_path: Path, model: str, vision: str | None) -> None:
    res = perfsdk_cli(["run", "--set", f"model.id={model}", *SMALL, "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    rows = _latency_rows(res.output)
    assert rows[rows.index("encode"):rows.index("encode") + 3] == ["encode", "prefill", "decode"]
    if vision is None:
        assert "vision tokens / request" not in res.output
    else:
        assert re.search(rf"vision tokens / request\s+│\s+{re.escape(vision)}", res.output)
    run = Store(tmp_path / "s").list_runs()[0]
    assert run.status == "ok" and run.collectors["latency"]["encode_s"]["count"] == 2


def test_run_on_a_local_vlm_folder(perfsdk_cli: Any, tmp_path: Path) -> None:
    from perfsdk.models.tiny import build_tiny_llava

    model, processor = build_tiny_llava(use_cache=False)
    model.save_pretrained(tmp_path / "vlm")
    processor.save_pretrained(tmp_path / "vlm")
    res = perfsdk_cli(["run", "--set", f"model.id={tmp_path / 'vlm'}", *SMALL, "--store", str(tmp_path / "s"), "--json"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.output)
    assert run["status"] == "ok" and run["model"]["model_class"] == "LlavaForConditionalGeneration"
    assert run["model"]["num_layers"] == 2 and run["model"]["vocab_size"] == 4097  # the language model's shape
    wl = run["workload"]
    assert (wl["images_source"], wl["image_views_mean"], wl["vision_tokens_mean"]) == ("builtin:shapes", 1.0, 16.0)
    lat = run["collectors"]["latency"]
    assert lat["vision_tokens"] == 32 and lat["encode_s"]["count"] == 2


def test_jsonl_prompts_with_images_and_image_size(perfsdk_cli: Any, tmp_path: Path) -> None:
    shapes = builtin_shapes()
    shapes[0].save(tmp_path / "square.png")  # 32 x 32 -> 64 x 64 at image_size 64: 2 x 2 tiles + global view
    shapes[4].save(tmp_path / "wide.png")  # 128 x 72 -> 64 x 36: 2 x 2 tiles + global view
    shapes[1].crop((0, 0, 64, 32)).save(tmp_path / "strip.png")  # 64 x 32: 2 x 1 tiles + global view
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "describe the square", "image": "square.png"},
        {"prompt": "describe the strip", "image": "strip.png"},
        {"prompt": "describe the wide one", "image": "wide.png"},
    ]) + "\n")
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump({
        "name": "jsonl-images", "model": {"id": "builtin:tiny-llava", "device": "cpu"},
        "workload": {"prompts": "p.jsonl", "num_prompts": 3, "sort_by_length": False, "batching": {"batch_size": 3},
                     "image_size": 64, "generate": {"max_new_tokens": 2, "min_new_tokens": 2},
                     "warmup_runs": 0, "min_iterations": 1},
        "collectors": {"energy": False}, "exporters": []}))
    res = perfsdk_cli(["run", str(tmp_path / "bench.yaml"), "--store", str(tmp_path / "s"), "--json"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.output)
    assert run["workload"]["images_source"] == str(tmp_path / "p.jsonl")
    assert run["workload"]["image_views_mean"] == pytest.approx(13 / 3)
    rows = Store(tmp_path / "s").read_series(run["run_id"], "requests")
    assert [r["vision_tokens"] for r in rows] == [80, 48, 80]  # 16 tokens per view
    assert run["collectors"]["latency"]["vision_tokens_per_request"]["max"] == 80.0


@pytest.mark.parametrize("sets, message", [
    (["model.id=builtin:tiny-llava", "workload.images=/nonexistent/images"],
     "workload.images: folder /nonexistent/images not found"),
    (["model.id=builtin:tiny-llama-small", "workload.images=builtin:shapes"],
     "workload.images: images given (builtin:shapes) but builtin:tiny-llama-small takes no images"),
    (["model.id=builtin:tiny-t5", "workload.image_size=64"],
     "workload.image_size: the workload has no images"),
    (["workload.image_size=64", "workload.num_crops=2"], "set either image_size or num_crops"),
    (["workload.images=builtin:dogs"], "workload.images: unknown built-in image set 'builtin:dogs'"),
])
def test_bad_image_settings_exit_2(perfsdk_cli: Any, tmp_path: Path, sets: list[str], message: str) -> None:
    args = ["run", *[x for s in sets for x in ("--set", s)], *SMALL, "--store", str(tmp_path / "s")]
    res = perfsdk_cli(args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_image_size_sweep_report_plots_latency_against_vision_tokens(perfsdk_cli: Any, tmp_path: Path) -> None:
    spec = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "sweep_image_size.yaml").read_text())
    spec["base"]["workload"].update({"num_prompts": 2, "batching": {"batch_size": 2}, "warmup_runs": 0,
                                     "min_iterations": 1, "generate": {"max_new_tokens": 2}})
    spec["base"]["collectors"] = {"energy": False}
    spec["axes"] = {"workload.image_size": [32, 64]}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    res = perfsdk_cli(["sweep", str(tmp_path / "sweep.yaml"), "--store", str(tmp_path / "s"), "--json"])
    assert res.exit_code == 0, res.output
    sweep_id = json.loads(res.output)["sweep_id"]
    runs = Store(tmp_path / "s").list_runs(tags={"sweep_id": sweep_id})
    # builtin:shapes 32x32 and 64x48: one view each at 32; at 64 both become 2 x 2 tiles + a global view
    assert sorted(r.workload.vision_tokens_mean for r in runs if r.workload) == [16.0, 80.0]
    out = tmp_path / "rep" / "sweep.html"
    res = perfsdk_cli(["report", sweep_id, "--store", str(tmp_path / "s"), "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "01-vision-tokens.png" in {p.name for p in (tmp_path / "rep" / "sweep_files").iterdir()}
    assert "<h2>Vision tokens</h2>" in out.read_text()

"""Images in workloads: the generated set, folders, per-prompt paths, and the vision-token knob."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsdk.config import ConfigError, load_config
from perfsdk.models.images import (SHAPES_SIZES, builtin_shapes, folder_images, image_prompt, image_set,
                                   image_views, native_size, prompt_file_images, select_grid)
from perfsdk.models.prompts import load_prompts
from perfsdk.models.tiny import build_llava_processor


def test_builtin_shapes_are_generated_deterministically() -> None:
    a, b = builtin_shapes(), builtin_shapes()
    assert [im.size for im in a] == list(SHAPES_SIZES)
    assert {im.width / im.height for im in a} == {1.0, 4 / 3, 3 / 4, 16 / 9, 9 / 16}
    assert all(im.mode == "RGB" for im in a)
    assert [im.tobytes() for im in a] == [im.tobytes() for im in b]
    assert len({im.tobytes() for im in a}) == len(a)


@pytest.mark.parametrize("size, crops, grid", [((224, 224), 4, (2, 2)), ((160, 120), 6, (3, 2)),
                                               ((72, 128), 6, (2, 3)), ((96, 32), 3, (3, 1)), ((50, 50), 5, (5, 1))])
def test_crop_grid_follows_the_aspect_ratio(size: tuple[int, int], crops: int, grid: tuple[int, int]) -> None:
    assert select_grid(*size, crops) == grid


def test_image_views_tile_fixed_resolution_encoders() -> None:
    shapes = builtin_shapes()
    img = shapes[1]  # 64 x 48
    assert [v.size for v in image_views(img)] == [(64, 48)]  # no knob: the image as it is
    assert [v.size for v in image_views(img, image_size=32, native=(32, 32))] == [(32, 24)]  # fits one view
    views = image_views(img, image_size=64, native=(32, 32))  # 64 x 48 -> 2 x 2 tiles + global view
    assert len(views) == 5 and {v.size for v in views} == {(32, 32)}
    assert len(image_views(shapes[4], image_size=96, native=(32, 32))) == 3 * 2 + 1  # 128x72 -> 96x54
    assert len(image_views(shapes[0], num_crops=4, native=(32, 32))) == 5
    assert len(image_views(shapes[0], num_crops=1, native=(32, 32))) == 1
    # a processor that sizes images itself gets the resized image only
    assert [v.size for v in image_views(shapes[7], image_size=112, native=None)] == [(112, 112)]


def test_tiny_llava_processor_is_fixed_resolution() -> None:
    proc = build_llava_processor()
    assert native_size(proc) == (32, 32)
    assert image_prompt(proc, "what is shown?", 2) == "<image><image>\nwhat is shown?"
    assert image_prompt(proc, "text only", 0) == "text only"


def test_folder_and_builtin_sets(tmp_path: Path) -> None:
    for i, im in enumerate(builtin_shapes()[:3]):
        im.save(tmp_path / f"img{i}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    assert [im.size for im in folder_images(tmp_path)] == list(SHAPES_SIZES[:3])
    with pytest.raises(ConfigError, match="workload.images: folder .*missing not found"):
        image_set(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="unknown built-in image set 'builtin:cats'"):
        image_set("builtin:cats")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no images"):
        image_set(str(empty))


def test_jsonl_images_follow_the_prompt_selection(tmp_path: Path) -> None:
    shapes = builtin_shapes()
    lines = []
    for i in range(5):
        shapes[i].save(tmp_path / f"i{i}.png")
        lines.append(json.dumps({"prompt": f"prompt number {i}", "image": f"i{i}.png"}))
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    prompts = load_prompts(str(path), 3, seed=7)
    images = prompt_file_images(str(path), 3, seed=7)
    assert images is not None
    assert [im.size for im in images] == [shapes[int(p.rsplit(" ", 1)[1])].size for p in prompts]
    # more prompts than lines: repeated cyclically, like the prompts
    assert [im.size for im in prompt_file_images(str(path), 7) or []] == [shapes[i % 5].size for i in range(7)]


def test_jsonl_image_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "image": "there.png"}\n{"prompt": "b", "image": "gone.png"}\n')
    builtin_shapes()[0].save(tmp_path / "there.png")
    with pytest.raises(ConfigError, match=r"p.jsonl line 2: image .*gone.png not found"):
        prompt_file_images(str(path), 2)
    path.write_text('{"prompt": "a", "image": 3}\n')
    with pytest.raises(ConfigError, match=r"line 1: \"image\" must be a path"):
        prompt_file_images(str(path), 1)
    (tmp_path / "bad.png").write_text("not a png")
    path.write_text('{"prompt": "a", "image": "bad.png"}\n')
    with pytest.raises(ConfigError, match="bad.png is not a readable image"):
        prompt_file_images(str(path), 1)
    assert prompt_file_images("builtin:mixed", 4) is None


def test_image_config_fields(tmp_path: Path) -> None:
    cfg = load_config({"workload": {"images": "builtin:shapes", "image_size": 64}})
    assert (cfg.workload.images, cfg.workload.image_size, cfg.workload.num_crops) == ("builtin:shapes", 64, None)
    assert load_config({}).workload.images == "auto"
    with pytest.raises(ConfigError, match="workload: set either image_size or num_crops"):
        load_config({"workload": {"image_size": 64, "num_crops": 4}})
    with pytest.raises(ConfigError, match="workload.image_size: Input should be greater than or equal to 1"):
        load_config({"workload": {"image_size": 0}})
    (tmp_path / "imgs").mkdir()
    (tmp_path / "bench.yaml").write_text("workload:\n  images: imgs\n")
    assert load_config(tmp_path / "bench.yaml").workload.images == str(tmp_path / "imgs")

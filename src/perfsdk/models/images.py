"""Images for vision-language workloads, and the vision-token knob.

``workload.images`` chooses where the images come from:

- ``auto`` (default): ``builtin:shapes`` when the model takes images, none otherwise;
- ``none`` (or ``null``): text only;
- ``builtin:shapes``: eight images generated here, deterministically (numpy and PIL, nothing
  downloaded), of several sizes and aspect ratios (:data:`SHAPES_SIZES`): coloured ellipses,
  rectangles and lines on a gradient;
- a folder: every ``.png``/``.jpg``/``.jpeg``/``.bmp``/``.gif``/``.webp`` file in it, by name.

Prompt ``i`` gets image ``i`` modulo the number of images. A ``.jsonl`` prompt file whose lines
carry an ``"image"`` field (a path, relative to the file's folder) gives each prompt its own
image instead.

The vision-token knob: ``workload.image_size`` resizes every image so that its longer side has
that many pixels; ``workload.num_crops`` asks for a number of crops. Vision encoders with a fixed
input size (CLIP in LLaVA-1.5 and in ``builtin:tiny-llava``: the processor center-crops a fixed
square) would squeeze a larger image back to that size, so for them perfsdk cuts the image into
tiles of the encoder's input size — ``ceil(w / side) x ceil(h / side)`` tiles after the resize,
or the ``num_crops`` grid closest to the image's aspect ratio — plus one global view of the whole
image, and the prompt gets one image placeholder per view. The number of vision tokens then grows
with the image size. Processors that size images themselves (no fixed input square: Qwen2-VL and
the like) receive the resized image as it is.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsdk.config import ConfigError, WorkloadConfig

BUILTIN_SHAPES = "builtin:shapes"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
#: (width, height) of the ``builtin:shapes`` images.
SHAPES_SIZES: tuple[tuple[int, int], ...] = (
    (32, 32), (64, 48), (48, 64), (96, 96), (128, 72), (72, 128), (160, 120), (224, 224),
)
_SHAPES_SEED = 1234
_FIELD = "workload.images"


def builtin_shapes() -> list[Any]:
    """The ``builtin:shapes`` images (PIL, RGB), generated from a fixed seed."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.RandomState(_SHAPES_SEED)
    images = []
    for w, h in SHAPES_SIZES:
        top, bottom = rng.randint(0, 256, 3), rng.randint(0, 256, 3)
        ramp = np.linspace(0.0, 1.0, h)[:, None, None]
        pixels = (top[None, None, :] * (1 - ramp) + bottom[None, None, :] * ramp).repeat(w, axis=1)
        img = Image.fromarray(pixels.astype("uint8"), "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(4):
            x0, x1 = sorted(int(v) for v in rng.randint(0, w, 2))
            y0, y1 = sorted(int(v) for v in rng.randint(0, h, 2))
            color = tuple(int(c) for c in rng.randint(0, 256, 3))
            shape = rng.randint(0, 3)
            if shape == 0:
                draw.ellipse((x0, y0, x1 + 1, y1 + 1), fill=color)
            elif shape == 1:
                draw.rectangle((x0, y0, x1, y1), fill=color)
            else:
                draw.line((x0, y0, x1, y1), fill=color, width=max(1, min(w, h) // 16))
        images.append(img)
    return images


def open_image(path: str | Path, where: str) -> Any:
    """Open an image file as RGB; problems are :class:`ConfigError` naming ``where``."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{where}: image {path} not found")
    try:
        with Image.open(p) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError) as err:
        raise ConfigError(f"{where}: {path} is not a readable image ({err})") from None


def folder_images(folder: str | Path) -> list[Any]:
    """Every image file of ``folder`` (by name), opened as RGB."""
    p = Path(folder).expanduser()
    if not p.exists():
        raise ConfigError(f"{_FIELD}: folder {folder} not found")
    if not p.is_dir():
        raise ConfigError(f"{_FIELD}: {folder} is not a folder (expected a folder of images, builtin:shapes, "
                          "auto or none)")
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"{_FIELD}: folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return [open_image(f, _FIELD) for f in files]


def image_set(spec: str) -> list[Any]:
    """The images of ``builtin:shapes`` or of a folder."""
    if spec.startswith("builtin:"):
        if spec != BUILTIN_SHAPES:
            raise ConfigError(f"{_FIELD}: unknown built-in image set {spec!r} (available: {BUILTIN_SHAPES})")
        return builtin_shapes()
    return folder_images(spec)


def prompt_file_images(spec: str, num_prompts: int, seed: int = 42) -> list[Any] | None:
    """Per-prompt images from the ``"image"`` fields of a ``.jsonl`` prompt file.

    Aligned with :func:`perfsdk.models.prompts.load_prompts` (same subset, same repetition);
    ``None`` when the prompts are not a ``.jsonl`` file or no line has an ``"image"`` field.
    Paths are relative to the file's folder.
    """
    p = Path(spec).expanduser()
    if spec.startswith("builtin:") or p.suffix.lower() != ".jsonl" or not p.is_file():
        return None
    paths: list[tuple[int, str | None]] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # load_prompts reports it, naming the line
        img = obj.get("image") if isinstance(obj, dict) else None
        if img is not None and (not isinstance(img, str) or not img.strip()):
            raise ConfigError(f"workload.prompts: {spec} line {n}: \"image\" must be a path (a non-empty string)")
        paths.append((n, img))
    if not any(img for _, img in paths):
        return None
    if len(paths) > num_prompts:  # the same selection as load_prompts
        keep = sorted(random.Random(seed).sample(range(len(paths)), num_prompts))
        chosen = [paths[i] for i in keep]
    else:
        chosen = [paths[i % len(paths)] for i in range(num_prompts)]
    opened: dict[int, Any] = {}
    out: list[Any] = []
    for n, img in chosen:
        if img is None:
            out.append(None)
            continue
        if n not in opened:
            path = Path(img).expanduser()
            opened[n] = open_image(path if path.is_absolute() else p.parent / path, f"workload.prompts: {spec} line {n}")
        out.append(opened[n])
    return out


def native_size(processor: Any) -> tuple[int, int] | None:
    """``(width, height)`` every image is brought to by a fixed-resolution image processor.

    A processor that center-crops to a fixed ``crop_size``, or resizes to a fixed
    ``{"height", "width"}``, and does not tile images itself; ``None`` for processors that size
    images themselves.
    """
    ip = getattr(processor, "image_processor", None)
    if ip is None or getattr(ip, "image_grid_pinpoints", None) or getattr(ip, "max_pixels", None):
        return None
    if getattr(ip, "do_center_crop", False):
        fixed = _height_width(getattr(ip, "crop_size", None))
        if fixed is not None:
            return fixed
    return _height_width(getattr(ip, "size", None))


def _height_width(size: Any) -> tuple[int, int] | None:
    """``(width, height)`` of a size setting (a dict or ``transformers``' ``SizeDict``)."""
    get = size.get if isinstance(size, dict) else (lambda k: getattr(size, k, None))
    h, w = get("height"), get("width")
    return (int(w), int(h)) if h and w else None


def select_grid(width: int, height: int, crops: int) -> tuple[int, int]:
    """``(columns, rows)`` with ``columns x rows == crops`` closest to the image's aspect ratio."""
    pairs = [(c, crops // c) for c in range(1, crops + 1) if crops % c == 0]
    aspect = width / height
    return min(pairs, key=lambda cr: (abs(math.log((cr[0] / cr[1]) / aspect)), -cr[0]))


def resize_longer_side(image: Any, side: int) -> Any:
    """``image`` scaled so that its longer side is ``side`` pixels (aspect ratio kept)."""
    w, h = image.size
    scale = side / max(w, h)
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))))


def image_views(image: Any, *, image_size: int | None = None, num_crops: int | None = None,
                native: tuple[int, int] | None = None) -> list[Any]:
    """The views of one image handed to the processor (see the module docs).

    Without ``image_size`` and ``num_crops``: the image itself. With them, for a fixed-resolution
    encoder (``native`` set): one global view plus the tiles, when there is more than one tile.
    """
    img = image.convert("RGB")
    if image_size is not None:
        img = resize_longer_side(img, image_size)
    if native is None or (image_size is None and num_crops is None):
        return [img]
    nw, nh = native
    w, h = img.size
    if num_crops is not None:
        cols, rows = select_grid(w, h, num_crops)
    else:
        cols, rows = math.ceil(w / nw), math.ceil(h / nh)
    if cols * rows <= 1:
        return [img]
    canvas = img.resize((cols * nw, rows * nh))
    tiles = [canvas.crop((c * nw, r * nh, (c + 1) * nw, (r + 1) * nh)) for r in range(rows) for c in range(cols)]
    return [img.resize((nw, nh))] + tiles


def image_prompt(processor: Any, text: str, views: int) -> str:
    """The prompt text for ``views`` image views: the processor's chat template when it has one,
    else one image placeholder per view before the text."""
    if views <= 0:
        return text
    if getattr(processor, "chat_template", None):
        content: list[dict[str, Any]] = [{"type": "image"} for _ in range(views)] + [{"type": "text", "text": text}]
        out = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                            tokenize=False)
        return str(out)
    token = getattr(processor, "image_token", None)
    if not token:
        return text
    return token * views + "\n" + text


# -- the workload runner's side ---------------------------------------------------------------


@dataclass
class WorkloadImages:
    """The images of a planned workload: prompt texts with placeholders and the views, per batch."""

    source: str
    texts: list[list[str]]
    views: list[list[Any]]
    views_mean: float


def check_images(workload: WorkloadConfig) -> None:
    """Check ``workload.images`` and a prompt file's ``"image"`` fields without a model."""
    spec = workload.images
    if spec not in (None, "auto", "none"):
        if spec.startswith("builtin:"):
            image_set(spec)
        else:
            p = Path(spec).expanduser()
            if not p.is_dir():
                folder_images(spec)  # raises, naming the problem
    prompt_file_images(workload.prompts, workload.num_prompts, workload.seed)


def model_takes_images(model: Any) -> bool:
    """Whether the model has a vision tower (its config has a ``vision_config``)."""
    return getattr(getattr(model, "config", None), "vision_config", None) is not None


def workload_images(workload: WorkloadConfig, model: Any, processor: Any, plan: Any,
                    model_id: str) -> WorkloadImages | None:
    """Images for each planned prompt, or ``None`` for a text-only workload.

    Raises :class:`ConfigError` when images are asked for but the model or its processor cannot
    take them.
    """
    from perfsdk.models.encode import is_processor

    per_prompt = prompt_file_images(workload.prompts, workload.num_prompts, workload.seed)
    spec = workload.images
    takes = model_takes_images(model)
    if per_prompt is not None:
        source = workload.prompts
    elif spec in (None, "none") or (spec == "auto" and not takes):
        if workload.image_size is not None or workload.num_crops is not None:
            knob = "image_size" if workload.image_size is not None else "num_crops"
            raise ConfigError(f"workload.{knob}: the workload has no images (workload.images: {spec or 'none'}"
                              + ("" if takes else f"; {model_id} takes no images") + ")")
        return None
    else:
        source = BUILTIN_SHAPES if spec == "auto" else str(spec)
    where = "workload.prompts" if per_prompt is not None else _FIELD
    if not takes:
        raise ConfigError(f"{where}: images given ({source}) but {model_id} takes no images "
                          "(its config has no vision_config)")
    if not is_processor(processor):
        raise ConfigError(f"{where}: images given ({source}) but {model_id} has no processor to prepare them "
                          "(no preprocessor/processor config next to the model)")
    native = native_size(processor)
    if workload.num_crops is not None and native is None:
        raise ConfigError(f"workload.num_crops: the processor of {model_id} sizes images itself (no fixed input "
                          "size to cut crops from); use workload.image_size")
    if per_prompt is not None:
        originals = per_prompt
    else:
        pool = image_set(source)
        originals = [pool[i % len(pool)] for i in range(workload.num_prompts)]
    indices: list[int] = plan.extra.get("indices", list(range(len(plan.prompts))))
    views_of: dict[int, list[Any]] = {}
    for i in indices:
        img = originals[i % len(originals)] if originals else None
        views_of[i] = [] if img is None else image_views(img, image_size=workload.image_size,
                                                         num_crops=workload.num_crops, native=native)
    groups: list[list[int]] = plan.extra.get("groups", [])
    texts: list[list[str]] = []
    views: list[list[Any]] = []
    for g in groups:
        idx = [indices[j] for j in g]
        texts.append([image_prompt(processor, plan.prompts[j], len(views_of[i])) for j, i in zip(g, idx)])
        per_request = [views_of[i] for i in idx]
        # processors that take one list per request need every request to have an image
        views.append(per_request if all(per_request) else [v for vs in per_request for v in vs])
    counts = [len(views_of[i]) for i in indices]
    return WorkloadImages(source=source, texts=texts, views=views, views_mean=sum(counts) / len(counts))

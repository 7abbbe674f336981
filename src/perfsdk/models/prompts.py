"""Prompt sets: built-in ones and prompt files.

``workload.prompts`` is either a built-in set or a file:

- ``builtin:short`` — 16 one-line questions (a handful to about 15 tokens each);
- ``builtin:long`` — 10 reading tasks over passages of the bundled corpus (about 220 to 410
  tokens with the embedded tokenizer);
- ``builtin:mixed`` — short questions, paragraph-sized tasks and the long reading tasks
  interleaved, so batches see varied lengths;
- a ``.txt`` file: one prompt per non-empty line;
- a ``.jsonl`` file: one JSON object per non-empty line with a string ``"prompt"`` field.

:func:`load_prompts` returns exactly ``num_prompts`` prompts, deterministically: a source with
more prompts gives a subset chosen by ``seed`` (kept in source order); a source with fewer is
repeated cyclically.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from importlib import resources
from pathlib import Path

from perfsdk.config import ConfigError

BUILTIN_PREFIX = "builtin:"
_FIELD = "workload.prompts"


@lru_cache(maxsize=1)
def _prompt_data() -> dict[str, list[str]]:
    text = (resources.files("perfsdk.models") / "data" / "prompts.json").read_text(encoding="utf-8")
    data: dict[str, list[str]] = json.loads(text)
    return data


def _paragraphs() -> list[str]:
    from perfsdk.models.tiny import corpus_text

    return [p.strip() for p in corpus_text().split("\n\n") if p.strip()]


def _long_prompts() -> list[str]:
    """Reading tasks: an instruction followed by 3 to 5 consecutive corpus paragraphs."""
    paras = _paragraphs()
    instructions = _prompt_data()["long_instructions"]
    out = []
    for i in range(10):
        start = (4 * i) % len(paras)
        count = 3 + (i % 3)
        passage = "\n\n".join(paras[(start + k) % len(paras)] for k in range(count))
        out.append(f"{instructions[i % len(instructions)]}\n\n{passage}")
    return out


def _builtin_sets() -> dict[str, list[str]]:
    data = _prompt_data()
    short, medium, long = list(data["short"]), list(data["medium"]), _long_prompts()
    mixed: list[str] = []
    for i in range(max(len(short), len(medium), len(long))):
        for group in (short, medium, long):
            if i < len(group):
                mixed.append(group[i])
    return {"short": short, "long": long, "mixed": mixed}


def builtin_prompt_sets() -> list[str]:
    """Names of the built-in prompt sets, with the ``builtin:`` prefix."""
    return [BUILTIN_PREFIX + name for name in _builtin_sets()]


def builtin_prompts(name: str) -> list[str]:
    """All prompts of a built-in set (``mixed``, ``short`` or ``long``, prefix optional)."""
    key = name.removeprefix(BUILTIN_PREFIX)
    sets = _builtin_sets()
    if key not in sets:
        raise ConfigError(
            f"{_FIELD}: unknown built-in prompt set {BUILTIN_PREFIX + key!r} (available: {', '.join(builtin_prompt_sets())})"
        )
    return list(sets[key])


def read_prompt_file(path: str | Path) -> list[str]:
    """Prompts from a ``.txt`` (one per non-empty line) or ``.jsonl`` (``"prompt"`` field) file."""
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "not found"
        raise ConfigError(f"{_FIELD}: prompt file {path} {what}")
    suffix = p.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise ConfigError(f"{_FIELD}: {path}: unsupported prompt file type {suffix or '(none)'!r} (use .txt or .jsonl)")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"{_FIELD}: {path}: not a UTF-8 text file") from None
    prompts: list[str] = []
    if suffix == ".txt":
        prompts = [line.strip() for line in lines if line.strip()]
    else:
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{_FIELD}: {path} line {n}: not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{_FIELD}: {path} line {n}: expected a JSON object with a \"prompt\" field")
            if "prompt" not in obj:
                raise ConfigError(f"{_FIELD}: {path} line {n}: missing \"prompt\" field")
            if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
                raise ConfigError(f"{_FIELD}: {path} line {n}: \"prompt\" must be a non-empty string")
            prompts.append(obj["prompt"])
    if not prompts:
        raise ConfigError(f"{_FIELD}: {path}: the file holds no prompts")
    return prompts


def load_prompts(spec: str, num_prompts: int, seed: int = 42) -> list[str]:
    """Exactly ``num_prompts`` prompts from a built-in set or a file, deterministically.

    More prompts in the source than asked for: a ``seed``-chosen subset, in source order.
    Fewer: the source repeated cyclically.
    """
    if num_prompts < 1:
        raise ConfigError(f"workload.num_prompts: must be at least 1, got {num_prompts}")
    source = builtin_prompts(spec) if spec.startswith(BUILTIN_PREFIX) else read_prompt_file(spec)
    if len(source) > num_prompts:
        keep = sorted(random.Random(seed).sample(range(len(source)), num_prompts))
        return [source[i] for i in keep]
    return [source[i % len(source)] for i in range(num_prompts)]

"""Prompt sets: built-in ones and prompt files.

``workload.prompts`` is either a built-in set or a file:

- ``builtin:short`` — 16 one-line questions (a handful to about 15 tokens each);
- ``builtin:long`` — 10 reading tasks over passages of the bundled corpus (about 220 to 410
  tokens with the embedded tokenizer);
- ``builtin:mixed`` — short questions, paragraph-sized tasks and the long reading tasks
  interleaved, so batches see varied lengths;
- a ``.txt`` file: one prompt per non-empty line;
- ``builtin:classify`` / ``builtin:qa`` — labelled synthetic sets (:mod:`perfsdk.models.labelled`);
- a ``.txt`` file: one prompt per non-empty line;
- a ``.jsonl`` file: one JSON object per non-empty line with a string ``"prompt"`` field and,
  for labelled data, a ``"label"`` (or ``"answer"``) field;
- a ``.csv`` file with a header row: a ``prompt`` column and, for labelled data, a ``label``
  (or ``answer``) column.

``workload.dataset`` takes prompts from a Hugging Face ``datasets`` dataset instead
(:mod:`perfsdk.models.dataset`).

:func:`load_examples` returns exactly ``num_prompts`` :class:`Example` items (prompt, label,
where it came from), deterministically: a source with more prompts gives a subset chosen by
``seed`` (kept in source order); a source with fewer is repeated cyclically.
:func:`load_prompts` is the same without the labels.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from perfsdk.config import ConfigError, WorkloadConfig

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


@dataclass(frozen=True)
class Example:
    """One prompt and, for labelled data, its reference label or answer.

    ``where`` says where it came from, for error messages: ``"<file> line 3"``,
    ``"<file> row 4"``, ``"builtin:qa item 17"`` or ``"<dataset> row 120"``.
    """

    prompt: str
    label: str | None = None
    where: str = ""


def _builtin_sets() -> dict[str, list[str]]:
    data = _prompt_data()
    short, medium, long = list(data["short"]), list(data["medium"]), _long_prompts()
    mixed: list[str] = []
    for i in range(max(len(short), len(medium), len(long))):
        for group in (short, medium, long):
            if i < len(group):
                mixed.append(group[i])
    return {"short": short, "long": long, "mixed": mixed}


def _labelled_sets() -> dict[str, Any]:
    from perfsdk.models.labelled import LABELLED_SETS

    return LABELLED_SETS


def builtin_prompt_sets() -> list[str]:
    """Names of the built-in prompt sets, with the ``builtin:`` prefix."""
    return [BUILTIN_PREFIX + name for name in (*_builtin_sets(), *_labelled_sets())]


def builtin_examples(name: str) -> list[Example]:
    """All items of a built-in set (prefix optional); labelled sets carry their labels."""
    key = name.removeprefix(BUILTIN_PREFIX)
    labelled = _labelled_sets()
    if key in labelled:
        return [Example(p, label, f"{BUILTIN_PREFIX}{key} item {i}") for i, (p, label) in enumerate(labelled[key]())]
    sets = _builtin_sets()
    if key not in sets:
        raise ConfigError(
            f"{_FIELD}: unknown built-in prompt set {BUILTIN_PREFIX + key!r} (available: {', '.join(builtin_prompt_sets())})"
        )
    return [Example(p, None, f"{BUILTIN_PREFIX}{key} item {i}") for i, p in enumerate(sets[key])]


def builtin_prompts(name: str) -> list[str]:
    """All prompts of a built-in set (``mixed``, ``short``, ``long``, ``classify``, ``qa``; prefix optional)."""
    return [e.prompt for e in builtin_examples(name)]


LABEL_FIELDS = ("label", "answer")


def label_value(value: Any, where: str) -> str:
    """A label as perfsdk keeps it: a non-empty string (integers become their decimal text,
    class indices are mapped to names later by :func:`apply_label_map`)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{where}: must be a string or an integer, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise ConfigError(f"{where}: must not be empty")
    return text


def _label_of(obj: dict[str, Any], where: str) -> str | None:
    present = [f for f in LABEL_FIELDS if f in obj and obj[f] is not None]
    if len(present) > 1:
        raise ConfigError(f'{where}: both "label" and "answer" fields; keep one')
    if not present:
        return None
    return label_value(obj[present[0]], f'{where}: "{present[0]}"')


def _check_all_or_none(examples: list[Example], path: str | Path) -> None:
    labelled = [e for e in examples if e.label is not None]
    if labelled and len(labelled) < len(examples):
        first = next(e for e in examples if e.label is None)
        raise ConfigError(f'{_FIELD}: {first.where}: missing "label" field (other prompts of {path} are labelled)')


def jsonl_objects(field: str, path: str | Path, lines: list[str], unit: str = "line",
                  expected: str = "a JSON object") -> list[tuple[str, dict[str, Any]]]:
    """``(where, object)`` for each non-blank line of a JSONL file; a line that is not a JSON
    object is a :class:`ConfigError` naming ``field``, the file and the line."""
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path} {unit} {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{field}: {where}: not valid JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{field}: {where}: expected {expected}")
        out.append((where, obj))
    return out


def _read_jsonl(path: str | Path, lines: list[str]) -> list[Example]:
    out = []
    for where, obj in jsonl_objects(_FIELD, path, lines, expected='a JSON object with a "prompt" field'):
        if "prompt" not in obj:
            raise ConfigError(f"{_FIELD}: {where}: missing \"prompt\" field")
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise ConfigError(f"{_FIELD}: {where}: \"prompt\" must be a non-empty string")
        try:
            label = _label_of(obj, where)
        except ConfigError as err:
            raise ConfigError(f"{_FIELD}: {err}") from None
        out.append(Example(obj["prompt"], label, where))
    return out


def _read_csv(path: str | Path, text: str) -> list[Example]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    if "prompt" not in header:
        raise ConfigError(f"{_FIELD}: {path} row 1: missing \"prompt\" column in the header "
                          f"(columns: {', '.join(header) or 'none'})")
    label_cols = [c for c in LABEL_FIELDS if c in header]
    if len(label_cols) > 1:
        raise ConfigError(f'{_FIELD}: {path} row 1: both "label" and "answer" columns; keep one')
    col = label_cols[0] if label_cols else None
    out = []
    for record in reader:
        where = f"{path} row {reader.line_num}"
        if None in record:
            raise ConfigError(f"{_FIELD}: {where}: more cells than header columns")
        prompt = record.get("prompt")
        if prompt is None or not prompt.strip():
            raise ConfigError(f'{_FIELD}: {where}: "prompt" must be a non-empty string')
        label = None
        if col is not None:
            raw = record.get(col)
            if raw is None or not raw.strip():
                raise ConfigError(f'{_FIELD}: {where}: "{col}" is empty')
            label = raw.strip()
        out.append(Example(prompt, label, where))
    return out


def read_examples_file(path: str | Path) -> list[Example]:
    """Prompts (and labels) from a ``.txt``, ``.jsonl`` or ``.csv`` file."""
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "not found"
        raise ConfigError(f"{_FIELD}: prompt file {path} {what}")
    suffix = p.suffix.lower()
    if suffix not in (".txt", ".jsonl", ".csv"):
        raise ConfigError(f"{_FIELD}: {path}: unsupported prompt file type {suffix or '(none)'!r} (use .txt, .jsonl or .csv)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{_FIELD}: {path}: not a UTF-8 text file") from None
    if suffix == ".txt":
        examples = [Example(line.strip(), None, f"{path} line {n}")
                    for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    elif suffix == ".jsonl":
        examples = _read_jsonl(path, text.splitlines())
    else:
        examples = _read_csv(path, text)
    if not examples:
        raise ConfigError(f"{_FIELD}: {path}: the file holds no prompts")
    _check_all_or_none(examples, path)
    return examples


def read_prompt_file(path: str | Path) -> list[str]:
    """Prompts from a ``.txt``, ``.jsonl`` or ``.csv`` file (labels dropped)."""
    return [e.prompt for e in read_examples_file(path)]


def pick(source: Sequence[Any], num_prompts: int, seed: int) -> list[Any]:
    """Exactly ``num_prompts`` items: a ``seed``-chosen subset in source order when the source
    has more, the source repeated cyclically when it has fewer."""
    if num_prompts < 1:
        raise ConfigError(f"workload.num_prompts: must be at least 1, got {num_prompts}")
    if len(source) > num_prompts:
        keep = sorted(random.Random(seed).sample(range(len(source)), num_prompts))
        return [source[i] for i in keep]
    return [source[i % len(source)] for i in range(num_prompts)]


def pick_indices(total: int, num_prompts: int, seed: int) -> list[int]:
    """The indices :func:`pick` would take from a source of ``total`` items."""
    return pick(range(total), num_prompts, seed)


def load_examples(spec: str, num_prompts: int, seed: int = 42) -> list[Example]:
    """Exactly ``num_prompts`` examples from a built-in set or a file, deterministically (:func:`pick`)."""
    if num_prompts < 1:
        raise ConfigError(f"workload.num_prompts: must be at least 1, got {num_prompts}")
    source = builtin_examples(spec) if spec.startswith(BUILTIN_PREFIX) else read_examples_file(spec)
    return pick(source, num_prompts, seed)


def load_prompts(spec: str, num_prompts: int, seed: int = 42) -> list[str]:
    """Exactly ``num_prompts`` prompts from a built-in set or a file, deterministically.

    More prompts in the source than asked for: a ``seed``-chosen subset, in source order.
    Fewer: the source repeated cyclically.
    """
    return [e.prompt for e in load_examples(spec, num_prompts, seed)]


def apply_label_map(examples: list[Example], label_map: Sequence[str] | None, field: str = _FIELD,
                    map_field: str = "workload.label_map") -> list[Example]:
    """Labels checked against (and class indices mapped through) a label map.

    With a label map, a label is either one of its names or an integer index into it; any
    other label is an error naming the source field, the file and row, and the label map.
    Without one, labels are kept as they are.
    """
    if not label_map:
        return examples
    names = [str(n) for n in label_map]
    known = set(names)
    out = []
    for e in examples:
        if e.label is None or e.label in known:
            out.append(e)
            continue
        if e.label.lstrip("-").isdigit() and 0 <= int(e.label) < len(names):
            out.append(Example(e.prompt, names[int(e.label)], e.where))
            continue
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise ConfigError(f"{field}: {e.where}: label {e.label!r} is not in {map_field} ({shown})")
    return out


def load_workload_examples(workload: WorkloadConfig) -> tuple[list[Example], list[str] | None]:
    """The examples a workload uses and its label map.

    Examples come from ``workload.dataset`` when it is set, else from ``workload.prompts``. The
    label map is ``workload.label_map``, else the class names of a dataset's ``ClassLabel``
    column, else ``None``; labels are checked against it (:func:`apply_label_map`).
    """
    if workload.dataset is not None:
        from perfsdk.models.dataset import load_dataset_examples

        examples, names = load_dataset_examples(workload.dataset, workload.num_prompts, workload.seed)
        label_map = workload.label_map or names
        where = "workload.label_map" if workload.label_map else f"the class names of {workload.dataset.path}"
        return apply_label_map(examples, label_map, "workload.dataset", where), label_map
    examples = load_examples(workload.prompts, workload.num_prompts, workload.seed)
    return apply_label_map(examples, workload.label_map), workload.label_map

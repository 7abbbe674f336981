"""Prompt sets and prompt files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from perfsdk.config import ConfigError
from perfsdk.models.prompts import builtin_prompt_sets, builtin_prompts, load_prompts, read_prompt_file


def test_builtin_sets() -> None:
    assert builtin_prompt_sets() == ["builtin:short", "builtin:long", "builtin:mixed", "builtin:classify", "builtin:qa"]
    short, long, mixed = (builtin_prompts(n) for n in ("short", "builtin:long", "mixed"))
    assert (len(short), len(long), len(mixed)) == (16, 10, 38)
    assert short[0] == "What is a cache?"
    assert set(short) <= set(mixed) and set(long) <= set(mixed)
    assert mixed[:3] == [short[0], mixed[1], long[0]]
    assert all(p.startswith(("Read ", "Rewrite ", "Translate ")) for p in long)
    assert min(len(p.split()) for p in long) > 150
    assert max(len(p.split()) for p in short) < 10


def test_unknown_builtin_set() -> None:
    with pytest.raises(ConfigError, match=r"^workload\.prompts: unknown built-in prompt set 'builtin:poems'"):
        load_prompts("builtin:poems", 4)


def test_subset_is_seeded_and_in_source_order() -> None:
    source = builtin_prompts("mixed")
    picked = load_prompts("builtin:mixed", 5, seed=7)
    keep = sorted(random.Random(7).sample(range(38), 5))
    assert picked == [source[i] for i in keep]
    assert load_prompts("builtin:mixed", 5, seed=7) == picked
    assert load_prompts("builtin:mixed", 5, seed=8) != picked


def test_repeat_cyclically(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("one\n\n  two  \nthree\n")
    assert load_prompts(str(f), 7, seed=1) == ["one", "two", "three", "one", "two", "three", "one"]
    assert load_prompts(str(f), 3) == ["one", "two", "three"]


def test_jsonl_file(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "first", "id": 1}) + "\n\n" + json.dumps({"prompt": "second\nline"}) + "\n")
    assert read_prompt_file(f) == ["first", "second\nline"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('["a list"]', 'line 2: expected a JSON object with a "prompt" field'),
        ('{"text": "x"}', 'line 2: missing "prompt" field'),
        ('{"prompt": 3}', 'line 2: "prompt" must be a non-empty string'),
    ],
)
def test_jsonl_bad_line(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        load_prompts(str(f), 2)
    assert str(err.value).startswith(f"workload.prompts: {f} {message}")


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"^workload\.prompts: prompt file /no/such/prompts\.txt not found$"):
        load_prompts("/no/such/prompts.txt", 3)


def test_unsupported_and_empty(tmp_path: Path) -> None:
    csv = tmp_path / "p.tsv"
    csv.write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"unsupported prompt file type '\.tsv'"):
        read_prompt_file(csv)
    empty = tmp_path / "e.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ConfigError, match=r"^workload\.prompts: .*e\.txt: the file holds no prompts"):
        read_prompt_file(empty)
    with pytest.raises(ConfigError, match=r"is a folder, not a file"):
        read_prompt_file(tmp_path)

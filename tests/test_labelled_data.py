"""Labelled prompts: .jsonl/.csv label fields, datasets, the embedded sets, label maps, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from perfsdk.config import ConfigError, WorkloadConfig
from perfsdk.models.labelled import CLASSIFY_LABELS, classify_items, qa_items
from perfsdk.models.prompts import Example, load_examples, load_workload_examples, read_examples_file


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_label_and_answer_fields(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": "pos"}, {"prompt": "b", "answer": 3}])
    assert read_examples_file(f) == [Example("a", "pos", f"{f} line 1"), Example("b", "3", f"{f} line 2")]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"prompt": "a", "label": "x", "answer": "y"}], 'line 1: both "label" and "answer" fields'),
        ([{"prompt": "a", "label": "x"}, {"prompt": "b"}], 'line 2: missing "label" field (other prompts'),
        ([{"prompt": "a", "label": 0.5}], 'line 1: "label": must be a string or an integer, got float'),
        ([{"prompt": "a", "label": " "}], 'line 1: "label": must not be empty'),
    ],
)
def test_jsonl_bad_labels(tmp_path: Path, rows: list[dict[str, Any]], message: str) -> None:
    f = _jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ConfigError) as err:
        read_examples_file(f)
    assert str(err.value).startswith(f"workload.prompts: {f} {message}")


def test_csv_prompts_and_labels(tmp_path: Path) -> None:
    f = tmp_path / "d.csv"
    f.write_text('prompt,label\n"Hello, world",greeting\nbye,farewell\n')
    assert read_examples_file(f) == [Example("Hello, world", "greeting", f"{f} row 2"),
                                     Example("bye", "farewell", f"{f} row 3")]
    plain = tmp_path / "p.csv"
    plain.write_text("prompt,other\none,1\n")
    assert read_examples_file(plain) == [Example("one", None, f"{plain} row 2")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("text,label\na,b\n", 'row 1: missing "prompt" column in the header (columns: text, label)'),
        ("prompt,answer\na,b\nc,\n", 'row 3: "answer" is empty'),
        ("prompt,label\na,b,c\n", "row 2: more cells than header columns"),
        ("prompt,label,answer\na,b,c\n", 'row 1: both "label" and "answer" columns'),
    ],
)
def test_csv_errors_name_file_and_row(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "d.csv"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_examples_file(f)
    assert str(err.value).startswith(f"workload.prompts: {f} {message}")


def test_label_map_checks_and_maps_indices(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}, {"prompt": "b", "label": "neg"}])
    wl = WorkloadConfig(prompts=str(f), num_prompts=2, label_map=["neg", "pos"])
    examples, label_map = load_workload_examples(wl)
    assert [e.label for e in examples] == ["pos", "neg"] and label_map == ["neg", "pos"]
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "label": "neg"}, {"prompt": "b", "label": "maybe"}])
    with pytest.raises(ConfigError) as err:
        load_workload_examples(WorkloadConfig(prompts=str(bad), num_prompts=2, label_map=["neg", "pos"]))
    assert str(err.value) == f"workload.prompts: {bad} line 2: label 'maybe' is not in workload.label_map (neg, pos)"


def test_embedded_labelled_sets_are_fixed() -> None:
    cls, qa = classify_items(), qa_items()
    assert len(cls) == 300 and len(qa) == 300
    assert [sum(1 for _, label in cls if label == c) for c in CLASSIFY_LABELS] == [100, 100, 100]
    assert cls[0][0].startswith("Classify the sentiment of the review as positive, negative or neutral.\nReview: The ")
    assert cls[0][1] == "positive" and cls[1][1] == "negative" and cls[2][1] == "neutral"
    assert qa[0][0].startswith("Answer with one word.\nQuestion: What is ") and qa[0][0].endswith("\nAnswer:")
    # the sums are right
    import re

    from perfsdk.models.labelled import _NUMBER_WORDS as N

    for prompt, answer in qa[::5]:
        a, b = re.search(r"What is (\w+) plus (\w+)\?", prompt).groups()  # type: ignore[union-attr]
        assert N.index(answer) == N.index(a) + N.index(b)
    picked = load_examples("builtin:classify", 6, seed=3)
    assert picked == load_examples("builtin:classify", 6, seed=3)
    assert all(e.label in CLASSIFY_LABELS and e.where.startswith("builtin:classify item ") for e in picked)


# -- datasets -----------------------------------------------------------------------------------

def _saved_dataset(tmp_path: Path) -> Path:
    import datasets

    ds = datasets.Dataset.from_dict(
        {"text": [f"review {i}" for i in range(10)], "stars": [i % 2 for i in range(10)]},
        features=datasets.Features({"text": datasets.Value("string"),
                                    "stars": datasets.ClassLabel(names=["bad", "good"])}))
    folder = tmp_path / "ds"
    datasets.DatasetDict({"test": ds}).save_to_disk(str(folder))
    return folder


def test_dataset_folder_with_class_labels(tmp_path: Path) -> None:
    folder = _saved_dataset(tmp_path)
    wl = WorkloadConfig(dataset={"path": str(folder), "prompt_column": "text", "label_column": "stars",
                                 "prompt_template": "Review: {text}\nVerdict:"}, num_prompts=4, seed=1)
    examples, label_map = load_workload_examples(wl)
    assert label_map == ["bad", "good"]
    # the same rows as a prompt file of 10 lines would give for seed 1
    from perfsdk.models.prompts import pick_indices

    rows = pick_indices(10, 4, 1)
    assert [e.prompt for e in examples] == [f"Review: review {i}\nVerdict:" for i in rows]
    assert [e.label for e in examples] == [["bad", "good"][i % 2] for i in rows]
    assert [e.where for e in examples] == [f"{folder} row {i}" for i in rows]
    # more prompts than rows: the rows repeat
    more, _ = load_workload_examples(wl.model_copy(update={"num_prompts": 12}))
    assert [e.prompt for e in more][10:] == [e.prompt for e in more][:2]


def test_dataset_local_file_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "d.csv"
    f.write_text("question,answer\nq1,a1\nq2,a2\n")
    wl = WorkloadConfig(dataset={"path": str(f), "prompt_column": "question", "label_column": "answer"}, num_prompts=2)
    examples, label_map = load_workload_examples(wl)
    assert [(e.prompt, e.label) for e in examples] == [("q1", "a1"), ("q2", "a2")] and label_map is None
    # the default label column may be absent: unlabelled
    examples, _ = load_workload_examples(WorkloadConfig(dataset={"path": str(f), "prompt_column": "question"}, num_prompts=1))
    assert examples[0].label is None
    with pytest.raises(ConfigError, match=r"^workload\.dataset\.label_column: column 'gold' not in .*d\.csv "
                                          r"\(columns: question, answer\)$"):
        load_workload_examples(WorkloadConfig(dataset={"path": str(f), "prompt_column": "question",
                                                       "label_column": "gold"}, num_prompts=1))
    with pytest.raises(ConfigError, match=r"^workload\.dataset\.prompt_column: column 'prompt' not in"):
        load_workload_examples(WorkloadConfig(dataset={"path": str(f)}, num_prompts=1))
    folder = _saved_dataset(tmp_path)
    with pytest.raises(ConfigError, match=r"workload\.dataset: .*ds row \d: label 'bad' is not in workload\.label_map \(neg, pos\)"):
        load_workload_examples(WorkloadConfig(dataset={"path": str(folder), "prompt_column": "text",
                                                       "label_column": "stars"}, num_prompts=3, label_map=["neg", "pos"]))
    with pytest.raises(ConfigError, match=r"workload\.dataset\.split: .* has no split 'train' \(splits: test\)"):
        load_workload_examples(WorkloadConfig(dataset={"path": str(folder), "split": "train", "prompt_column": "text"}))
    with pytest.raises(ConfigError, match=r"workload\.dataset\.path: \./nowhere\.parquet not found"):
        load_workload_examples(WorkloadConfig(dataset={"path": "./nowhere.parquet"}))
    with pytest.raises(ValueError, match="set prompts or dataset, not both"):
        WorkloadConfig(prompts="builtin:short", dataset={"path": str(f)})


# -- the whole run ------------------------------------------------------------------------------

def _bench(tmp_path: Path, data: Path, extra: str = "") -> Path:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(f"""name: labelled
model: {{id: "builtin:tiny-llama-small", device: cpu}}
workload: {{prompts: {data.name}, num_prompts: 4, generate: {{max_new_tokens: 2}}, warmup_runs: 0,
           min_iterations: 1, batching: {{batch_size: 2}}{extra}}}
collectors: {{quality: {{metrics: [accuracy, f1_macro]}}, memory: false, energy: false, utilization: false}}
exporters: []
store: {tmp_path / 'store'}
""")
    return cfg


def test_run_cli_scores_a_labelled_jsonl(tmp_path: Path) -> None:
    from perfsdk.cli import cli

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": f"Say yes or no {i}", "label": ["yes", "no"][i % 2]} for i in range(4)])
    runner = CliRunner()
    res = runner.invoke(cli, ["run", str(_bench(tmp_path, data)), "--quiet"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["export", "--format", "csv", "--store", str(tmp_path / "store"), "--output", "-"])
    import csv
    import io

    row = next(csv.DictReader(io.StringIO(res.output)))
    # random weights: the tiny model never says "yes" or "no", so nothing is matched
    assert row["collectors.quality.accuracy"] == "0.0"
    assert row["collectors.quality.scored_requests"] == "4"
    assert row["collectors.quality.method"] == "label extraction"
    assert row["workload.labelled_prompts"] == "4"


def test_run_cli_label_outside_the_map_exits_2(tmp_path: Path) -> None:
    from perfsdk.cli import cli

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": "yes"}, {"prompt": "b", "label": "perhaps"}])
    res = CliRunner().invoke(cli, ["run", str(_bench(tmp_path, data, ", label_map: [yes, no]"))])
    assert res.exit_code == 2
    assert "workload.label_map: YAML read a name as a boolean" in res.output
    res = CliRunner().invoke(cli, ["run", str(_bench(tmp_path, data, ", label_map: ['yes', 'no']"))])
    assert res.exit_code == 2
    assert f"workload.prompts: {data} line 2: label 'perhaps' is not in workload.label_map (yes, no)" in res.output


def test_hub_dataset_offline_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"^workload\.dataset\.path: could not load 'someorg/no-such-data' "
                                          r"\(HF_HUB_OFFLINE is set and it is not in the local cache\)"):
        load_workload_examples(WorkloadConfig(dataset={"path": "someorg/no-such-data"}))

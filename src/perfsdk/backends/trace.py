"""Request traces to replay against a served model (``workload.load: {mode: replay, trace: FILE}``).

A trace is a JSONL file (one JSON object a line) or a CSV file (a header row) with, per request:

- ``time_s`` — when it is sent, in seconds from the start of the trace (rows need not be sorted;
  ``timestamp`` is accepted as another name);
- ``input_tokens`` — the prompt's length in tokens (a prompt of that length is built from the
  workload's prompts, with the model's tokenizer when there is one, else one word a token);
- ``output_tokens`` — the tokens to generate (sent as ``max_tokens``).

``workload.load.time_scale`` stretches (> 1) or compresses (< 1) the trace's times. A bad row
stops the run before anything is sent, naming the file, the row and the field.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsdk.config import ConfigError

FIELDS = ("time_s", "input_tokens", "output_tokens")
_ALIASES = {"timestamp": "time_s"}


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace."""

    time_s: float
    input_tokens: int
    output_tokens: int


def _rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        return [(i + 2, dict(row)) for i, row in enumerate(reader)]  # row 1 is the header
    from perfsdk.models.prompts import jsonl_objects

    return [(int(where.rsplit(" ", 1)[1]), obj)
            for where, obj in jsonl_objects("workload.load.trace", path, text.splitlines(), unit="row")]


def read_trace(path: str | Path) -> list[TraceRequest]:
    """The requests of a trace file, sorted by time; :class:`ConfigError` for a bad file or row."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"workload.load.trace: trace file {p} not found")
    out: list[TraceRequest] = []
    for row_no, raw in _rows(p):
        row = {_ALIASES.get(k, k): v for k, v in raw.items()}
        values: dict[str, Any] = {}
        for name in FIELDS:
            v = row.get(name)
            if v is None or v == "":
                raise ConfigError(f"workload.load.trace: {p} row {row_no}, field {name}: missing")
            try:
                values[name] = float(v) if name == "time_s" else int(float(v))
            except (TypeError, ValueError):
                raise ConfigError(f"workload.load.trace: {p} row {row_no}, field {name}: {v!r} is not a number") from None
            if name == "time_s" and values[name] < 0:
                raise ConfigError(f"workload.load.trace: {p} row {row_no}, field time_s: {v!r} is negative")
            if name != "time_s" and values[name] < 1:
                raise ConfigError(f"workload.load.trace: {p} row {row_no}, field {name}: {v!r} must be at least 1")
        out.append(TraceRequest(**values))
    if not out:
        raise ConfigError(f"workload.load.trace: {p} holds no request")
    return sorted(out, key=lambda r: r.time_s)


def prompt_of_length(n_tokens: int, corpus: list[str], tokenizer: Any = None) -> str:
    """A prompt of ``n_tokens`` tokens built from ``corpus`` (the tokenizer's count when given,
    else one word a token)."""
    words = " ".join(corpus).split() or ["hello"]
    k = len(words)
    text = " ".join(words[i % k] for i in range(n_tokens))
    if tokenizer is None:
        return text
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    while len(ids) < n_tokens:  # words that are one token each fall short: add more
        text += " " + words[len(ids) % k]
        ids = tok(text, add_special_tokens=False)["input_ids"]
    return str(tok.decode(ids[:n_tokens]))

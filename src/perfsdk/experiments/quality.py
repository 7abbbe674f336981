"""Quality metrics recorded with a run, so that sweeps can trade quality against speed.

``exact_match``, ``accuracy`` and ``f1_macro`` score predictions against references;
``perplexity`` scores a causal LM on a set of texts with the model's own loss, padding
excluded. :func:`record_quality` computes one and stores it with ``session.record`` so it shows
up as ``records.<name>`` in exports, DataFrames and sweep objectives.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Hashable, Sequence
from typing import Any

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def normalize_text(text: str) -> str:
    """Lower case, punctuation removed, whitespace collapsed."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def _check_lengths(a: Sequence[Any], b: Sequence[Any]) -> None:
    if len(a) != len(b):
        raise ValueError(f"{len(a)} predictions but {len(b)} references")
    if not a:
        raise ValueError("no predictions to score")


def exact_match(predictions: Sequence[str], references: Sequence[str], normalize: bool = True) -> float:
    """Share of predictions equal to their reference (after :func:`normalize_text` by default)."""
    _check_lengths(predictions, references)
    f = normalize_text if normalize else (lambda s: s)
    return sum(f(p) == f(r) for p, r in zip(predictions, references)) / len(predictions)


def accuracy(predictions: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Share of predicted labels equal to the true labels."""
    _check_lengths(predictions, labels)
    return sum(p == t for p, t in zip(predictions, labels)) / len(predictions)


def f1_macro(predictions: Sequence[Hashable], labels: Sequence[Hashable],
             classes: Sequence[Hashable] | None = None) -> float:
    """Unweighted mean of per-class F1 over ``classes`` (default: every class seen in either
    list). A class never predicted and never true would be 0/0 and is left out."""
    _check_lengths(predictions, labels)
    classes = list(classes) if classes is not None else sorted(set(labels) | set(predictions), key=repr)
    scores = []
    for c in classes:
        tp = sum(1 for p, t in zip(predictions, labels) if p == c and t == c)
        fp = sum(1 for p, t in zip(predictions, labels) if p == c and t != c)
        fn = sum(1 for p, t in zip(predictions, labels) if p != c and t == c)
        if tp + fp + fn == 0:
            continue
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores) if scores else 0.0


def perplexity(model: Any, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8,
               max_length: int | None = 256) -> float:
    """exp(mean negative log-likelihood per predicted token) of a causal LM over ``texts``.

    Every token but the first of each text is predicted; padding positions are masked out of
    the loss (labels ``-100``), so batching does not change the result beyond float rounding.
    """
    import torch

    if not texts:
        raise ValueError("perplexity needs at least one text")
    if getattr(tokenizer, "pad_token", "x") is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = next(model.parameters()).device
    total_nll = 0.0
    total_tokens = 0
    for i in range(0, len(texts), batch_size):
        chunk = list(texts[i:i + batch_size])
        kw: dict[str, Any] = {"return_tensors": "pt", "padding": True}
        if max_length is not None:
            kw.update(truncation=True, max_length=max_length)
        if hasattr(tokenizer, "padding_side"):
            kw["padding_side"] = "right"
        enc = tokenizer(chunk, **kw).to(device)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
        labels = ids.masked_fill(mask == 0, -100)
        shift_logits = logits[:, :-1, :].reshape(-1, logits.shape[-1])
        shift_labels = labels[:, 1:].reshape(-1)
        nll = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
        n = int((shift_labels != -100).sum())
        total_nll += float(nll)
        total_tokens += n
    if total_tokens == 0:
        raise ValueError("perplexity: the texts have no predictable tokens (each needs at least two)")
    return math.exp(total_nll / total_tokens)


METRICS = ("exact_match", "accuracy", "f1_macro", "perplexity")


def record_quality(session: Any, name: str, *, metric: str = "exact_match",
                   predictions: Sequence[Any] | None = None, references: Sequence[Any] | None = None,
                   model: Any = None, tokenizer: Any = None, texts: Sequence[str] | None = None,
                   **kwargs: Any) -> float:
    """Compute a quality metric and store it with the run as ``records.<name>``; returns it.

    ``exact_match``/``accuracy``/``f1_macro`` need ``predictions`` and ``references``;
    ``perplexity`` needs ``texts`` and uses ``model``/``tokenizer`` (default: the session's).
    """
    if metric == "perplexity":
        model = model if model is not None else session.model
        tokenizer = tokenizer if tokenizer is not None else session.tokenizer
        if model is None or tokenizer is None or texts is None:
            raise ValueError("perplexity needs texts and a loaded model and tokenizer")
        value = perplexity(model, tokenizer, texts, **kwargs)
    elif metric in ("exact_match", "accuracy", "f1_macro"):
        if predictions is None or references is None:
            raise ValueError(f"{metric} needs predictions and references")
        fns: dict[str, Callable[..., float]] = {"exact_match": exact_match, "accuracy": accuracy, "f1_macro": f1_macro}
        fn = fns[metric]
        value = fn(predictions, references, **kwargs)
    else:
        raise ValueError(f"unknown quality metric {metric!r}; valid: {', '.join(METRICS)}")
    session.record(name, value, unit=None if metric == "perplexity" else "ratio")
    return value

"""Quality metrics: one place for every score perfsdk computes.

The ``quality`` collector (:mod:`perfsdk.collectors.quality`) scores the very steps a run
timed with these functions; :func:`record_quality` stores one with ``session.record`` for code
that scores its own outputs. The definitions:

- ``exact_match``: share of predictions equal to their reference after :func:`normalize_text`.
- ``accuracy``: share of predicted labels equal to the true labels.
- ``f1_macro``: unweighted mean of the per-class F1 scores.
- ``f1_weighted``: mean of the per-class F1 scores weighted by each class's number of true
  instances (its support), so frequent classes count more.
- ``loss``: mean cross-entropy (natural log) per predicted token (or per classified request).
- ``perplexity``: ``exp(loss)``.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Hashable, Sequence
from typing import Any

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")
_ARTICLES = frozenset({"a", "an", "the"})


def normalize_text(text: str) -> str:
    """Lower case, punctuation replaced by spaces, the articles *a*, *an*, *the* dropped,
    whitespace collapsed: ``"  The Cat, sat! "`` -> ``"cat sat"``."""
    words = _PUNCT.sub(" ", text.lower()).split()
    return " ".join(w for w in words if w not in _ARTICLES)


def extract_label(text: str, labels: Sequence[str]) -> str | None:
    """The label a generated text names: the label whose normalized form first appears as
    whole words in the normalized text (the earliest occurrence wins; at the same position the
    longer label wins, so ``"very good"`` beats ``"very"``). ``None`` when no label appears."""
    words = normalize_text(text).split()
    best: tuple[int, int] | None = None
    found: str | None = None
    for label in labels:
        target = normalize_text(str(label)).split()
        if not target:
            continue
        n = len(target)
        for pos in range(len(words) - n + 1):
            if words[pos:pos + n] == target:
                key = (pos, -n)
                if best is None or key < best:
                    best, found = key, label
                break
    return found


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


def f1_per_class(predictions: Sequence[Hashable], labels: Sequence[Hashable],
                 classes: Sequence[Hashable] | None = None) -> dict[Hashable, tuple[float, int]]:
    """``class -> (F1, support)`` over ``classes`` (default: every class seen in either list,
    ``None`` predictions excluded). F1 = 2·TP / (2·TP + FP + FN); support = true instances. A
    class never predicted and never true would be 0/0 and is left out."""
    _check_lengths(predictions, labels)
    if classes is None:
        classes = sorted({c for c in (*labels, *predictions) if c is not None}, key=repr)
    out: dict[Hashable, tuple[float, int]] = {}
    for c in classes:
        tp = sum(1 for p, t in zip(predictions, labels) if p == c and t == c)
        fp = sum(1 for p, t in zip(predictions, labels) if p == c and t != c)
        fn = sum(1 for p, t in zip(predictions, labels) if p != c and t == c)
        if tp + fp + fn == 0:
            continue
        out[c] = (2 * tp / (2 * tp + fp + fn), tp + fn)
    return out


def f1_macro(predictions: Sequence[Hashable], labels: Sequence[Hashable],
             classes: Sequence[Hashable] | None = None) -> float:
    """Unweighted mean of per-class F1 (:func:`f1_per_class`)."""
    scores = f1_per_class(predictions, labels, classes)
    return sum(f for f, _ in scores.values()) / len(scores) if scores else 0.0


def f1_weighted(predictions: Sequence[Hashable], labels: Sequence[Hashable],
                classes: Sequence[Hashable] | None = None) -> float:
    """Mean of per-class F1 weighted by support (true instances of each class); classes that
    never occur as a true label weigh nothing."""
    scores = f1_per_class(predictions, labels, classes)
    total = sum(n for _, n in scores.values())
    return sum(f * n for f, n in scores.values()) / total if total else 0.0


def token_nll(logits: Any, targets: Any, ignore_index: int = -100) -> tuple[list[float], list[int]]:
    """Per-row summed negative log-likelihood (natural log) and predicted-token count.

    ``logits[b, t]`` predicts ``targets[b, t + 1]`` (the usual causal shift); target positions
    equal to ``ignore_index`` (prompt or padding) are left out. Computed in float32.
    """
    import torch

    shift_logits = logits[:, :-1, :].float()
    shift_targets = targets[:, 1:]
    nll = torch.nn.functional.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]),
                                            shift_targets.reshape(-1), ignore_index=ignore_index, reduction="none")
    nll = nll.reshape(shift_targets.shape)
    keep = shift_targets != ignore_index
    sums = (nll * keep).sum(dim=1)
    return [float(x) for x in sums.tolist()], [int(x) for x in keep.sum(dim=1).tolist()]


def class_nll(logits: Any, targets: Sequence[int]) -> list[float]:
    """Negative log-likelihood (natural log) of each row's target class, from 2-D logits."""
    import torch

    t = torch.tensor(list(targets), dtype=torch.long, device=logits.device)
    nll = torch.nn.functional.cross_entropy(logits.float(), t, reduction="none")
    return [float(x) for x in nll.tolist()]


def loss_from_nll(nll_total: float, count: int) -> float:
    """Mean negative log-likelihood per predicted token (or per request)."""
    if count <= 0:
        raise ValueError("no predicted tokens to average")
    return nll_total / count


def text_nll(model: Any, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8,
             max_length: int | None = 256) -> tuple[float, int]:
    """Summed negative log-likelihood and predicted-token count of a causal LM over ``texts``.

    Every token but the first of each text is predicted; padding positions are masked out
    (right padding, labels ``-100``), so batching does not change the result beyond rounding.
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
            logits = model(input_ids=ids, attention_mask=mask).logits
        sums, counts = token_nll(logits, ids.masked_fill(mask == 0, -100))
        total_nll += sum(sums)
        total_tokens += sum(counts)
    return total_nll, total_tokens


def perplexity(model: Any, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8,
               max_length: int | None = 256) -> float:
    """exp(mean negative log-likelihood per predicted token) of a causal LM over ``texts``
    (:func:`text_nll`)."""
    total_nll, total_tokens = text_nll(model, tokenizer, texts, batch_size=batch_size, max_length=max_length)
    if total_tokens == 0:
        raise ValueError("perplexity: the texts have no predictable tokens (each needs at least two)")
    return math.exp(total_nll / total_tokens)


#: Every metric name, as the quality collector's ``metrics`` setting and ``record_quality`` accept them.
METRICS = ("accuracy", "f1_macro", "f1_weighted", "exact_match", "perplexity", "loss")

_LABEL_METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match, "accuracy": accuracy, "f1_macro": f1_macro, "f1_weighted": f1_weighted,
}


def record_quality(session: Any, name: str, *, metric: str = "exact_match",
                   predictions: Sequence[Any] | None = None, references: Sequence[Any] | None = None,
                   model: Any = None, tokenizer: Any = None, texts: Sequence[str] | None = None,
                   **kwargs: Any) -> float:
    """Compute a quality metric and store it with the run as ``records.<name>``; returns it.

    ``exact_match``/``accuracy``/``f1_macro``/``f1_weighted`` need ``predictions`` and
    ``references``; ``perplexity`` and ``loss`` need ``texts`` and use ``model``/``tokenizer``
    (default: the session's).
    """
    if metric in ("perplexity", "loss"):
        model = model if model is not None else session.model
        tokenizer = tokenizer if tokenizer is not None else session.tokenizer
        if model is None or tokenizer is None or texts is None:
            raise ValueError(f"{metric} needs texts and a loaded model and tokenizer")
        value = perplexity(model, tokenizer, texts, **kwargs)
        if metric == "loss":
            value = math.log(value)
    elif metric in _LABEL_METRICS:
        if predictions is None or references is None:
            raise ValueError(f"{metric} needs predictions and references")
        value = _LABEL_METRICS[metric](predictions, references, **kwargs)
    else:
        raise ValueError(f"unknown quality metric {metric!r}; valid: {', '.join(METRICS)}")
    session.record(name, value, unit="ratio" if metric in _LABEL_METRICS else None)
    return value

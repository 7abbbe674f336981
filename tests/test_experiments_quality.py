"""Quality metrics: hand-computed exact match, accuracy, macro F1; perplexity from the model's loss."""

from __future__ import annotations

import math
from typing import Any

import pytest

from perfsdk.experiments.quality import accuracy, exact_match, f1_macro, normalize_text, perplexity, record_quality


def test_exact_match() -> None:
    assert normalize_text("  The Cat, sat! ") == "cat sat"
    preds = ["Paris", "the cat sat.", "42", "no"]
    refs = ["paris", "The cat sat", "41", "No!"]
    assert exact_match(preds, refs) == 0.75
    assert exact_match(preds, refs, normalize=False) == 0.0
    with pytest.raises(ValueError, match="3 predictions but 2 references"):
        exact_match(["a", "b", "c"], ["a", "b"])


def test_accuracy_and_macro_f1() -> None:
    labels = ["a", "a", "a", "b", "b", "c"]
    preds = ["a", "a", "b", "b", "c", "c"]
    assert accuracy(preds, labels) == pytest.approx(4 / 6)
    # a: tp2 fp0 fn1 -> 4/5; b: tp1 fp1 fn1 -> 1/2; c: tp1 fp1 fn0 -> 2/3
    assert f1_macro(preds, labels) == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)
    # a class given explicitly but absent from both lists is 0/0 and left out
    assert f1_macro(preds, labels, classes=["a", "b", "c", "d"]) == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)
    assert f1_macro([1, 1], [1, 1]) == 1.0


class ByteTokenizer:
    """Each character is a token id (ord % 250 + 4); pads with 0 on the requested side."""

    pad_token = "<pad>"

    def __call__(self, texts: list[str], return_tensors: str = "pt", padding: bool = True, truncation: bool = False,
                 max_length: int | None = None, padding_side: str = "right") -> Any:
        import torch
        from transformers import BatchEncoding

        seqs = [[ord(c) % 250 + 4 for c in t][: max_length if truncation and max_length else None] for t in texts]
        n = max(len(s) for s in seqs)
        ids, mask = [], []
        for s in seqs:
            pad = [0] * (n - len(s))
            ids.append(s + pad if padding_side == "right" else pad + s)
            mask.append([1] * len(s) + [0] * len(pad) if padding_side == "right" else [0] * len(pad) + [1] * len(s))
        return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})


def test_perplexity_matches_the_model_loss_and_ignores_padding(tiny_causal_lm: Any) -> None:
    import torch

    tok = ByteTokenizer()
    texts = ["hello world", "a much longer sentence than the first one", "xy"]
    # reference: token-weighted mean of per-text losses, each computed alone (no padding at all)
    nll, count = 0.0, 0
    for t in texts:
        enc = tok([t])
        with torch.no_grad():
            loss = tiny_causal_lm(input_ids=enc["input_ids"], labels=enc["input_ids"]).loss
        n = enc["input_ids"].shape[1] - 1
        nll += float(loss) * n
        count += n
    expected = math.exp(nll / count)
    assert perplexity(tiny_causal_lm, tok, texts, batch_size=3) == pytest.approx(expected, rel=1e-4)
    assert perplexity(tiny_causal_lm, tok, texts, batch_size=1) == pytest.approx(expected, rel=1e-4)
    # random weights over a 256-token vocabulary: perplexity near the vocabulary size
    assert 100 < expected < 600
    with pytest.raises(ValueError, match="no predictable tokens"):
        perplexity(tiny_causal_lm, tok, ["a"])


def test_record_quality_stores_records(tiny_causal_lm: Any) -> None:
    import perfsdk

    with perfsdk.session({"exporters": []}, store=None) as s:
        s.load(model=tiny_causal_lm, tokenizer=ByteTokenizer())
        v = record_quality(s, "em", predictions=["a", "b"], references=["a", "c"])
        f = record_quality(s, "f1", metric="f1_macro", predictions=[0, 1], references=[0, 1])
        ppl = record_quality(s, "ppl", metric="perplexity", texts=["hello there"])
    assert v == 0.5 and f == 1.0
    recs = {r.name: (r.value, r.unit) for r in s.result.records}  # type: ignore[union-attr]
    assert recs["em"] == (0.5, "ratio") and recs["f1"] == (1.0, "ratio")
    assert recs["ppl"] == (pytest.approx(ppl), None)
    from perfsdk.exporters.flatten import run_row

    row = run_row(s.result)  # type: ignore[arg-type]
    assert row["records.em"] == 0.5
    with pytest.raises(ValueError, match="unknown quality metric"):
        record_quality(s, "x", metric="bleu", predictions=[], references=[])

"""The quality collector: exact metric values on hand-made labels, on the timed steps themselves."""

from __future__ import annotations

import math
from typing import Any

import pytest

import perfsdk
from perfsdk.collectors.quality import QualityCollector, QualityResult, report_html
from perfsdk.experiments.quality import extract_label, f1_macro, f1_weighted, normalize_text


def _session(metrics: list[str], **workload: Any) -> Any:
    cfg: dict[str, Any] = {"exporters": [], "collectors": {"quality": {"metrics": metrics}}}
    if workload:
        cfg["workload"] = workload
    return perfsdk.session(cfg, store=None)


# -- metric functions -------------------------------------------------------------------------

def test_weighted_f1_by_hand() -> None:
    labels = ["a", "a", "a", "b", "b", "c"]
    preds = ["a", "a", "b", "b", "c", "c"]
    # per class (F1, support): a (4/5, 3), b (1/2, 2), c (2/3, 1)
    assert f1_weighted(preds, labels) == pytest.approx((4 / 5 * 3 + 1 / 2 * 2 + 2 / 3 * 1) / 6)
    # a predicted class that is never true weighs nothing in the weighted mean, but counts in the macro one
    assert f1_weighted(["a", "x"], ["a", "a"]) == pytest.approx(2 / 3)  # a: tp1 fp0 fn1 -> 2/3, support 2
    assert f1_macro(["a", "x"], ["a", "a"]) == pytest.approx((2 / 3 + 0) / 2)
    # None (no label found) is never a class: it is a miss for the true class only
    assert f1_macro([None, "b"], ["a", "b"]) == pytest.approx((0 + 1) / 2)


def test_normalization_and_label_extraction() -> None:
    assert normalize_text("  An Apple, the  PIE! ") == "apple pie"
    labels = ["positive", "negative", "very negative"]
    assert extract_label("I think: Negative.", labels) == "negative"
    # the earliest label in the text wins, not the first in the label map
    assert extract_label("positive? no, negative", ["negative", "positive"]) == "positive"
    # at the same position, the longer label wins
    assert extract_label("very negative indeed", labels) == "very negative"
    # whole words only
    assert extract_label("positively not", labels) is None
    assert extract_label("", labels) is None


# -- a classifier: argmax of the timed logits -------------------------------------------------

class FixedClassifier:
    """Stands in for a sequence classifier: returns preset logits for the batch it is given."""

    def __init__(self, logits: list[list[float]]) -> None:
        import torch

        self.module = torch.nn.Linear(1, 1)
        self.logits = torch.tensor(logits)

    def build(self) -> Any:
        import torch

        logits = self.logits

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(1))

            def forward(self, x: Any) -> Any:
                return logits[x.long().flatten()]

        return Net()


def test_classifier_accuracy_f1_and_loss_match_hand_and_torch() -> None:
    import torch

    # six requests, three classes; rows of logits picked by the request's id
    logits = [[2.0, 0.5, 0.1], [1.5, 0.2, 0.3], [0.1, 0.9, 0.2], [0.3, 2.0, 0.1], [0.0, 0.1, 3.0], [0.2, 0.1, 1.0]]
    labels = ["neg", "neg", "neg", "pos", "pos", "neu"]
    names = ["neg", "pos", "neu"]
    model = FixedClassifier(logits).build()
    with _session(["accuracy", "f1_macro", "f1_weighted", "loss", "perplexity"], label_map=names) as s:
        s.load(model=model)
        x1 = s.label(torch.tensor([0, 1, 2]), labels[:3])
        x2 = s.label(torch.tensor([3, 4, 5]), labels[3:])
        with s.warmup():
            s.forward(model, x1)  # warm-up steps are not scored
        s.forward(model, x1)
        s.forward(model, x2)
    q = QualityResult.model_validate(s.result.collectors["quality"])  # type: ignore[union-attr]
    # argmax: neg neg pos pos neu neu  vs  neg neg neg pos pos neu
    assert q.method == "argmax"
    assert (q.requests, q.scored_requests, q.correct) == (6, 6, 4)
    assert q.accuracy == pytest.approx(4 / 6)
    # neg: tp2 fp0 fn1 -> 4/5 (support 3); pos: tp1 fp1 fn1 -> 1/2 (2); neu: tp1 fp1 fn0 -> 2/3 (1)
    assert q.f1_macro == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)
    assert q.f1_weighted == pytest.approx((4 / 5 * 3 + 1 / 2 * 2 + 2 / 3 * 1) / 6)
    assert q.f1_per_class == pytest.approx({"neg": 4 / 5, "pos": 1 / 2, "neu": 2 / 3})
    expected = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor([0, 0, 0, 1, 1, 2]))
    assert q.loss == pytest.approx(float(expected), rel=1e-6)
    assert q.perplexity == pytest.approx(math.exp(float(expected)), rel=1e-6)
    assert (q.loss_tokens, q.loss_source, q.reference_forward_s) == (6, "timed logits", None)
    assert q.classes == names and q.reasons == []
    rows = s.series["requests"]
    assert [(r["step"], r["request"], r["reference"], r["prediction"], r["correct"]) for r in rows] == [
        (1, 0, "neg", "neg", True), (1, 1, "neg", "neg", True), (1, 2, "neg", "pos", False),
        (2, 0, "pos", "pos", True), (2, 1, "pos", "neu", False), (2, 2, "neu", "neu", True)]
    from perfsdk.exporters.flatten import run_row

    row = run_row(s.result)  # type: ignore[arg-type]
    assert row["collectors.quality.accuracy"] == pytest.approx(4 / 6)


def test_class_indices_as_labels_and_unlabelled_requests() -> None:
    import torch

    model = FixedClassifier([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]).build()
    with _session(["accuracy"]) as s:
        s.load(model=model)
        s.forward(model, s.label(torch.tensor([0, 1]), [1, 1]))   # integer labels, no label map
        s.forward(model, torch.tensor([2]))                       # unlabelled: not scored
    q = s.result.collectors["quality"]  # type: ignore[union-attr]
    assert (q["requests"], q["scored_requests"], q["accuracy"], q["classes"]) == (3, 2, 0.5, ["1"])


def test_no_labels_says_why() -> None:
    import torch

    model = FixedClassifier([[0.0, 1.0]]).build()
    with _session(["accuracy", "f1_macro"]) as s:
        s.forward(model, torch.tensor([0]))
    q = s.result.collectors["quality"]  # type: ignore[union-attr]
    assert q["accuracy"] is None and q["f1_macro"] is None
    assert q["reasons"][0].startswith("no labelled requests in the timed steps")
    assert QualityCollector.summary_rows(QualityResult.model_validate(q))[0][1].startswith("unavailable: no labelled")


# -- a generator: exact match and label extraction on the generated text ---------------------

WORDS = ["<pad>", "<s>", "</s>", "the", "answer", "is", "positive", "negative", "Positive.", "x"]


class WordTokenizer:
    """Token id = index in WORDS; decode joins words with spaces and skips special tokens."""

    pad_token = "<pad>"
    pad_token_id = 0
    eos_token = "</s>"
    padding_side = "left"

    def __call__(self, texts: Any, add_special_tokens: bool = True, **kw: Any) -> Any:
        import torch
        from transformers import BatchEncoding

        single = isinstance(texts, str)
        rows = [[WORDS.index(w) for w in t.split()] for t in ([texts] if single else texts)]
        if kw.get("return_tensors") != "pt":
            return {"input_ids": rows[0] if single else rows}
        n = max(len(r) for r in rows)
        ids = [[0] * (n - len(r)) + r for r in rows]
        mask = [[0] * (n - len(r)) + [1] * len(r) for r in rows]
        return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(WORDS[i] for i in ids if not (skip_special_tokens and i < 3))


def _generator(replies: list[list[int]]) -> Any:
    import torch

    class Gen(torch.nn.Module):
        """Answers every request with a preset reply (padded with EOS), through the streamer."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.generation_config = type("GC", (), {"eos_token_id": 2})()

        def can_generate(self) -> bool:
            return True

        def generate(self, input_ids: Any, attention_mask: Any = None, streamer: Any = None, **kw: Any) -> Any:
            n = max(len(r) for r in replies)
            new = torch.tensor([r + [2] * (n - len(r)) for r in replies[: input_ids.shape[0]]])
            if streamer is not None:
                streamer.put(input_ids)
                for k in range(n):
                    streamer.put(new[:, k])
                streamer.end()
            return torch.cat([input_ids, new], dim=1)

    return Gen()


def test_generated_text_exact_match_and_extracted_labels() -> None:
    ids = {w: i for i, w in enumerate(WORDS)}
    replies = [[ids["positive"], 2], [ids["the"], ids["answer"], ids["is"], ids["negative"]],
               [ids["Positive."]], [ids["x"], 2]]
    model = _generator(replies)
    tok = WordTokenizer()
    with _session(["accuracy", "f1_macro", "exact_match"], label_map=["positive", "negative"]) as s:
        s.load(model=model, tokenizer=tok)
        enc = s.tokenize(tok, ["x", "x x", "x", "x"], labels=["positive", "positive", "positive", "negative"])
        s.generate(model, **enc, max_new_tokens=4)
    q = QualityResult.model_validate(s.result.collectors["quality"])  # type: ignore[union-attr]
    # texts: "positive", "the answer is negative", "Positive.", "x"
    # extracted: positive, negative, positive, None  vs  positive, positive, positive, negative
    assert q.method == "label extraction"
    assert q.accuracy == pytest.approx(2 / 4)
    assert q.unmatched_predictions == 1
    # positive: tp2 fp0 fn1 -> 4/5; negative: tp0 fp1 fn1 -> 0
    assert q.f1_macro == pytest.approx((4 / 5 + 0) / 2)
    # exact match after normalization: "positive"==positive, "Positive."==positive -> 2 of 4
    assert q.exact_match == pytest.approx(2 / 4) and q.exact_matches == 2
    rows = s.series["requests"]
    assert [r["prediction"] for r in rows] == ["positive", "negative", "positive", None]
    assert [r["correct"] for r in rows] == [True, False, True, False]
    assert [r["exact_match"] for r in rows] == [True, False, True, False]
    # the latency collector's per-request columns are still there
    assert all("ttft_s" in r for r in rows)
    labels = dict(QualityCollector.summary_rows(q))
    assert labels["accuracy"] == "0.5000 (2/4)" and labels["exact match"] == "0.5000 (2/4)"
    page = report_html(q)
    assert "<td>accuracy</td><td>0.5000 (2/4)</td>" in page and "<td>positive</td><td>0.8000</td>" in page


# -- a causal LM: loss and perplexity against torch cross-entropy ----------------------------

class ByteTokenizer:
    """Each character is a token id (ord % 250 + 4); pads with 0 on the requested side."""

    pad_token = "<pad>"
    pad_token_id = 0

    def __call__(self, texts: Any, return_tensors: str = "pt", padding: bool = True, add_special_tokens: bool = True,
                 padding_side: str = "right", **kw: Any) -> Any:
        import torch
        from transformers import BatchEncoding

        if isinstance(texts, str):  # the quality collector tokenizes a reference alone
            return {"input_ids": [ord(c) % 250 + 4 for c in texts]}
        seqs = [[ord(c) % 250 + 4 for c in t] for t in texts]
        n = max(len(s) for s in seqs)
        ids, mask = [], []
        for s in seqs:
            pad = [0] * (n - len(s))
            ids.append(s + pad if padding_side == "right" else pad + s)
            mask.append([1] * len(s) + [0] * len(pad) if padding_side == "right" else [0] * len(pad) + [1] * len(s))
        return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})


def test_causal_lm_prompt_perplexity_from_the_timed_logits(tiny_causal_lm: Any) -> None:
    import torch

    tok = ByteTokenizer()
    with _session(["perplexity", "loss"]) as s:
        s.load(model=tiny_causal_lm, tokenizer=tok)
        enc = tok(["hello world", "xy"], padding_side="left")
        s.forward(tiny_causal_lm, **enc)
    q = s.result.collectors["quality"]  # type: ignore[union-attr]
    nll, count = 0.0, 0
    for text in ("hello world", "xy"):
        ids = tok([text])["input_ids"]
        with torch.no_grad():
            loss = tiny_causal_lm(input_ids=ids, labels=ids).loss
        nll += float(loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    assert q["loss_tokens"] == count == 11
    assert q["loss"] == pytest.approx(nll / count, rel=1e-4)
    assert q["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert q["loss_source"] == "timed logits" and q["reference_forward_s"] is None


def test_causal_lm_reference_loss_runs_after_the_timed_steps(tiny_causal_lm: Any) -> None:
    import torch

    tok = ByteTokenizer()
    prompts, refs = ["2+2=", "capital:"], ["4", "paris"]
    with _session(["loss"]) as s:
        s.load(model=tiny_causal_lm, tokenizer=tok)
        enc = s.tokenize(tok, prompts, labels=refs)
        s.forward(tiny_causal_lm, **enc)
        s.forward(tiny_causal_lm, **enc)  # same inputs again: scored again, forwarded once
    q = s.result.collectors["quality"]  # type: ignore[union-attr]
    # expected: each prompt + " " + reference alone, loss on the reference tokens only
    nll, count = 0.0, 0
    for p, r in zip(prompts, refs):
        p_ids = [ord(c) % 250 + 4 for c in p]
        r_ids = [ord(c) % 250 + 4 for c in " " + r]
        ids = torch.tensor([p_ids + r_ids])
        labels = torch.tensor([[-100] * len(p_ids) + r_ids])
        with torch.no_grad():
            loss = tiny_causal_lm(input_ids=ids, labels=labels).loss
        nll += float(loss) * len(r_ids)
        count += len(r_ids)
    assert q["loss_tokens"] == 2 * count == 2 * (2 + 6)
    assert q["loss"] == pytest.approx(nll / count, rel=1e-4)
    assert q["loss_source"] == "reference forward after the timed steps"
    assert q["reference_forward_s"] > 0
    # the extra forward is no step of the run and sits after the session window
    assert len(s.steps) == 2
    session_window = next(w for w in s.windows if w.kind == "session")
    assert session_window.end_ns <= s.end_ns  # type: ignore[operator]


def test_config_errors_name_the_field() -> None:
    with pytest.raises(perfsdk.ConfigError, match=r"collectors\.quality\.metrics\.0: Input should be 'accuracy'"):
        perfsdk.session({"collectors": {"quality": {"metrics": ["bleu"]}}}, store=None)


def test_merge_ranks_pools_the_requests_of_every_rank() -> None:
    from types import SimpleNamespace

    def share(rank: int, rows: list[tuple[str, str | None]]) -> Any:
        correct = sum(1 for ref, pred in rows if ref == pred)
        res = QualityResult(metrics=["accuracy", "f1_macro"], accuracy=correct / len(rows), requests=len(rows),
                            scored_requests=len(rows), correct=correct, classes=["a", "b"])
        series = [{"step": 0, "request": i, "reference": ref, "prediction": pred, "correct": ref == pred}
                  for i, (ref, pred) in enumerate(rows)]
        return SimpleNamespace(rank=rank, hostname=None, result=res, series={"requests": series})

    merged = QualityCollector.merge_ranks([share(0, [("a", "a"), ("a", "b")]), share(1, [("b", "b"), ("b", None)])])
    assert merged is not None
    assert (merged.requests, merged.scored_requests, merged.correct) == (4, 4, 2)
    assert merged.accuracy == 0.5
    # a: tp1 fp0 fn1 -> 2/3; b: tp1 fp1 fn1 -> 1/2
    assert merged.f1_macro == pytest.approx((2 / 3 + 1 / 2) / 2)
    # without the series: accuracy weighted by scored requests, no F1
    bare = [SimpleNamespace(rank=r, hostname=None, result=s.result, series={}) for r, s in
            enumerate([share(0, [("a", "a")]), share(1, [("b", "a"), ("b", "a"), ("a", "a")])])]
    merged = QualityCollector.merge_ranks(bare)
    assert merged is not None and merged.accuracy == pytest.approx(2 / 4) and merged.f1_macro is None


def test_forward_runs_with_quality_rows_compare_cleanly(tmp_path: Any) -> None:
    import torch

    from perfsdk.experiments.compare import grouped_samples_for
    from perfsdk.store import Store

    model = FixedClassifier([[0.0, 1.0], [1.0, 0.0]]).build()
    cfg = {"exporters": [], "collectors": {"quality": {}}, "store": str(tmp_path)}
    with perfsdk.session(cfg) as s:
        s.forward(model, s.label(torch.tensor([0, 1]), [1, 1]))
    store = Store(tmp_path)
    run = store.get(s.result.run_id)  # type: ignore[union-attr]
    rows = store.read_series(run.run_id, "requests")
    assert [(r["reference"], r["prediction"], r["correct"]) for r in rows] == [("1", "1", True), ("1", "0", False)]
    # forward steps have no per-request latency: nothing to compare, and no error
    assert grouped_samples_for(store, run, "output_tokens_per_s") is None
    assert grouped_samples_for(store, run, "ttft_s") is None

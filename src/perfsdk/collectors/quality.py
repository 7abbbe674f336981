"""Quality: accuracy, F1, exact match, loss and perplexity of the very steps that were timed.

Off by default; enable with ``collectors: {quality: {metrics: [accuracy, f1_macro]}}``. It scores
the measured (not warm-up, not failed) steps whose inputs carry labels (``s.tokenize(...,
labels=...)`` or ``s.label(inputs, labels)``; the workload runner labels them from labelled
prompt files and datasets). Nothing runs inside a timed window: predictions are read from the
outputs each step already produced, when the session finalizes.

How a request's prediction is made:

- ``forward`` step, 2-D logits ``[batch, classes]`` (a sequence classifier, or any module
  returning such a tensor): the argmax class, named through the label map.
- ``forward`` step on a causal LM (logits ``[batch, tokens, vocab]``): label scoring — the
  label whose first token has the highest logit at the prompt's last position.
- ``generate`` step: the generated text (real tokens only, special tokens skipped). Exact match
  compares it with the reference after :func:`~perfsdk.experiments.quality.normalize_text`;
  accuracy and F1 use the label it names (:func:`~perfsdk.experiments.quality.extract_label`:
  the label-map entry that appears first, as whole words, in the normalized text).

The label map is ``workload.label_map``, else the one the workload runner resolved (a
dataset's class names, a classifier's ``id2label``), else a classifier's own ``id2label``, else
the distinct references of the run in sorted order.

``loss`` and ``perplexity`` (= exp(loss)) are only computed when asked. For a classifier they
come from the timed logits (cross-entropy against the label's index). For a causal LM the loss
is the mean negative log-likelihood per token of the reference appended to the prompt after one
space (of the prompt's own tokens when a request has no reference); it needs one extra forward
per distinct (prompt, reference), which runs after the session window has closed and the
sampler has stopped, so it is outside every measured window (its time is reported as
``reference_forward_s``). An unlabelled ``forward`` step on a causal LM needs no extra forward:
its timed logits already score the prompt.

Per-request outcomes (reference, prediction, correct, exact match, negative log-likelihood)
are added to the ``requests`` series, on the latency collector's rows when they exist.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from perfsdk.collector import Collector, CollectorConfig, CollectorResult
from perfsdk.events import Step
from perfsdk.experiments import quality as metrics_mod
from perfsdk.plugins import hookimpl

Metric = Literal["accuracy", "f1_macro", "f1_weighted", "exact_match", "perplexity", "loss"]
LABEL_METRICS = ("accuracy", "f1_macro", "f1_weighted")


class QualityConfig(CollectorConfig):
    """Settings of the quality collector."""

    metrics: list[Metric] = Field(default_factory=lambda: ["accuracy", "f1_macro"],  # type: ignore[arg-type]
                                  description="which metrics to compute")
    reference_batch_size: int = Field(default=8, ge=1,
                                      description="batch size of the extra forward that scores references (loss, perplexity)")

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("name at least one metric")
        if len(set(v)) != len(v):
            raise ValueError("metrics repeat")
        return v


class QualityResult(CollectorResult):
    """Quality of the timed steps; a metric that was not asked for, or could not be computed,
    is ``None`` (``reasons`` says why for the latter)."""

    accuracy: float | None = None
    f1_macro: float | None = None
    f1_weighted: float | None = None
    exact_match: float | None = None
    perplexity: float | None = None
    loss: float | None = None
    metrics: list[str] = Field(default_factory=list)
    method: str | None = None
    requests: int = 0
    scored_requests: int = 0
    correct: int = 0
    exact_matches: int = 0
    unmatched_predictions: int = 0
    loss_tokens: int = 0
    loss_source: str | None = None
    reference_forward_s: float | None = None
    classes: list[str] = Field(default_factory=list)
    f1_per_class: dict[str, float] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)


class _Request:
    """One scored request (one row of one measured step)."""

    __slots__ = ("step", "request", "reference", "prediction", "predicted", "text", "nll", "tokens", "prompt_ids",
                 "kind")

    def __init__(self, step: int, request: int, reference: str | None, kind: str) -> None:
        self.step = step
        self.request = request
        self.reference = reference
        self.prediction: str | None = None
        self.predicted = False  # a prediction was made (it may be None: no label found in the text)
        self.text: str | None = None
        self.nll: float | None = None
        self.tokens = 0
        self.prompt_ids: list[int] | None = None
        self.kind = kind


def _logits(outputs: Any) -> Any:
    if outputs is None:
        return None
    if hasattr(outputs, "shape"):
        return outputs
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, (tuple, list)) and outputs and hasattr(outputs[0], "shape"):
        logits = outputs[0]
    return logits


def _real_ids(step: Step, i: int) -> list[int] | None:
    ids = step.inputs.get("input_ids")
    if ids is None or not hasattr(ids, "shape") or len(ids.shape) != 2:
        return None
    row = ids[i]
    mask = step.inputs.get("attention_mask")
    if mask is not None:
        row = row[mask[i].bool()]
    return [int(x) for x in row.tolist()]


def _last_positions(step: Step, batch: int, length: int) -> list[int]:
    mask = step.inputs.get("attention_mask")
    if mask is None:
        return [length - 1] * batch
    out = []
    for i in range(batch):
        nz = mask[i].nonzero()
        out.append(int(nz[-1]) if len(nz) else length - 1)
    return out


def _is_causal_lm(model: Any) -> bool:
    from perfsdk.models.loader import is_causal_lm

    return is_causal_lm(model)


def _label_index(label: str, label_map: list[str] | None) -> int | None:
    if label_map and label in label_map:
        return label_map.index(label)
    if label.lstrip("-").isdigit():
        return int(label)
    return None


class QualityCollector(Collector):
    """Scores the timed steps against their labels: accuracy, F1, exact match, loss, perplexity."""

    name = "quality"
    title = "Quality"
    Config = QualityConfig
    Result = QualityResult
    default_enabled = False
    description = "accuracy, F1, exact match, loss and perplexity of the timed steps"
    key_columns: ClassVar[tuple[str, ...]] = ("accuracy", "f1_macro")

    # -- presentation --------------------------------------------------------------------

    @classmethod
    def summary_rows(cls, result: Any) -> list[tuple[str, str]]:
        """Terminal rows: each computed metric, with the counts behind it."""
        r = result if isinstance(result, QualityResult) else QualityResult.model_validate(result)
        rows: list[tuple[str, str]] = []
        if r.accuracy is not None:
            rows.append(("accuracy", f"{r.accuracy:.4f} ({r.correct}/{r.scored_requests})"))
        if r.f1_macro is not None:
            rows.append(("F1 macro", f"{r.f1_macro:.4f}"))
        if r.f1_weighted is not None:
            rows.append(("F1 weighted", f"{r.f1_weighted:.4f}"))
        if r.exact_match is not None:
            rows.append(("exact match", f"{r.exact_match:.4f} ({r.exact_matches}/{r.scored_requests})"))
        if r.loss is not None:
            rows.append(("loss (nats/token)", f"{r.loss:.4f}"))
        if r.perplexity is not None:
            rows.append(("perplexity", f"{r.perplexity:.4g}"))
        for reason in r.reasons:
            rows.append(("quality", f"unavailable: {reason}"))
        return rows

    @classmethod
    def report_section(cls, result: Any, run: Any = None) -> Any:
        """A ``ReportSection`` with the metrics and the per-class F1 table."""
        try:
            from perfsdk.collector import ReportSection  # type: ignore[attr-defined]
        except ImportError:
            return None
        return ReportSection(title="Quality", html=report_html(result))

    @classmethod
    def merge_ranks(cls, shares: list[Any]) -> QualityResult | None:
        """Pools every rank's per-request outcomes (``requests`` series) and scores them again;
        without the series, accuracy and exact match are averaged weighted by scored requests."""
        results = [s.result if isinstance(s.result, QualityResult) else QualityResult.model_validate(s.result)
                   for s in shares]
        if not results:
            return None
        rows = [row for s in shares for row in (s.series or {}).get("requests", []) if "reference" in row]
        asked = results[0].metrics
        if rows:
            scored = [r for r in rows if r.get("reference") is not None and r.get("correct") is not None]
            out = _label_scores([r.get("prediction") for r in scored], [r["reference"] for r in scored],
                                results[0].classes or None, asked)
            nll = sum(r.get("nll") or 0.0 for r in rows)
            tokens = sum(int(r.get("loss_tokens") or 0) for r in rows)
            loss = nll / tokens if tokens and ("loss" in asked or "perplexity" in asked) else None
            ems = [r for r in scored if r.get("exact_match") is not None]
            return results[0].model_copy(update={
                **out, "requests": sum(r.requests for r in results), "scored_requests": len(scored),
                "correct": sum(1 for r in scored if r.get("correct")),
                "exact_match": (sum(1 for r in ems if r["exact_match"]) / len(ems)) if ems and "exact_match" in asked else None,
                "exact_matches": sum(1 for r in ems if r["exact_match"]),
                "loss": loss if "loss" in asked else None,
                "perplexity": math.exp(loss) if loss is not None and "perplexity" in asked else None,
                "loss_tokens": tokens})
        total = sum(r.scored_requests for r in results)

        def pooled(field: str) -> float | None:
            vals = [(getattr(r, field), r.scored_requests) for r in results if getattr(r, field) is not None]
            n = sum(w for _, w in vals)
            return sum(v * w for v, w in vals) / n if vals and n else None

        return results[0].model_copy(update={
            "accuracy": pooled("accuracy"), "exact_match": pooled("exact_match"), "f1_macro": None,
            "f1_weighted": None, "scored_requests": total, "correct": sum(r.correct for r in results),
            "requests": sum(r.requests for r in results),
            "reasons": results[0].reasons + ["F1 across ranks needs the requests series"]})

    # -- measurement ---------------------------------------------------------------------

    @hookimpl(trylast=True)
    def perfsdk_finalize(self, session: Any) -> QualityResult:
        # trylast: the other collectors have finished (module hooks removed, series written)
        # before the reference forward runs and before the requests series is extended.
        cfg: QualityConfig = self.config  # type: ignore[assignment]
        asked: list[str] = list(cfg.metrics)
        steps = session.measured_steps
        reasons: list[str] = []
        requests: list[_Request] = []
        for st in steps:
            refs = st.labels or [None] * st.batch_size
            for i in range(st.batch_size):
                requests.append(_Request(st.index, i, refs[i] if i < len(refs) else None, st.kind))
        scored = [r for r in requests if r.reference is not None]
        label_map = self._label_map(session)
        # labels a generated text is searched for: the label map, else every reference of the run
        candidates = label_map or sorted({r.reference for r in scored if r.reference is not None}) or None
        method = None
        by_step: dict[int, list[_Request]] = {}
        for r in requests:
            by_step.setdefault(r.step, []).append(r)
        wants_labels = any(m in asked for m in (*LABEL_METRICS, "exact_match"))
        if not scored and (wants_labels or not steps):
            reasons.append("no labelled requests in the timed steps (label the prompts: a label/answer field, "
                           "workload.dataset.label_column, or s.tokenize(..., labels=...))"
                           if steps else "no timed steps")
        if wants_labels and scored:
            for st in steps:
                method = self._predict(session, st, by_step.get(st.index, []), label_map, candidates, reasons) or method
        update: dict[str, Any] = {}
        predicted = [r for r in scored if r.predicted]
        if predicted and any(m in asked for m in LABEL_METRICS):
            update.update(_label_scores([r.prediction for r in predicted], [r.reference or "" for r in predicted],
                                        label_map, asked))
        exact = [r for r in scored if r.text is not None]
        if "exact_match" in asked and scored:
            if exact:
                update["exact_match"] = metrics_mod.exact_match([r.text or "" for r in exact],
                                                                [r.reference or "" for r in exact])
            else:
                reasons.append("exact_match needs generated text (task generate, and a tokenizer to decode it)")
        loss_source = None
        ref_s = None
        if "loss" in asked or "perplexity" in asked:
            loss_source, ref_s = self._losses(session, steps, by_step, label_map, reasons)
            counted = [r for r in requests if r.tokens > 0]
            tokens = sum(r.tokens for r in counted)
            if tokens:
                loss = metrics_mod.loss_from_nll(sum(r.nll or 0.0 for r in counted), tokens)
                if "loss" in asked:
                    update["loss"] = loss
                if "perplexity" in asked:
                    update["perplexity"] = math.exp(loss) if loss < 700 else math.inf
                update["loss_tokens"] = tokens
        self._add_series(session, requests)
        return QualityResult(
            metrics=asked,
            method=method,
            requests=len(requests),
            scored_requests=len(scored),
            correct=sum(1 for r in scored if r.predicted and r.prediction == r.reference),
            exact_matches=sum(1 for r in exact if metrics_mod.normalize_text(r.text or "") ==
                              metrics_mod.normalize_text(r.reference or "")),
            unmatched_predictions=sum(1 for r in scored if r.kind == "generate" and r.text is not None and r.prediction is None),
            loss_source=loss_source,
            reference_forward_s=ref_s,
            classes=list(candidates or []),
            reasons=list(dict.fromkeys(reasons)),
            **update,
        )

    def _label_map(self, session: Any) -> list[str] | None:
        """Class names by index, when the workload or the model defines them."""
        from perfsdk.models.runner import model_label_map

        wl = session.config.workload
        if wl.label_map:
            return list(wl.label_map)
        info = session.workload_info
        if info is not None and info.label_map:
            return list(info.label_map)
        if session.model is not None:
            names = model_label_map(session.model)
            if names:
                return names
        return None

    def _predict(self, session: Any, step: Step, reqs: list[_Request], label_map: list[str] | None,
                 candidates: list[str] | None, reasons: list[str]) -> str | None:
        """Fill each request's prediction (and generated text); returns the method used."""
        if not reqs or all(r.reference is None for r in reqs):
            return None
        if step.kind == "generate":
            return self._predict_generated(session, step, reqs, candidates, reasons)
        logits = _logits(step.outputs)
        if logits is None or not hasattr(logits, "shape"):
            reasons.append(f"step {step.index}: the forward output has no logits")
            return None
        if len(logits.shape) == 2:
            idx = [int(x) for x in logits.argmax(dim=-1).tolist()]
            for r in reqs:
                k = idx[r.request]
                r.prediction = label_map[k] if label_map and k < len(label_map) else str(k)
                r.predicted = True
            return "argmax"
        if len(logits.shape) == 3 and _is_causal_lm(step.model):
            return self._score_labels(session, step, reqs, logits, candidates, reasons)
        reasons.append(f"step {step.index}: logits of shape {tuple(logits.shape)} are neither [batch, classes] "
                       "nor a causal LM's [batch, tokens, vocab]")
        return None

    def _predict_generated(self, session: Any, step: Step, reqs: list[_Request], label_map: list[str] | None,
                           reasons: list[str]) -> str | None:
        tok = session.tokenizer
        out = step.outputs
        if step.served is not None and isinstance(out, list):  # a served model streamed the text itself
            for r in reqs:
                if r.request < len(out):
                    r.text = str(out[r.request])
                    r.prediction = metrics_mod.extract_label(r.text, label_map) if label_map else None
                    r.predicted = True
            return "label extraction"
        seqs = getattr(out, "sequences", out)
        ids = step.inputs.get("input_ids")
        if tok is None or seqs is None or not hasattr(seqs, "shape") or ids is None:
            reasons.append("generated text cannot be decoded (no tokenizer, or no input_ids)")
            return None
        start = int(ids.shape[1]) if getattr(step.model, "config", None) is None or \
            not getattr(step.model.config, "is_encoder_decoder", False) else 1
        new = seqs[:, start:]
        counts = step.output_tokens or [int(new.shape[1])] * step.batch_size
        for r in reqs:
            if r.request >= new.shape[0]:
                continue
            tokens = [int(x) for x in new[r.request][: counts[r.request]].tolist()]
            r.text = tok.decode(tokens, skip_special_tokens=True)
            r.prediction = metrics_mod.extract_label(r.text, label_map) if label_map else None
            r.predicted = True
        return "label extraction"

    def _score_labels(self, session: Any, step: Step, reqs: list[_Request], logits: Any,
                      label_map: list[str] | None, reasons: list[str]) -> str | None:
        tok = session.tokenizer
        if tok is None or not label_map:
            reasons.append("label scoring needs a tokenizer and a label map")
            return None
        first: dict[str, int] = {}
        for label in label_map:
            ids = tok(" " + label, add_special_tokens=False)["input_ids"]
            if not ids:
                continue
            first[label] = int(ids[0])
        clash = len(set(first.values())) < len(first)
        if clash:
            reasons.append("label scoring: two labels share their first token; name them apart in workload.label_map")
            return None
        last = _last_positions(step, int(logits.shape[0]), int(logits.shape[1]))
        names = list(first)
        token_ids = [first[n] for n in names]
        for r in reqs:
            row = logits[r.request, last[r.request], token_ids]
            r.prediction = names[int(row.argmax())]
            r.predicted = True
        return "label scoring"

    # -- loss and perplexity -------------------------------------------------------------

    def _losses(self, session: Any, steps: list[Step], by_step: dict[int, list[_Request]],
                label_map: list[str] | None, reasons: list[str]) -> tuple[str | None, float | None]:
        """Fill ``nll``/``tokens`` of every request it can; returns (source, extra forward seconds)."""
        pending: list[_Request] = []
        sources: set[str] = set()
        for st in steps:
            reqs = by_step.get(st.index, [])
            logits = _logits(st.outputs) if st.kind == "forward" else None
            if st.kind == "forward" and logits is not None and len(logits.shape) == 2:
                for r in reqs:
                    k = _label_index(r.reference, label_map) if r.reference is not None else None
                    if k is None or k >= logits.shape[1]:
                        continue
                    r.nll = metrics_mod.class_nll(logits[r.request:r.request + 1], [k])[0]
                    r.tokens = 1
                    sources.add("timed logits")
                continue
            for r in reqs:
                r.prompt_ids = _real_ids(st, r.request)
                if r.prompt_ids is None:
                    continue
                if st.kind == "forward" and logits is not None and r.reference is None and len(logits.shape) == 3:
                    row = logits[r.request:r.request + 1]
                    targets = st.inputs["input_ids"][r.request:r.request + 1]
                    mask = st.inputs.get("attention_mask")
                    if mask is not None:
                        m = mask[r.request:r.request + 1]
                        targets = targets.masked_fill(m == 0, -100)
                        real = m[0].nonzero()
                        if len(real):  # the first real token follows padding: nothing predicts it
                            targets = targets.clone()
                            targets[0, int(real[0])] = -100
                    sums, counts = metrics_mod.token_nll(row, targets)
                    r.nll, r.tokens = sums[0], counts[0]
                    sources.add("timed logits")
                else:
                    pending.append(r)
        seconds = None
        if pending:
            model = session.model
            if model is None or session.tokenizer is None or not _is_causal_lm(model) or \
                    getattr(getattr(model, "config", None), "is_encoder_decoder", False):
                reasons.append("loss of a reference needs a decoder-only causal LM and its tokenizer")
            else:
                seconds = self._reference_forward(session, pending)
                sources.add("reference forward after the timed steps")
        if not sources and not reasons:
            reasons.append("no request could be scored for loss")
        return ("; ".join(sorted(sources)) or None), seconds

    def _reference_forward(self, session: Any, pending: list[_Request]) -> float:
        """Score prompt + reference for every distinct pair, outside every measured window.

        Runs at finalize, after the session window closed and the sampler stopped, so no timed
        step, window or sample contains it; its duration is returned for the result."""
        import torch

        cfg: QualityConfig = self.config  # type: ignore[assignment]
        tok, model = session.tokenizer, session.model
        device = next(model.parameters()).device
        pad = tok.pad_token_id if getattr(tok, "pad_token_id", None) is not None else 0
        cache: dict[tuple[tuple[int, ...], str | None], tuple[float, int]] = {}
        todo: list[tuple[tuple[int, ...], str | None]] = []
        for r in pending:
            key = (tuple(r.prompt_ids or ()), r.reference)
            if key not in cache and key not in todo:
                todo.append(key)
        t0 = time.perf_counter()
        prev_phase = session.phase
        session.phase = "quality"
        try:
            for b in range(0, len(todo), cfg.reference_batch_size):
                chunk = todo[b:b + cfg.reference_batch_size]
                seqs, targets = [], []
                for prompt_ids, ref in chunk:
                    if ref is None:
                        seqs.append(list(prompt_ids))
                        targets.append(list(prompt_ids))
                        continue
                    ref_ids = [int(x) for x in tok(" " + ref, add_special_tokens=False)["input_ids"]]
                    seqs.append(list(prompt_ids) + ref_ids)
                    targets.append([-100] * len(prompt_ids) + ref_ids)
                n = max(len(s) for s in seqs)
                ids = torch.tensor([s + [pad] * (n - len(s)) for s in seqs], device=device)
                mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs], device=device)
                tgt = torch.tensor([t + [-100] * (n - len(t)) for t in targets], device=device)
                with torch.inference_mode():
                    logits = _logits(model(input_ids=ids, attention_mask=mask))
                sums, counts = metrics_mod.token_nll(logits, tgt)
                for key, s, c in zip(chunk, sums, counts):
                    cache[key] = (s, c)
        finally:
            session.phase = prev_phase
        seconds = time.perf_counter() - t0
        for r in pending:
            r.nll, r.tokens = cache[(tuple(r.prompt_ids or ()), r.reference)]
        return seconds

    # -- series ----------------------------------------------------------------------------

    def _add_series(self, session: Any, requests: list[_Request]) -> None:
        """Per-request outcomes into the ``requests`` series, merged into existing rows."""
        if not requests:
            return
        rows = [dict(r) for r in session.series.get("requests", [])]
        index = {(row.get("step"), row.get("request")): row for row in rows}
        for r in requests:
            fields: dict[str, Any] = {
                "reference": r.reference,
                "prediction": r.prediction,
                "correct": (r.prediction == r.reference) if r.reference is not None and r.predicted else None,
                "exact_match": (metrics_mod.normalize_text(r.text) == metrics_mod.normalize_text(r.reference))
                if r.text is not None and r.reference is not None else None,
                "nll": r.nll,
                "loss_tokens": r.tokens or None,
            }
            row = index.get((r.step, r.request))
            if row is None:
                row = {"step": r.step, "request": r.request}
                rows.append(row)
                index[(r.step, r.request)] = row
            row.update(fields)
        session.add_series("requests", rows)


def _label_scores(preds: list[str | None], refs: list[str], classes: list[str] | None,
                  asked: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not refs:
        return out
    if "accuracy" in asked:
        out["accuracy"] = metrics_mod.accuracy(preds, refs)
    per_class = metrics_mod.f1_per_class(preds, refs, classes)
    if "f1_macro" in asked:
        out["f1_macro"] = metrics_mod.f1_macro(preds, refs, classes)
    if "f1_weighted" in asked:
        out["f1_weighted"] = metrics_mod.f1_weighted(preds, refs, classes)
    if "f1_macro" in asked or "f1_weighted" in asked:
        out["f1_per_class"] = {str(k): f for k, (f, _) in per_class.items()}
    return out


def report_html(result: Any) -> str:
    """The quality section of a run report: metric table and per-class F1."""
    r = result if isinstance(result, QualityResult) else QualityResult.model_validate(result)
    cell = html.escape
    rows = "".join(f"<tr><td>{cell(label)}</td><td>{cell(value)}</td></tr>" for label, value in
                   QualityCollector.summary_rows(r))
    rows += f"<tr><td>method</td><td>{cell(r.method or '-')}</td></tr>"
    rows += f"<tr><td>scored / timed requests</td><td>{r.scored_requests} / {r.requests}</td></tr>"
    if r.loss_source:
        rows += f"<tr><td>loss from</td><td>{cell(r.loss_source)}</td></tr>"
    parts = [f'<table class="kv"><thead><tr><th>metric</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>']
    if r.f1_per_class:
        body = "".join(f"<tr><td>{cell(k)}</td><td>{v:.4f}</td></tr>" for k, v in r.f1_per_class.items())
        parts.append(f'<table class="kv"><thead><tr><th>class</th><th>F1</th></tr></thead><tbody>{body}</tbody></table>')
    return "\n".join(parts)


@hookimpl
def perfsdk_register_collectors(register: Any) -> None:
    register(QualityCollector)

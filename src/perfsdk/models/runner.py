"""The workload runner: turn ``config.workload`` into calls on the public session API.

:func:`run_workload` is what ``perfsdk run`` executes inside a session:

1. ``s.load()`` the configured model (unless the session already holds one);
2. load the prompts (and their labels, if any), count each one's tokens, drop those longer
   than ``max_input_tokens`` (counted in the result, logged as a warning and shown in the
   summary), optionally sort by length;
3. group them into batches: a fixed ``batch_size``, or adaptively under ``max_batch_tokens``
   (``batch_size x (longest input + max_new_tokens) <= budget``);
4. tokenize every batch once with ``s.tokenize`` (with the batch's labels, so that the
   ``quality`` collector can score the timed steps themselves; for a vision-language model with
   its images through the processor: :mod:`perfsdk.models.images`);
5. run ``warmup_runs`` batches inside ``s.warmup()`` — every batch at least once when
   ``warmup_every_batch`` holds (by default on CUDA, where a batch's first run chooses and
   caches its kernels and can take several times its later runs);
6. seed torch, then run timed passes over all batches until both ``min_iterations`` passes and
   ``min_duration_s`` are reached, waiting between batch submissions as the arrival pattern says.

The workload counters (warm-up runs, timed runs, full passes) are recorded even when the run
stops early (an exception, Ctrl-C): they say how far it got.

The pure pieces (:func:`make_batches`, :func:`arrival_delays`, :func:`generate_kwargs`,
:func:`plan_workload`) are separate so they can be tested and reused without a model.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from perfsdk.config import ArrivalConfig, Config, ConfigError, GenerateConfig, WorkloadConfig
from perfsdk.models.prompts import Example
from perfsdk.schemas import WorkloadInfo

log = structlog.get_logger("perfsdk.models.runner")

ProgressFn = Callable[[int, int], None]
SleepFn = Callable[[float], None]


def count_tokens(tokenizer: Any, prompts: list[str]) -> list[int]:
    """Real token count of each prompt (special tokens included, no padding).

    For a multimodal processor its tokenizer counts the text; image tokens come on top.
    """
    if not prompts:
        return []
    from perfsdk.models.encode import is_processor

    if is_processor(tokenizer):
        tokenizer = tokenizer.tokenizer
    enc = tokenizer(list(prompts), padding=False, truncation=False)
    return [len(ids) for ids in enc["input_ids"]]


def filter_by_length(lengths: list[int], max_input_tokens: int) -> tuple[list[int], int]:
    """Indices of prompts within ``max_input_tokens``, and how many were dropped."""
    keep = [i for i, n in enumerate(lengths) if n <= max_input_tokens]
    return keep, len(lengths) - len(keep)


def order_by_length(indices: list[int], lengths: list[int]) -> list[int]:
    """``indices`` sorted by ascending token count; ties keep their original order."""
    return sorted(indices, key=lambda i: lengths[i])


def make_batches(
    lengths: list[int],
    *,
    batch_size: int | None,
    max_batch_tokens: int | None = None,
    max_new_tokens: int = 0,
) -> list[list[int]]:
    """Group positions ``0..len(lengths)-1`` (in the given order) into batches.

    Fixed: consecutive chunks of ``batch_size``. Adaptive (``max_batch_tokens`` set): prompts
    are added to the current batch while ``size x (longest input + max_new_tokens)`` stays
    within the budget (and, when both are set, the size within ``batch_size``); a prompt that
    is over budget on its own forms a batch by itself.
    """
    n = len(lengths)
    if max_batch_tokens is None:
        if batch_size is None or batch_size < 1:
            raise ValueError("batch_size must be at least 1 when max_batch_tokens is not set")
        return [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, length in enumerate(lengths):
        new_longest = max(longest, length)
        cost = (len(current) + 1) * (new_longest + max_new_tokens)
        fits = cost <= max_batch_tokens and (batch_size is None or len(current) < batch_size)
        if current and not fits:
            batches.append(current)
            current, new_longest = [], length
        current.append(i)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


def arrival_delays(arrival: ArrivalConfig, seed: int) -> Iterator[float]:
    """Seconds to wait before each batch submission; the first is always 0.

    ``none``: 0. ``constant``: ``delay_s``. ``poisson``: exponential gaps with mean
    ``1 / rate_per_s`` from ``random.Random(seed)``. ``burst``: ``burst_size`` batches back to
    back, then ``burst_interval_s`` before the next burst.
    """
    rng = random.Random(seed)
    yield 0.0
    for i in itertools.count(1):
        if arrival.pattern == "constant":
            yield float(arrival.delay_s)
        elif arrival.pattern == "poisson":
            assert arrival.rate_per_s is not None
            yield rng.expovariate(arrival.rate_per_s)
        elif arrival.pattern == "burst":
            yield float(arrival.burst_interval_s) if i % arrival.burst_size == 0 else 0.0
        else:
            yield 0.0


def in_process_arrival(workload: WorkloadConfig) -> ArrivalConfig:
    """The pacing of batches of an in-process run: ``workload.arrival``, or ``workload.load``
    (``mode: rate`` with ``constant`` or ``poisson`` arrivals; a closed loop of one user is the
    default back-to-back pacing). Raises :class:`ConfigError` for a load only a served model takes."""
    load = workload.load
    if load is None:
        return workload.arrival
    if load.mode == "concurrency":
        if load.concurrency > 1:
            raise ConfigError(f"workload.load.concurrency: {load.concurrency} concurrent users need a served model "
                              f"(model.endpoint); an in-process run sends one batch at a time")
        return ArrivalConfig()
    if load.mode == "rate":
        assert load.rate_per_s is not None
        if load.arrival == "constant":
            return ArrivalConfig(pattern="constant", delay_s=1.0 / load.rate_per_s)
        if load.arrival == "poisson":
            return ArrivalConfig(pattern="poisson", rate_per_s=load.rate_per_s)
        raise ConfigError("workload.load.arrival: gamma arrivals need a served model (model.endpoint); in-process "
                          "runs take constant or poisson")
    raise ConfigError(f"workload.load.mode: {load.mode} needs a served model (model.endpoint)")


def generate_kwargs(gen: GenerateConfig) -> dict[str, Any]:
    """``model.generate`` keyword arguments from ``workload.generate`` (greedy or sampling)."""
    kw: dict[str, Any] = {"max_new_tokens": gen.max_new_tokens, "do_sample": gen.do_sample}
    if gen.min_new_tokens is not None:
        kw["min_new_tokens"] = gen.min_new_tokens
    if gen.do_sample:
        kw["temperature"] = gen.temperature
        if gen.top_k is not None:
            kw["top_k"] = gen.top_k
        if gen.top_p is not None:
            kw["top_p"] = gen.top_p
    return kw


@dataclass
class WorkloadPlan:
    """Prompts after filtering and ordering, grouped into batches."""

    prompts: list[str]
    lengths: list[int]
    batches: list[list[str]]
    batch_lengths: list[list[int]]
    filtered: int
    extra: dict[str, Any] = field(default_factory=dict)
    labels: list[str | None] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    batch_labels: list[list[str | None]] = field(default_factory=list)
    label_map: list[str] | None = None

    @property
    def labelled(self) -> bool:
        """Whether any kept prompt has a label."""
        return any(label is not None for label in self.labels)


def plan_workload(workload: WorkloadConfig, tokenizer: Any, prompts: list[str] | list[Example] | None = None,
                  label_map: list[str] | None = None) -> WorkloadPlan:
    """Load (or take) the prompts, filter by length, sort and batch them as ``workload`` says.

    ``prompts`` may be strings or :class:`~perfsdk.models.prompts.Example` items (with labels);
    by default they are read as ``workload`` says (:func:`~perfsdk.models.prompts.load_workload_examples`).
    """
    from perfsdk.distributed import current_shard
    from perfsdk.models.prompts import load_workload_examples

    if prompts is None:
        loaded, label_map = load_workload_examples(workload)
        # data-parallel under torchrun/Accelerate: this rank's strided share (all prompts when single)
        examples: list[Example] = current_shard(loaded)
    else:
        examples = [p if isinstance(p, Example) else Example(p) for p in prompts]
    prompts = [e.prompt for e in examples]
    labels = [e.label for e in examples]
    lengths = count_tokens(tokenizer, prompts)
    keep, filtered = filter_by_length(lengths, workload.max_input_tokens)
    if not keep:
        raise ConfigError(
            f"workload.max_input_tokens: all {len(prompts)} prompts are longer than {workload.max_input_tokens} tokens"
        )
    if workload.sort_by_length:
        keep = order_by_length(keep, lengths)
    kept_lengths = [lengths[i] for i in keep]
    new_tokens = workload.generate.max_new_tokens if workload.task == "generate" else 0
    groups = make_batches(
        kept_lengths,
        batch_size=workload.batching.batch_size,
        max_batch_tokens=workload.batching.max_batch_tokens,
        max_new_tokens=new_tokens,
    )
    kept = [prompts[i] for i in keep]
    kept_labels = [labels[i] for i in keep]
    return WorkloadPlan(
        sources=[examples[i].where for i in keep],
        prompts=kept,
        lengths=kept_lengths,
        batches=[[kept[j] for j in g] for g in groups],
        batch_lengths=[[kept_lengths[j] for j in g] for g in groups],
        filtered=filtered,
        labels=kept_labels,
        batch_labels=[[kept_labels[j] for j in g] for g in groups],
        label_map=label_map,
        extra={"indices": keep, "groups": groups},
    )


def check_workload(config: Config) -> None:
    """Validate what a run would use before any session starts (nothing is loaded or built).

    Checks the model settings (:func:`~perfsdk.models.loader.check_model_config`) and reads the
    prompts or dataset (present, every line valid, labels within ``workload.label_map``).
    Raises :class:`~perfsdk.config.ConfigError`.
    """
    from perfsdk.backends import backend_for
    from perfsdk.models.images import check_images
    from perfsdk.models.prompts import load_workload_examples

    backend_for(config).check()
    load_workload_examples(config.workload)
    if config.model.endpoint is None:
        check_images(config.workload)


def model_label_map(model: Any) -> list[str] | None:
    """Class names by index from a sequence classifier's ``config.id2label``; ``None`` for other
    models and for the placeholder names ``LABEL_0``, ``LABEL_1``, ... that ``transformers``
    gives a classifier nobody named."""
    config = getattr(model, "config", None)
    archs = list(getattr(config, "architectures", None) or []) + [type(model).__name__]
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        return None
    id2label = getattr(config, "id2label", None) or {}
    try:
        names = [str(id2label[i]) for i in range(len(id2label))]
    except KeyError:
        return None
    if not names or names == [f"LABEL_{i}" for i in range(len(names))]:
        return None
    return names


def _resolve_label_map(workload: WorkloadConfig, plan: WorkloadPlan, model: Any) -> WorkloadPlan:
    """A classifier's own class names become the label map when the workload names none; the
    labels must then be among them (else the error names the prompt and the model)."""
    from perfsdk.models.prompts import apply_label_map

    if plan.label_map is not None or not plan.labelled or workload.task != "forward":
        return plan
    names = model_label_map(model)
    if names is None:
        return plan
    field_name = "workload.dataset" if workload.dataset is not None else "workload.prompts"
    examples = apply_label_map([Example(p, label, where) for p, label, where in zip(plan.prompts, plan.labels, plan.sources)],
                               names, field_name, "the model's config.id2label (set workload.label_map to map them)")
    labels = [e.label for e in examples]
    sizes = [len(b) for b in plan.batches]
    batch_labels, start = [], 0
    for n in sizes:
        batch_labels.append(labels[start:start + n])
        start += n
    plan.labels, plan.batch_labels, plan.label_map = labels, batch_labels, names
    return plan


def warmup_count(workload: WorkloadConfig, n_batches: int, device: Any) -> int:
    """Warm-up runs: ``warmup_runs``, raised to one run of every batch when ``warmup_every_batch``
    holds (``None``: when ``device`` is a CUDA device)."""
    every = workload.warmup_every_batch
    if every is None:  # auto: on CUDA, unless warm-up is switched off
        kind = getattr(device, "type", None) or (str(device) if device is not None else "")
        every = kind.startswith("cuda") and workload.warmup_runs > 0
    return max(workload.warmup_runs, n_batches) if every else workload.warmup_runs


def _workload_info(workload: WorkloadConfig, plan: WorkloadPlan, warmup: int, timed: int, iterations: int,
                   images: Any = None, vision_tokens: list[int] | None = None) -> WorkloadInfo:
    vision: dict[str, Any] = {}
    if images is not None:
        vision = {"images_source": images.source, "image_size": workload.image_size,
                  "num_crops": workload.num_crops, "image_views_mean": images.views_mean}
    if vision_tokens:
        vision["vision_tokens_mean"] = sum(vision_tokens) / len(vision_tokens)
        vision["vision_tokens_max"] = max(vision_tokens)
    return WorkloadInfo(
        **vision,
        prompts_source=workload.prompts,
        num_prompts=len(plan.prompts),
        prompts_filtered=plan.filtered,
        batch_size=workload.batching.batch_size,
        max_batch_tokens=workload.batching.max_batch_tokens,
        num_batches=len(plan.batches),
        max_new_tokens=workload.generate.max_new_tokens if workload.task == "generate" else None,
        warmup_runs=warmup,
        timed_runs=timed,
        iterations=iterations,
        max_input_tokens=workload.max_input_tokens,
        input_tokens_mean=sum(plan.lengths) / len(plan.lengths),
        input_tokens_max=max(plan.lengths),
        arrival_pattern=in_process_arrival(workload).pattern,
        labelled_prompts=sum(1 for label in plan.labels if label is not None),
        label_map=plan.label_map,
    )


def run_workload(session: Any, progress: ProgressFn | None = None, **kwargs: Any) -> WorkloadInfo | None:
    """Run ``session.config.workload`` through the session's backend (in this process, or
    against a served model); return its ``WorkloadInfo``."""
    backend = session.backend
    if backend.in_process:
        return run_in_process(session, progress, **kwargs)
    backend.run_workload(session, progress=progress)
    return session.workload_info


def run_in_process(
    session: Any,
    progress: ProgressFn | None = None,
    *,
    sleep: SleepFn = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> WorkloadInfo:
    """Run ``session.config.workload`` in this process; return (and set) its ``WorkloadInfo``.

    ``progress(done_batches, total_batches_estimate)`` is called after every batch, warm-up
    included. ``sleep`` and ``clock`` are injectable for tests; waiting always sleeps, never spins.
    """
    import torch

    from perfsdk.models.loader import is_causal_lm

    workload: WorkloadConfig = session.config.workload
    if getattr(session, "model", None) is not None:
        model, tokenizer = session.model, session.tokenizer
    else:
        model, tokenizer = session.load()
    if tokenizer is None:
        from perfsdk.models.loader import tokenizer_missing

        why = tokenizer_missing(str(Path(session.config.model.id).expanduser()))
        raise ConfigError(f"model.id: {why or f'{session.config.model.id} has no tokenizer'}; the workload runner "
                          f"needs one: save the model's tokenizer into the folder (tokenizer.save_pretrained)")
    if workload.task == "generate" and not is_causal_lm(model):
        raise ConfigError(f"workload.task: generate needs a model that can generate text; {type(model).__name__} "
                          "cannot (use task: forward)")

    plan = _resolve_label_map(workload, plan_workload(workload, tokenizer), model)
    if plan.filtered:
        log.warning("prompts left out: longer than workload.max_input_tokens", left_out=plan.filtered,
                    prompts=plan.filtered + len(plan.prompts), max_input_tokens=workload.max_input_tokens)
    from perfsdk.models.images import workload_images

    images = workload_images(workload, model, tokenizer, plan, session.config.model.id)
    session.set_workload_info(_workload_info(workload, plan, 0, 0, 0, images))
    if images is None:
        encodings = [session.tokenize(tokenizer, batch, labels=labels if plan.labelled else None)
                     for batch, labels in zip(plan.batches, plan.batch_labels)]
    else:
        encodings = [session.tokenize(tokenizer, texts, images=views or None, labels=labels if plan.labelled else None)
                     for texts, views, labels in zip(images.texts, images.views, plan.batch_labels)]
    gen_kw = generate_kwargs(workload.generate)

    def run_batch(index: int) -> None:
        enc = encodings[index]
        if workload.task == "forward":
            session.forward(model, **enc)
        else:
            session.generate(model, **enc, **gen_kw)

    n_batches = len(plan.batches)
    n_warmup = warmup_count(workload, n_batches, session.device)
    total = n_warmup + workload.min_iterations * n_batches
    done = 0

    def tick() -> None:
        if progress is not None:
            progress(done, max(total, done))

    warm = timed = iterations = 0
    try:
        with session.warmup():
            for k in range(n_warmup):
                run_batch(k % n_batches)
                warm += 1
                done += 1
                tick()

        torch.manual_seed(workload.seed)
        delays = arrival_delays(in_process_arrival(workload), workload.seed)
        start = clock()
        while iterations < workload.min_iterations or clock() - start < workload.min_duration_s:
            for b in range(n_batches):
                delay = next(delays)
                if delay > 0:
                    sleep(delay)
                run_batch(b)
                timed += 1
                done += 1
                tick()
            iterations += 1
            total = max(total, done + n_batches) if clock() - start < workload.min_duration_s else total
    finally:
        # also when interrupted: the result says how far the workload got
        vision = [n for st in session.measured_steps for n in (st.vision_tokens or [])]
        info = _workload_info(workload, plan, warm, timed, iterations, images, vision)
        session.set_workload_info(info)
    return info

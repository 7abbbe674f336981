"""Event objects handed to lifecycle hooks.

They are plain dataclasses (not pydantic) because they carry live objects — models, tensors —
and are created on the measured path, where construction cost matters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

StepKind = Literal["generate", "forward"]
WindowKind = Literal["session", "step", "encode", "prefill", "decode", "stage", "load", "tokenize"]


@dataclass
class LoadEvent:
    """A model (and tokenizer) was loaded or adopted by ``s.load()``."""

    model: Any
    tokenizer: Any
    load_s: float
    source: Literal["config", "adopted", "served"]
    model_id: str | None = None
    import_s: float = 0.0


@dataclass
class TokenizeEvent:
    """Prompts were tokenized by ``s.tokenize()``.

    ``labels`` holds each prompt's reference (a class name or an expected answer; ``None`` for
    an unlabelled prompt) when ``s.tokenize(..., labels=...)`` was given them, else ``None``.
    """

    encodings: Any
    token_counts: list[int]
    tokenize_s: float
    labels: list[str | None] | None = None


@dataclass
class ServedRequest:
    """What a request to a served model adds to its :class:`Step` (the step is one request).

    ``scheduled_ns`` is when the load meant to send it (the step's ``start_ns`` is when it was
    sent): latency from the scheduled time includes the client's own queueing. ``chunks`` counts
    the stream's events that carried tokens, ``multi_token_chunks`` those that carried several
    (their tokens are spread over the gap before them). ``token_source`` says where the output
    token count came from: ``usage`` (the server's), ``tokenizer`` (the model's tokenizer over
    the streamed text) or ``chunks`` (one token per chunk). ``error`` is the first error text of
    a failed request (the step's ``error`` holds the exception).
    """

    scheduled_ns: int
    backend: str = "openai"
    chunks: int = 0
    multi_token_chunks: int = 0
    token_source: str | None = None
    usage_mismatch: bool = False
    error: str | None = None
    in_flight: int = 0  # requests in flight when this one was sent (itself included)


#: The window over the measured requests of a served run (they overlap: no per-step windows).
SERVED_WINDOW = "stage:requests"


@dataclass
class ClientStats:
    """How the load-generating client of a served run kept up: each send's lag behind its
    schedule, the event loop's delay (sampled every 5 ms), the requests in flight at most, and
    the client's CPU time over the measured requests."""

    send_lag_ns: list[int] = field(default_factory=list)
    loop_lag_ns: list[int] = field(default_factory=list)
    max_in_flight: int = 0
    sent: int = 0
    warmup: int = 0
    cpu_s: float | None = None  # this process's CPU time over the measured requests
    clock_uncertainty_ns: int | None = None  # client processes on a Ray cluster: clock alignment error


@dataclass
class Step:
    """One ``s.generate()`` or ``s.forward()`` call.

    ``token_times_ns[k]`` is when the k-th generated position (for the whole batch) was ready on
    the host, on the session clock. ``output_tokens[i]`` counts request ``i``'s real tokens: it
    stops at (and includes) the EOS token, padding is never counted. ``labels[i]`` is request
    ``i``'s reference when its inputs were labelled (``s.tokenize(..., labels=...)`` or
    ``s.label(inputs, labels)``), else ``labels`` is ``None``.

    For models that encode their inputs first (an encoder-decoder's encoder, a multimodal
    model's vision or audio tower and projector), ``encode_end_ns`` is when that ``encode``
    phase ended and ``prefill`` began; ``vision_tokens[i]`` is the real number of vision (or
    audio) tokens request ``i`` got, read from the features the tower produced.

    ``served`` is set when the step is one request to a served model
    (:class:`ServedRequest`); such steps may overlap in time.

    ``instrumented_by`` names the collectors that add instrumentation to this step (FLOPs
    counting, forward hooks, a profiler): such a step is not a measured step, and latency,
    throughput, energy and utilization figures leave it out. ``replay_of`` is the index of the
    timed step it repeats (same inputs and settings) when the session ran it as an instrumented
    copy.
    """

    kind: StepKind
    index: int
    batch_size: int
    input_tokens: list[int]
    model: Any = None
    inputs: dict[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()  # positional inputs of an ``s.forward`` call
    warmup: bool = False
    start_ns: int = 0
    end_ns: int | None = None
    token_times_ns: list[int] = field(default_factory=list)
    output_tokens: list[int] | None = None
    outputs: Any = None
    error: BaseException | None = None
    gen_kwargs: dict[str, Any] = field(default_factory=dict)
    labels: list[str | None] | None = None
    encode_end_ns: int | None = None
    vision_tokens: list[int] | None = None
    instrumented_by: list[str] = field(default_factory=list)
    replay_of: int | None = None
    served: ServedRequest | None = None

    @property
    def instrumented(self) -> bool:
        """Whether some collector instrumented this step (it is then left out of the statistics)."""
        return bool(self.instrumented_by)

    @property
    def first_token_ns(self) -> int | None:
        return self.token_times_ns[0] if self.token_times_ns else None

    @property
    def duration_s(self) -> float | None:
        if self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def encode_s(self) -> float | None:
        """Length of the ``encode`` phase (``None`` when the step had none)."""
        if self.encode_end_ns is None:
            return None
        return (self.encode_end_ns - self.start_ns) / 1e9

    def request_last_token_ns(self, i: int) -> int | None:
        """When request ``i``'s last real token was ready."""
        if not self.output_tokens or not self.token_times_ns:
            return None
        n = self.output_tokens[i]
        return self.token_times_ns[n - 1] if n > 0 else None


@dataclass
class Window:
    """A measurement window: counters are read at its edges.

    ``name`` is ``session``, ``step:N``, ``encode``, ``prefill``, ``decode`` or ``stage:<name>``;
    ``kind`` is the part before the colon; ``step_index`` is set for step, encode, prefill and
    decode windows.
    ``instrumented`` is set on the windows of an instrumented step (see :class:`Step`).
    """

    name: str
    kind: WindowKind
    start_ns: int
    end_ns: int | None = None
    step_index: int | None = None
    warmup: bool = False
    parent: Window | None = None
    instrumented: bool = False

    @property
    def duration_s(self) -> float | None:
        if self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9

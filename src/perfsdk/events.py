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
    source: Literal["config", "adopted"]
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

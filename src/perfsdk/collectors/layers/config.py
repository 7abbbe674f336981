"""Settings of the ``layers`` collector."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfsdk.collector import CollectorConfig


class StepSelection(BaseModel):
    """Which measured (non-warm-up) steps to instrument: the first N, or every Nth.

    Steps are counted from 0 in the order they start, warm-up steps excluded. ``every: N``
    selects steps 0, N, 2N, ... so the first measured step is always included. A plain integer
    in a config (``steps: 3``) means ``first: 3``.
    """

    model_config = ConfigDict(extra="forbid")

    first: int | None = Field(default=None, ge=1)
    every: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return {"first": data}
        return data

    @model_validator(mode="after")
    def _one_of(self) -> StepSelection:
        if self.first is not None and self.every is not None:
            raise ValueError("set either first or every, not both")
        if self.first is None and self.every is None:
            object.__setattr__(self, "first", 1)
        return self

    def selects(self, ordinal: int) -> bool:
        """Whether the measured step with this 0-based ordinal is instrumented."""
        if self.every is not None:
            return ordinal % self.every == 0
        return ordinal < (self.first or 0)

    def describe(self) -> str:
        return f"every {self.every}" if self.every is not None else f"first {self.first}"


class InstrumentsSelectedSteps:
    """Collector mix-in: instrument the measured steps that ``self.config.steps`` (a
    :class:`StepSelection`) selects, counting timed steps in the order they run."""

    instruments_steps = True
    config: Any
    _selected_ordinal = 0

    def wants_to_instrument(self, session: Any, step: Any) -> bool:
        """The selected measured steps (``steps``: first N or every Nth)."""
        ordinal = self._selected_ordinal
        self._selected_ordinal = ordinal + 1
        return bool(self.config.steps.selects(ordinal))


class LayersConfig(CollectorConfig):
    """Settings of the ``layers`` collector."""

    max_depth: int | None = Field(
        default=None, ge=0,
        description="Time modules down to this depth (the top module is 0, ``model.layers.0`` is 3); "
        "none: all modules. The coverage modules are always timed.",
    )
    module_types: list[str] | None = Field(
        default=None,
        description="Time only modules of these class names (e.g. LlamaDecoderLayer, Linear); "
        "none: all. The top module and the coverage modules are always timed.",
    )
    steps: StepSelection = Field(default_factory=StepSelection,
                                 description="Measured steps to instrument: {first: N} or {every: N}.")
    log_events: bool = Field(default=False,
                             description="Store every module call, time-ordered, as the series layers_events.")
    per_function: bool = Field(
        default=False,
        description="Also count and time matmul, attention, softmax, activation and normalization operations "
        "per module (through perfsdk.capture, on the instrumented steps).",
    )
    top_n: int | None = Field(default=None, ge=1,
                              description="Keep only the N slowest modules per phase in the result; none: all.")

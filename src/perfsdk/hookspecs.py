"""Every hook perfsdk calls, in one place.

Call order
----------
Discovery (once per plugin manager, i.e. once per session and once per CLI invocation)::

    perfsdk_register_collectors(register)
    perfsdk_register_exporters(register)
    perfsdk_register_backends(register)
    perfsdk_register_hardware(register)
    perfsdk_register_commands(cli)            # CLI only

Session plugins (per session, on plugin modules such as ``perfsdk.distributed``)::

    perfsdk_session_configure(session)        # at set-up, before anything is measured
    perfsdk_session_result(session, result)   # at the end, once every collector's result is in,
                                              # before the run is stored

Lifecycle (per session; implemented as methods of collector instances that the session
registers for its own lifetime)::

    perfsdk_session_start(session)
    perfsdk_window_open(session, window)      # window "session"
    perfsdk_load(session, event)              # s.load()
    perfsdk_tokenize(session, event)          # s.tokenize()
    for each s.generate() / s.forward():
        (Collector.wants_to_instrument(session, step), instrumenting collectors, timed steps only)
        perfsdk_before_generate(session, step)
        perfsdk_window_open(session, window)  # "step:N", then "encode" or "prefill" (generate only)
        perfsdk_window_close / open           # "encode" closes and "prefill" opens when the encoder
                                              # (vision/audio tower + projector) has finished
        perfsdk_window_close / open           # "prefill" closes and "decode" opens at the first token
        perfsdk_window_close(session, window) # "decode" (generate), then "step:N"
        perfsdk_after_generate(session, step)
    perfsdk_window_open / close               # "stage:<name>" around each s.stage() block
    perfsdk_window_close(session, window)     # window "session"
    for each instrumented copy booked by wants_to_instrument (step.instrumented_by set):
        perfsdk_before_generate / window hooks / perfsdk_after_generate, as above
    perfsdk_finalize(session) -> Result | None

Lifecycle hooks are dispatched one implementation at a time: an exception in one collector is
caught, logged, recorded in the run's ``errors`` with the collector and hook name, and the run
becomes ``partial``; the other collectors still run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    import click
    from pydantic import BaseModel

    from perfsdk.events import LoadEvent, Step, TokenizeEvent, Window
    from perfsdk.schemas import RunResult
    from perfsdk.session import Session

hookspec = pluggy.HookspecMarker("perfsdk")


# -- discovery ----------------------------------------------------------------------------


@hookspec
def perfsdk_register_collectors(register: Callable[[type], None]) -> None:
    """Called at plugin-manager set-up. Call ``register(CollectorClass)`` for each collector."""


@hookspec
def perfsdk_register_exporters(register: Callable[[type], None]) -> None:
    """Called at plugin-manager set-up. Call ``register(ExporterClass)`` for each exporter: a
    stream exporter implements ``export(runs, stream)``, a destination exporter (``destination =
    True``: a tracking server, a database) ``export_to(runs, destination, store)``."""


@hookspec
def perfsdk_register_backends(register: Callable[[type], None]) -> None:
    """Called at plugin-manager set-up. Call ``register(BackendClass)`` for each backend: a
    :class:`perfsdk.Backend` subclass that runs a config's workload (in this process, or against
    a server) and turns each request into steps on the session's clock."""


@hookspec
def perfsdk_register_hardware(register: Callable[[Any], None]) -> None:
    """Called when hardware profiles are listed. Call ``register(profile)`` with a profile
    (a ``HardwareProfile``, a dict, or a path to a YAML file)."""


@hookspec
def perfsdk_register_commands(cli: click.Group) -> None:
    """Called when the ``perfsdk`` CLI starts. Add click commands with ``cli.add_command``."""


# -- session plugins ----------------------------------------------------------------------


@hookspec
def perfsdk_session_configure(session: Session) -> None:
    """Called once when a session is set up (its collectors made, nothing measured yet), on
    every plugin module. Session-wide extensions set themselves up here: perfsdk's distributed
    support detects the rank, joins the process group and gives every rank the same run id."""


@hookspec
def perfsdk_session_result(session: Session, result: RunResult) -> RunResult | None:
    """Called at finalize with the built run, before it is stored and exported. Return a
    replacement run (e.g. rank 0's run gathered from every rank) or ``None`` to keep it; each
    implementation gets the previous one's result."""


# -- lifecycle ----------------------------------------------------------------------------


@hookspec
def perfsdk_session_start(session: Session) -> None:
    """Called once when the session starts, before any model work. Arm counters here."""


@hookspec
def perfsdk_load(session: Session, event: LoadEvent) -> None:
    """Called after ``s.load()``. ``event`` has ``model``, ``tokenizer``, ``load_s``,
    ``import_s`` (one-time imports before loading, timed apart), ``source`` (``config`` or
    ``adopted``) and the model id."""


@hookspec
def perfsdk_tokenize(session: Session, event: TokenizeEvent) -> None:
    """Called after ``s.tokenize()``. ``event`` has the encodings, the per-prompt real
    (unpadded) token counts and the tokenize time."""


@hookspec
def perfsdk_before_generate(session: Session, step: Step) -> None:
    """Called right before a ``generate`` or ``forward`` step. ``step`` has ``kind``,
    ``index``, ``batch_size``, ``input_tokens`` (per request), ``warmup`` and the model."""


@hookspec
def perfsdk_after_generate(session: Session, step: Step) -> None:
    """Called right after a step. ``step`` now also has ``output_tokens`` (per request, real
    tokens up to and including EOS), ``start_ns``/``end_ns`` and ``token_times_ns`` (the time
    each generated position was ready, one clock for all collectors), or ``error``."""


@hookspec
def perfsdk_window_open(session: Session, window: Window) -> None:
    """Called when a measurement window opens: ``session``, ``step:N``, ``encode`` (encoder-
    decoder and multimodal models), ``prefill``, ``decode``, ``stage:<name>``. Read counters
    here; keep it cheap. ``session.in_timed_interval`` is true at a phase switch, which happens
    inside a timed step while ``generate`` waits: do nothing slow there."""


@hookspec
def perfsdk_window_close(session: Session, window: Window) -> None:
    """Called when a window closes (``window.end_ns`` is set). Read counters here."""


@hookspec
def perfsdk_finalize(session: Session) -> BaseModel | None:
    """Called once at the end. Return the collector's ``Result`` instance, or ``None``."""

"""The measurement session: lifecycle, one clock, windows, error isolation, finalize.

A :class:`Session` owns one plugin manager, one instance of each enabled collector, one
sampler thread and one clock. User code calls ``load``/``tokenize``/``generate``/``forward``/
``stage``/``record``; the session turns those into hook calls and, at the end, into a validated
:class:`~perfsdk.schemas.RunResult` that is stored and exported. It never loses what was
collected: a failing collector makes the run ``partial``, an exception in user code makes it
``failed``, and both are saved.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import pluggy
import structlog
from pydantic import BaseModel, ValidationError

from perfsdk import __version__
from perfsdk.clock import Clock
from perfsdk.collector import Collector
from perfsdk.config import Config, ConfigError, load_config
from perfsdk.events import LoadEvent, Step, TokenizeEvent, Window
from perfsdk.plugins import PluginRegistry, collect_registry, get_plugin_manager
from perfsdk.dispatch import HookDispatcher
from perfsdk.overhead import HookTimes
from perfsdk.sampler import Sampler
from perfsdk.series import BoundedSeries, add_bounded
from perfsdk.schemas import CollectorMeta, ErrorRecord, ModelInfo, Record, RunResult, WorkloadInfo

log = structlog.get_logger("perfsdk.session")

LIFECYCLE_HOOKS = (
    "perfsdk_session_start",
    "perfsdk_load",
    "perfsdk_tokenize",
    "perfsdk_before_generate",
    "perfsdk_after_generate",
    "perfsdk_window_open",
    "perfsdk_window_close",
    "perfsdk_finalize",
)


def new_run_id() -> str:
    """Sortable by time, unique across processes: UTC timestamp + 12 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:12]


def _trace_enabled() -> bool:
    from perfsdk.envflags import flag

    return flag("PERFSDK_TRACE_HOOKS")


class _TokenTimer:
    """A ``transformers`` streamer that timestamps every generated position on the session clock.

    ``generate`` calls ``put`` once with the prompt, then once per generated position with the
    new tokens of the whole batch (already copied to the host, so the device has finished that
    step). The first generated position closes the prefill window and opens the decode window.
    """

    def __init__(self, session: Session, step: Step, chained: Any = None) -> None:
        self.session = session
        self.step = step
        self.chained = chained
        self.prompt_seen = False
        self.tokens: list[Any] = []

    def put(self, value: Any) -> None:
        t = time.perf_counter_ns()
        if not self.prompt_seen:
            self.prompt_seen = True
        else:
            self.step.token_times_ns.append(t)
            self.tokens.append(value)
            if len(self.step.token_times_ns) == 1:
                self.session._phase_switch_to_decode(self.step, t)
        if self.chained is not None:
            self.chained.put(value)

    def end(self) -> None:
        if self.chained is not None:
            self.chained.end()


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    eos = kwargs.get("eos_token_id")
    if eos is None:
        gc = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        eos = getattr(gc, "eos_token_id", None)
    if eos is None:
        return set()
    if isinstance(eos, int):
        return {eos}
    try:
        return {int(e) for e in eos}
    except TypeError:
        return set()


@dataclass
class _BookedStep:
    """An instrumented copy of a timed step, to run after the timed steps."""

    of: Step
    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inference_mode: bool
    collectors: list[str]
    rng: Any


def _rng_state() -> Any:
    """torch's random state (CPU, and CUDA when initialized), so a copy samples like its original."""
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.random.get_rng_state(), cuda


def _set_rng_state(state: Any) -> None:
    import torch

    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def count_output_tokens(token_rows: list[list[int]], batch_size: int, eos: set[int]) -> list[int]:
    """Real output tokens per request: up to and including the first EOS, padding excluded.

    ``token_rows[k][i]`` is request ``i``'s token at generated position ``k``.
    """
    counts = []
    steps = len(token_rows)
    for i in range(batch_size):
        n = steps
        if eos:
            for k in range(steps):
                if token_rows[k][i] in eos:
                    n = k + 1
                    break
        counts.append(n)
    return counts


class Session:
    """One measured run. Use through :func:`perfsdk.session` as a context manager."""

    def __init__(
        self,
        config: Config | dict[str, Any] | str | None = None,
        *,
        collectors: list[Any] | None = None,
        store: str | os.PathLike[str] | None | bool = True,
        plugins: list[Any] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.config: Config = load_config(config) if not isinstance(config, Config) else config
        self.run_id = run_id or new_run_id()
        self.clock = Clock()
        self.sampler = Sampler(self.clock.now_ns)
        self.pm: pluggy.PluginManager = get_plugin_manager(extra_plugins=plugins)
        self.registry: PluginRegistry = collect_registry(self.pm, strict=False)
        self._backend: Any = None
        self.client_stats: Any = None  # a served run's ClientStats (perfsdk.events)
        self.collectors: dict[str, Collector] = {}
        self._init_collectors(collectors or [])
        if store is True:
            self.store_dir: str | None = self.config.store
        elif store is False or store is None:
            self.store_dir = None
        else:
            self.store_dir = os.fspath(store)
        self.device: Any = None
        self.model: Any = None
        self.tokenizer: Any = None
        self.model_info: ModelInfo | None = None
        self.workload_info: WorkloadInfo | None = None
        self.steps: list[Step] = []
        self.windows: list[Window] = []
        self.records: list[Record] = []
        self.errors: list[ErrorRecord] = [
            ErrorRecord(source=plugin, hook="discovery", type="PluginError", message=msg)
            for plugin, msg in self.registry.load_errors
        ]
        self.series: dict[str, list[dict[str, Any]]] = {}
        self.artifacts: dict[str, bytes] = {}
        self.tags: dict[str, str] = dict(self.config.tags)
        self.phase: str = "idle"
        self.result: RunResult | None = None
        self.run_dir: str | None = None
        self.started_at: datetime | None = None
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.load_event: LoadEvent | None = None
        self.tokenize_events: list[TokenizeEvent] = []
        self.interrupted: str | None = None
        self.rank_info: Any = None
        self._warmup_depth = 0
        #: True while a step's timed interval runs (between its start and end stamps): window edges
        #: then fall inside what is measured (a phase switch), and hooks must not block at them.
        self.in_timed_interval = False
        self._session_window: Window | None = None
        self._open_phase_window: Window | None = None
        self._step_window: Window | None = None
        self._stage_stack: list[Window] = []
        self._started = False
        self._finalized = False
        self._step_counter = 0
        # id(input tensor) -> (the tensor, its labels): kept alive so that the id stays unique
        self._labelled_inputs: dict[int, tuple[Any, list[str | None]]] = {}
        self._instrumenting = [c for c in self.collectors.values() if getattr(type(c), "instruments_steps", False)]
        self._booked: list[_BookedStep] = []
        self.instrumentation_notes: list[str] = []
        from perfsdk.validity import ValidityMonitor

        self.validity_monitor = ValidityMonitor(self.config.validity)
        self.hook_times: HookTimes = self.dispatcher.times
        # session plugins set up (perfsdk.distributed: same run id on all ranks; only rank 0 stores)
        self.dispatcher.dispatch("perfsdk_session_configure", session=self)

    # -- set-up ---------------------------------------------------------------------------

    def _init_collectors(self, extra: list[Any]) -> None:
        """Instantiate enabled collectors, validating each one's settings."""
        wanted: dict[str, dict[str, Any]] = {
            name: {} for name, cls in self.registry.collectors.items() if cls.default_enabled
        }
        extra_instances: list[Collector] = []
        for item in extra:
            if isinstance(item, type) and issubclass(item, Collector):
                self.registry.collectors.setdefault(item.name, item)
                wanted.setdefault(item.name, {})
            elif isinstance(item, Collector):
                extra_instances.append(item)
            else:
                raise ConfigError(f"collectors: {item!r} is not a perfsdk.Collector class or instance")
        for name, settings in self.config.collectors.items():
            if settings is False:
                wanted.pop(name, None)
                continue
            if name not in self.registry.collectors and not any(c.name == name for c in extra_instances):
                from perfsdk.suggest import did_you_mean

                known = ", ".join(sorted(self.registry.collectors)) or "none"
                hint = did_you_mean(name, self.registry.collectors)
                raise ConfigError(f"collectors.{name}: unknown collector{hint} (available: {known})")
            wanted[name] = {} if settings in (None, True) else dict(settings)  # type: ignore[arg-type]
        for inst in extra_instances:
            wanted.pop(inst.name, None)
            self.collectors[inst.name] = inst
            self.registry.collectors.setdefault(inst.name, type(inst))
        for name, settings in wanted.items():
            cls = self.registry.collectors[name]
            try:
                cfg = cls.Config.model_validate(settings)
            except ValidationError as err:
                from perfsdk.errors import format_validation_error

                raise ConfigError("invalid configuration: " + format_validation_error(err, f"collectors.{name}",
                                                                                      model=cls.Config)) from None
            self.collectors[name] = cls(cfg)
        for name, inst in self.collectors.items():
            self.pm.register(inst, name=f"collector:{name}")
        self.pm.check_pending()
        # lifecycle hooks: one implementation at a time, isolated, timed (perfsdk.dispatch)
        self.dispatcher = HookDispatcher(self.pm, self.record_error, HookTimes(), trace=_trace_enabled())

    def _hook_impls(self, hook: str) -> list[Any]:
        """The hook's implementations in call order."""
        return self.dispatcher.impls(hook)

    def _dispatch(self, hook: str, **kwargs: Any) -> None:
        self.dispatcher.dispatch(hook, **kwargs)

    @property
    def _in_instrumented(self) -> bool:
        """Whether an instrumented copy of a step is running (its hook time is not overhead of
        the measured steps)."""
        return self.dispatcher.unmeasured

    @_in_instrumented.setter
    def _in_instrumented(self, value: bool) -> None:
        self.dispatcher.unmeasured = value

    def record_error(self, source: str, hook: str | None, exc: BaseException) -> None:
        """Record an isolated failure; the run becomes ``partial``."""
        log.error("collector failed", source=source, hook=hook, error=repr(exc))
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        self.errors.append(ErrorRecord(source=source, hook=hook, type=type(exc).__name__, message=str(exc), traceback=tb))

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        self.finalize(exc)
        return False

    def start(self) -> Session:
        """Arm collectors, open the session window and start the sampler."""
        if self._started:
            return self
        self._started = True
        self.started_at = datetime.now(timezone.utc)
        if self.config.workload.threads:
            import torch

            torch.set_num_threads(self.config.workload.threads)
        self._dispatch("perfsdk_session_start", session=self)
        self.validity_monitor.attach(self)
        self.start_ns = self.clock.now_ns()
        self._session_window = self._open_window("session", "session")
        self.sampler.start()
        return self

    def _open_window(self, name: str, kind: str, step_index: int | None = None, parent: Window | None = None,
                     t_ns: int | None = None) -> Window:
        w = Window(name=name, kind=kind, start_ns=t_ns if t_ns is not None else self.clock.now_ns(sync=True),  # type: ignore[arg-type]
                   step_index=step_index, warmup=self._warmup_depth > 0, parent=parent,
                   instrumented=self._in_instrumented)
        self.windows.append(w)
        self._dispatch("perfsdk_window_open", session=self, window=w)
        return w

    def _close_window(self, w: Window, t_ns: int | None = None) -> None:
        if w.end_ns is not None:
            return
        w.end_ns = t_ns if t_ns is not None else self.clock.now_ns(sync=True)
        self._dispatch("perfsdk_window_close", session=self, window=w)

    @property
    def in_warmup(self) -> bool:
        return self._warmup_depth > 0

    @property
    def in_instrumented(self) -> bool:
        """True while an instrumented step runs (samplers tag what they read then)."""
        return self._in_instrumented

    @contextlib.contextmanager
    def warmup(self) -> Iterator[None]:
        """Steps inside this block are warm-up: counted, but excluded from statistics."""
        self._warmup_depth += 1
        try:
            yield
        finally:
            self._warmup_depth -= 1

    # -- model work -----------------------------------------------------------------------

    @property
    def backend(self) -> Any:
        """What runs the config's workload (:mod:`perfsdk.backends`): ``transformers`` in this
        process, ``openai`` for a served model (``model.endpoint``), or a plugin's."""
        if self._backend is None:
            from perfsdk.backends import backend_for

            self._backend = backend_for(self.config, self.registry)
        return self._backend

    @property
    def in_process(self) -> bool:
        """Whether the model runs in this process (False for a served model)."""
        return bool(self.backend.in_process)

    def load(self, model: Any = None, tokenizer: Any = None) -> tuple[Any, Any]:
        """Load ``config.model`` (timed), or adopt the given model/tokenizer objects.

        For a model served by another process (``model.endpoint``) nothing is loaded: the
        backend gives the tokenizer it can find (or None) and what is known of the model."""
        from perfsdk.models.info import describe_model, model_device

        self._ensure_started()
        if model is None and not self.in_process:
            return self._load_served(tokenizer)
        prev, self.phase = self.phase, "load"
        t0 = self.clock.now_ns()
        import_s = 0.0
        if model is None:
            from perfsdk.models.loader import load_prepared, prepare_load

            # one-time imports and set-up first, timed apart: load_s is the model's own
            prepared = prepare_load(self.config.model)
            t_ready = self.clock.now_ns()
            import_s, t0 = (t_ready - t0) / 1e9, t_ready
            model, loaded_tok = load_prepared(prepared)
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
            source = "config"
            model_id: str | None = self.config.model.id
        else:
            source = "adopted"
            model_id = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
        t1 = self.clock.now_ns(sync=True)
        self.phase = prev
        self.model, self.tokenizer = model, tokenizer
        self.device = model_device(model)
        if self.device is not None:
            self.clock.use_device(self.device)
        load_s = (t1 - t0) / 1e9 if source == "config" else 0.0
        quant = self.config.model.quantization if source == "config" else "none"
        try:
            self.model_info = describe_model(model, model_id=model_id, load_s=load_s if source == "config" else None,
                                             quantization=quant)
        except Exception as exc:
            self.record_error("session", "describe_model", exc)
        if self.model_info is not None and source == "config":
            self.model_info = self.model_info.model_copy(update={"import_s": import_s})
        self.load_event = LoadEvent(model=model, tokenizer=tokenizer, load_s=load_s, source=source, model_id=model_id,  # type: ignore[arg-type]
                                    import_s=import_s)
        self._dispatch("perfsdk_load", session=self, event=self.load_event)
        return model, tokenizer

    def _load_served(self, tokenizer: Any) -> tuple[Any, Any]:
        t0 = self.clock.now_ns()
        model, found = self.backend.load(self)
        tokenizer = tokenizer if tokenizer is not None else found
        self.model, self.tokenizer = model, tokenizer
        self.model_info = self.backend.model_info()
        self.load_event = LoadEvent(model=model, tokenizer=tokenizer, load_s=(self.clock.now_ns() - t0) / 1e9,
                                    source="served", model_id=self.config.model.id)  # type: ignore[arg-type]
        self._dispatch("perfsdk_load", session=self, event=self.load_event)
        return model, tokenizer

    # -- requests to a served model ---------------------------------------------------------

    def begin_request(self, *, input_tokens: int, scheduled_ns: int, inputs: dict[str, Any] | None = None,
                      gen_kwargs: dict[str, Any] | None = None, in_flight: int = 1,
                      start_ns: int | None = None) -> Step:
        """A request to a served model starts: its step (batch 1) gets the before-hooks, then
        the send time is stamped. Steps of concurrent requests overlap; each is its own.

        ``start_ns``: the send time when another process sent it already (the hooks then come
        after the fact, with the times that process took on the same monotonic clock)."""
        from perfsdk.events import ServedRequest

        self._ensure_started()
        step = Step(kind="generate", index=self._step_counter, batch_size=1, input_tokens=[input_tokens],
                    inputs=dict(inputs or {}), warmup=self.in_warmup,
                    served=ServedRequest(scheduled_ns=scheduled_ns, backend=self.backend.name, in_flight=in_flight))
        step.gen_kwargs = dict(gen_kwargs or {})
        self._step_counter += 1
        self._dispatch("perfsdk_before_generate", session=self, step=step)
        step.start_ns = start_ns if start_ns is not None else self.clock.now_ns()
        return step

    def end_request(self, step: Step) -> None:
        """A request to a served model ended (or failed): the after-hooks run with its tokens."""
        if step.end_ns is None:
            step.end_ns = self.clock.now_ns()
        self.steps.append(step)
        self._dispatch("perfsdk_after_generate", session=self, step=step)

    @contextlib.contextmanager
    def measured_load(self) -> Iterator[None]:
        """The measured part of a served run, as one window: the validity monitor reads the
        machine's contention over it (requests overlap, so not per step)."""
        from perfsdk.events import SERVED_WINDOW

        self.validity_monitor.step_begin()
        try:
            with self.stage(SERVED_WINDOW.split(":", 1)[1]):
                yield
        finally:
            self.validity_monitor.step_end()

    def tokenize(self, tokenizer: Any, prompts: list[str] | str, *, labels: list[Any] | Any = None,
                 **kwargs: Any) -> Any:
        """Tokenize prompts (padded, left-padded for generation) onto the model's device.

        ``labels`` (one per prompt: a class name or index, or an expected answer; ``None`` for
        an unlabelled prompt) travel with the returned encodings: every ``s.generate`` or
        ``s.forward`` on them carries them as ``step.labels`` for the ``quality`` collector.
        ``tokenizer`` may be a multimodal processor; images (``images=...``) pass through
        ``kwargs`` and the processor inserts the image tokens.
        """
        self._ensure_started()
        if isinstance(prompts, str):
            prompts = [prompts]
            if labels is not None and not isinstance(labels, list):
                labels = [labels]
        refs = self._check_labels(labels, len(prompts)) if labels is not None else None
        kwargs.setdefault("return_tensors", "pt")
        kwargs.setdefault("padding", True)
        if getattr(tokenizer, "pad_token", "x") is None:
            tokenizer.pad_token = tokenizer.eos_token
        if "padding_side" not in kwargs and hasattr(tokenizer, "padding_side"):
            kwargs["padding_side"] = "left"
        from perfsdk.models.encode import is_processor

        t0 = self.clock.now_ns()
        # a multimodal processor takes images first: the prompts must go in by name
        enc = tokenizer(text=prompts, **kwargs) if is_processor(tokenizer) else tokenizer(prompts, **kwargs)
        if self.device is not None and hasattr(enc, "to"):
            enc = enc.to(self.device)
        t1 = self.clock.now_ns()
        mask = enc.get("attention_mask") if hasattr(enc, "get") else None
        if mask is not None:
            counts = [int(x) for x in mask.sum(dim=1).tolist()]
        else:
            ids = enc["input_ids"]
            counts = [int(ids.shape[-1])] * int(ids.shape[0])
        ev = TokenizeEvent(encodings=enc, token_counts=counts, tokenize_s=(t1 - t0) / 1e9, labels=refs)
        if refs is not None:
            self.label(enc, refs)
        self.tokenize_events.append(ev)
        self._dispatch("perfsdk_tokenize", session=self, event=ev)
        return enc

    @staticmethod
    def _check_labels(labels: Any, n: int) -> list[str | None]:
        if not isinstance(labels, (list, tuple)):
            raise TypeError(f"labels must be a list (one per request), got {type(labels).__name__}")
        if len(labels) != n:
            raise ValueError(f"{len(labels)} labels for {n} requests")
        out: list[str | None] = []
        for x in labels:
            if x is not None and (isinstance(x, bool) or not isinstance(x, (str, int))):
                raise TypeError(f"a label must be a string, an integer or None, got {type(x).__name__}")
            out.append(None if x is None else str(x))
        return out

    def label(self, inputs: Any, labels: list[Any]) -> Any:
        """Attach references (one per request) to ``inputs`` (a tensor, or a mapping such as
        the encodings of ``s.tokenize``) and return ``inputs``. Steps run on them carry the
        labels as ``step.labels``; this is how code that does not tokenize through the session
        (a plain ``nn.Module`` on tensors) labels its requests."""
        key = self._input_key(inputs)
        if key is None:
            raise TypeError(f"s.label: cannot label {type(inputs).__name__}; pass a tensor or a mapping with input_ids")
        batch = int(key.shape[0]) if hasattr(key, "shape") and len(key.shape) > 0 else 1
        self._labelled_inputs[id(key)] = (key, self._check_labels(labels, batch))
        return inputs

    @staticmethod
    def _input_key(inputs: Any) -> Any:
        """The tensor that identifies a batch: ``input_ids`` (or the first model input) of a
        mapping, or the tensor itself."""
        if hasattr(inputs, "shape"):
            return inputs
        getter = getattr(inputs, "get", None)
        if getter is None:
            return None
        for key in ("input_ids", "inputs", "pixel_values", "input_values", "x"):
            value = getter(key)
            if value is not None:
                return value
        return None

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()
        if self._finalized:
            raise RuntimeError("session already finalized")

    def _adopt_implicitly(self, model: Any) -> None:
        """A model used without ``s.load()``: describe it and synchronize its device at edges."""
        if model is self.model or model is None:
            return
        from perfsdk.models.info import describe_model, model_device

        dev = model_device(model)
        if dev is not None:
            self.clock.use_device(dev)
        if self.model is None:
            self.model, self.device = model, dev
            try:
                self.model_info = describe_model(model, model_id=type(model).__name__)
            except Exception as exc:
                self.record_error("session", "describe_model", exc)

    def _new_step(self, kind: str, model: Any, inputs: dict[str, Any], args: tuple[Any, ...] = ()) -> Step:
        self._adopt_implicitly(model)
        ids = inputs.get("input_ids")
        mask = inputs.get("attention_mask")
        for key in ("inputs", "pixel_values", "input_values", "x"):
            if ids is not None:
                break
            ids = inputs.get(key)
        if ids is None and args:
            ids = args[0]
        batch = int(ids.shape[0]) if ids is not None and hasattr(ids, "shape") and len(ids.shape) > 0 else 1
        if mask is not None:
            in_tokens = [int(x) for x in mask.sum(dim=1).tolist()]
        elif ids is not None and hasattr(ids, "shape") and len(ids.shape) >= 2 and not getattr(ids, "is_floating_point", lambda: True)():
            in_tokens = [int(ids.shape[1])] * batch
        else:
            in_tokens = [0] * batch
        step = Step(kind=kind, index=self._step_counter, batch_size=batch, input_tokens=in_tokens, model=model,  # type: ignore[arg-type]
                    inputs=inputs, args=tuple(args), warmup=self.in_warmup)
        if ids is not None and self._labelled_inputs:
            known = self._labelled_inputs.get(id(ids))
            if known is not None and known[0] is ids:
                step.labels = known[1]
        self._step_counter += 1
        return step

    def generate(self, model: Any, **kwargs: Any) -> Any:
        """Run ``model.generate(**kwargs)`` with per-token timestamps taken inside generation.

        Phases: ``prefill`` until the first token, then ``decode``. A model that encodes its
        inputs first (encoder-decoder, vision/audio tower and projector; see
        :mod:`perfsdk.models.encode`) starts with an ``encode`` phase that ends when the last
        encode module finishes.
        """
        import torch

        self._ensure_started()
        streamer = kwargs.pop("streamer", None)
        step = self._new_step("generate", model, kwargs)
        step.gen_kwargs = {k: v for k, v in kwargs.items() if not hasattr(v, "shape")}
        self._book_instrumentation(step, model, (), kwargs, True)
        return self._run_generate(step, model, kwargs, streamer)

    def _run_generate(self, step: Step, model: Any, kwargs: dict[str, Any], streamer: Any) -> Any:
        import torch

        measured = self._begin_step(step)
        self._dispatch("perfsdk_before_generate", session=self, step=step)
        timer = _TokenTimer(self, step, chained=streamer)
        prev_phase = self.phase
        # Windows open before the start stamp and close after the end stamp, so the hooks that
        # read counters at the edges stay outside the measured interval.
        self._step_window = self._open_window(f"step:{step.index}", "step", step.index, self._parent_window())
        tracker = self._encode_tracker(step, model, kwargs)
        first = "encode" if tracker is not None else "prefill"
        self._open_phase_window = self._open_window(first, first, step.index, self._step_window)  # type: ignore[arg-type]
        self.phase = first
        if tracker is not None:  # hooks in place before the start stamp
            tracker.__enter__()
        step.start_ns = self.clock.now_ns(sync=True)
        self.in_timed_interval = True
        out = None
        try:
            with torch.inference_mode():
                out = model.generate(**kwargs, streamer=timer)
        except BaseException as exc:
            step.error = exc
            raise
        finally:
            step.end_ns = self.clock.now_ns(sync=True)
            self.in_timed_interval = False
            if tracker is not None:
                tracker.__exit__(None, None, None)
            self.phase = prev_phase
            if self._open_phase_window is not None:
                self._close_window(self._open_phase_window)
                self._open_phase_window = None
            self._close_window(self._step_window)
            self._step_window = None
            step.outputs = out
            if tracker is not None:
                step.vision_tokens = tracker.vision_tokens(step.batch_size, kwargs)
            self._finish_generate_counts(step, timer, model, kwargs, out)
            self.steps.append(step)
            self._dispatch("perfsdk_after_generate", session=self, step=step)
            self._end_step(step, measured)
        return out

    def _encode_tracker(self, step: Step, model: Any, kwargs: dict[str, Any]) -> Any:
        """Hooks that end the ``encode`` phase, when the model encodes this step's inputs first."""
        from perfsdk.models.encode import EncodeTracker, cached_encode_parts

        try:
            parts = cached_encode_parts(model)
        except Exception as exc:
            self.record_error("session", "encode_parts", exc)
            return None
        if parts is None or not parts.runs_for(kwargs):
            return None
        return EncodeTracker(model, parts, lambda: self.clock.now_ns(sync=True),
                             lambda t_ns: self._phase_switch(step, "prefill", t_ns))

    def _phase_switch(self, step: Step, phase: Literal["prefill", "decode"], t_ns: int) -> None:
        """Close the open phase window at ``t_ns`` and open ``phase`` at the same instant."""
        if phase == "prefill":
            step.encode_end_ns = t_ns
        if self._open_phase_window is not None:
            self._close_window(self._open_phase_window, t_ns)
        self._open_phase_window = self._open_window(phase, phase, step.index, self._step_window, t_ns)
        self.phase = phase

    def _phase_switch_to_decode(self, step: Step, t_ns: int) -> None:
        if self._open_phase_window is not None:
            self._close_window(self._open_phase_window, t_ns)
        self._open_phase_window = self._open_window("decode", "decode", step.index, self._step_window, t_ns)
        self.phase = "decode"

    def _finish_generate_counts(self, step: Step, timer: _TokenTimer, model: Any, kwargs: dict[str, Any], out: Any) -> None:
        eos = _eos_ids(model, kwargs)
        try:
            if timer.tokens:
                rows = [[int(x) for x in t.reshape(-1).tolist()] for t in timer.tokens]
                step.output_tokens = count_output_tokens(rows, step.batch_size, eos)
            elif out is not None and hasattr(out, "shape") and "input_ids" in kwargs:
                # model.generate did not call the streamer: count from the returned sequences
                new = out[:, kwargs["input_ids"].shape[1]:]
                rows = [[int(x) for x in new[:, k].tolist()] for k in range(new.shape[1])]
                step.output_tokens = count_output_tokens(rows, step.batch_size, eos)
            else:
                step.output_tokens = [0] * step.batch_size
        except Exception as exc:
            self.record_error("session", "count_output_tokens", exc)
            step.output_tokens = [0] * step.batch_size

    def forward(self, model: Any, *args: Any, inference_mode: bool = True, **kwargs: Any) -> Any:
        """Time one forward call of any ``nn.Module`` (``model(*args, **kwargs)``)."""
        self._ensure_started()
        step = self._new_step("forward", model, kwargs, args)
        self._book_instrumentation(step, model, args, kwargs, inference_mode)
        return self._run_forward(step, model, args, kwargs, inference_mode)

    def _run_forward(self, step: Step, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     inference_mode: bool) -> Any:
        import torch

        measured = self._begin_step(step)
        self._dispatch("perfsdk_before_generate", session=self, step=step)
        prev_phase = self.phase
        self._step_window = self._open_window(f"step:{step.index}", "step", step.index, self._parent_window())
        self.phase = "forward"
        step.start_ns = self.clock.now_ns(sync=True)
        out = None
        try:
            ctx = torch.inference_mode() if inference_mode else contextlib.nullcontext()
            with ctx:
                out = model(*args, **kwargs)
        except BaseException as exc:
            step.error = exc
            raise
        finally:
            step.end_ns = self.clock.now_ns(sync=True)
            self.phase = prev_phase
            self._close_window(self._step_window)
            self._step_window = None
            step.outputs = out
            step.output_tokens = []
            self.steps.append(step)
            self._dispatch("perfsdk_after_generate", session=self, step=step)
            self._end_step(step, measured)
        return out

    # -- instrumented steps ---------------------------------------------------------------

    def _begin_step(self, step: Step) -> bool:
        """Mark an instrumented step as running; start the contention reading of a measured one."""
        self._in_instrumented = step.instrumented
        measured = not step.warmup and not step.instrumented
        if measured:
            self.validity_monitor.step_begin()
        return measured

    def _end_step(self, step: Step, measured: bool) -> None:
        self._in_instrumented = False
        if measured:
            self.validity_monitor.step_end()

    def _book_instrumentation(self, step: Step, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                              inference_mode: bool) -> None:
        """Ask the instrumenting collectors about a timed step; book their instrumented steps.

        With ``instrumentation.replay`` (the default) each collector that wants the step gets a
        copy of its own (one shared copy with ``share_steps``), run after the timed steps by
        :meth:`run_instrumented`. Without it, the first one instruments the timed step itself
        and any other gets a copy.
        """
        if step.warmup or not self._instrumenting:
            return
        wanting: list[str] = []
        for col in self._instrumenting:
            try:
                if col.wants_to_instrument(self, step):
                    wanting.append(col.name)
            except Exception as exc:
                self.record_error(col.name, "wants_to_instrument", exc)
        if not wanting:
            return
        cfg = self.config.instrumentation
        groups = [wanting] if cfg.share_steps else [[name] for name in wanting]
        if not cfg.replay:
            step.instrumented_by = groups.pop(0)
        if groups:
            rng = _rng_state()
            for names in groups:
                self._booked.append(_BookedStep(step, model, tuple(args), dict(kwargs), inference_mode, names, rng))

    def run_instrumented(self) -> int:
        """Run the instrumented steps booked so far; return how many ran.

        Each repeats a timed step: same model, inputs and settings, and torch's random state as
        it was before that step (so sampling draws the same tokens). The session calls this when
        it ends, after closing the session window; call it earlier to instrument before changing
        the model. Copies of timed steps that failed are not run.
        """
        booked, self._booked = self._booked, []
        if not booked:
            return 0
        saved = _rng_state()
        ran = 0
        try:
            for b in booked:
                if b.of.error is not None or b.of.end_ns is None:
                    self.instrumentation_notes.append(
                        f"step {b.of.index} failed: its instrumented copy for {', '.join(b.collectors)} was not run")
                    continue
                kwargs = dict(b.kwargs)
                step = self._new_step(b.of.kind, b.model, kwargs, b.args)
                step.gen_kwargs = dict(b.of.gen_kwargs)
                step.warmup = False  # a copy of a timed step, even if run inside s.warmup()
                step.instrumented_by = list(b.collectors)
                step.replay_of = b.of.index
                _set_rng_state(b.rng)
                ran += 1
                try:
                    if step.kind == "generate":
                        self._run_generate(step, b.model, kwargs, None)
                    else:
                        self._run_forward(step, b.model, b.args, kwargs, b.inference_mode)
                except Exception as exc:
                    self.record_error("session", "instrumented step", exc)
        finally:
            _set_rng_state(saved)
        return ran

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[Window]:
        """A user-named, timed and energy-metered window."""
        self._ensure_started()
        if not name or ":" in name:
            raise ValueError(f"stage name {name!r}: must be non-empty and contain no ':'")
        w = self._open_window(f"stage:{name}", "stage", None, self._step_window or self._parent_window())
        self._stage_stack.append(w)
        prev_phase, self.phase = self.phase, f"stage:{name}"
        try:
            yield w
        finally:
            self.phase = prev_phase
            self._stage_stack.remove(w)
            self._close_window(w)

    def _parent_window(self) -> Window | None:
        return self._stage_stack[-1] if self._stage_stack else self._session_window

    def record(self, name: str, value: Any, unit: str | None = None) -> None:
        """Store a user metric with the run."""
        if not name:
            raise ValueError("record name must be non-empty")
        if value is not None and not isinstance(value, (int, float, str, bool)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"record {name!r}: value must be a number, string or bool") from None
        t = self.clock.since_origin_s(self.clock.now_ns()) if self.start_ns is not None else None
        self.records.append(Record(name=name, value=value, unit=unit, t_s=t))

    # -- data for the store ---------------------------------------------------------------

    def add_series(self, name: str, rows: list[dict[str, Any]] | BoundedSeries) -> None:
        """Attach a raw time series (stored next to the result as JSON lines), capped in length."""
        add_bounded(self, name, rows)

    def add_artifact(self, filename: str, data: bytes | str) -> None:
        """Attach a file (e.g. a profiler trace) to be stored in the run folder."""
        self.artifacts[filename] = data.encode() if isinstance(data, str) else data

    def collector(self, name: str) -> Collector | None:
        return self.collectors.get(name)

    def set_workload_info(self, info: WorkloadInfo) -> None:
        self.workload_info = info

    @property
    def measured_steps(self) -> list[Step]:
        """Steps that count: not warm-up, not instrumented, finished without error."""
        return [s for s in self.steps
                if not s.warmup and not s.instrumented_by and s.error is None and s.end_ns is not None]

    @property
    def instrumented_steps(self) -> list[Step]:
        """Steps a collector instrumented (left out of every statistic)."""
        return [s for s in self.steps if s.instrumented_by]

    # -- finalize -------------------------------------------------------------------------

    def finalize(self, exc: BaseException | None = None) -> RunResult:
        """Close windows, collect results, build, store and export the run. Idempotent."""
        if self._finalized and self.result is not None:
            return self.result
        if not self._started:
            self.start()
        self._finalized = True
        self.end_ns = self.clock.now_ns(sync=True)
        if self._open_phase_window is not None:
            self._close_window(self._open_phase_window, self.end_ns)
        if self._step_window is not None:
            self._close_window(self._step_window, self.end_ns)
        for w in self.windows:
            if w.end_ns is None and w.kind == "stage":
                self._close_window(w, self.end_ns)
        if self._session_window is not None:
            self._close_window(self._session_window, self.end_ns)
        if exc is None and not self.interrupted:
            try:
                self.run_instrumented()
            except BaseException as replay_exc:  # an interrupt while instrumenting: keep what was collected
                self.record_error("session", "instrumented step", replay_exc)
                if isinstance(replay_exc, KeyboardInterrupt):
                    self.interrupted = "interrupted while running instrumented steps"
        elif self._booked:
            self.instrumentation_notes.append(
                f"{len(self._booked)} instrumented step(s) not run: the session ended with an error")
            self._booked = []
        self.sampler.stop()
        collected: dict[str, dict[str, Any]] = {}
        typed: dict[str, Any] = {}
        for owner, res in self.dispatcher.collect("perfsdk_finalize", session=self):
            stored = self._validate_result(owner, res)
            if stored is not None:
                collected[owner] = stored
                typed[owner] = res
        validity = None
        try:
            validity = self.validity_monitor.finalize(self)
        except Exception as vexc:
            self.record_error("session", "validity", vexc)
        status = "ok"
        if exc is not None or self.interrupted:
            status = "failed"
            if exc is not None:
                tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:])
                src = "interrupt" if isinstance(exc, KeyboardInterrupt) else "user"
                self.errors.append(ErrorRecord(source=src, hook=None, type=type(exc).__name__,
                                               message=str(exc) or self.interrupted or "", traceback=tb))
            elif self.interrupted:
                self.errors.append(ErrorRecord(source="interrupt", type="Interrupted", message=self.interrupted))
        elif self.errors:
            status = "partial"
        finished = datetime.now(timezone.utc)
        from perfsdk.env import capture_environment

        result = RunResult(
            run_id=self.run_id,
            name=self.config.name,
            status=status,  # type: ignore[arg-type]
            validity=validity,
            started_at=self.started_at or finished,
            finished_at=finished,
            duration_s=(self.end_ns - (self.start_ns or self.end_ns)) / 1e9,
            perfsdk_version=__version__,
            environment=capture_environment(),
            config=self.config.model_dump(mode="json"),
            model=self.model_info,
            workload=self.workload_info,
            collectors=collected,
            records=self.records,
            errors=self.errors,
            tags=self.tags,
            collector_meta={name: CollectorMeta(plugin=self.registry.origins.get("collector:" + name), installed=True,
                                                validated=True) for name in collected},
        )
        for name, res in typed.items():  # the typed results the collectors returned
            cls = type(self.collectors[name]).Result if name in self.collectors else None
            if cls is not None and isinstance(res, cls):
                result._typed[name] = (result.collectors[name], res)
        result = self._post_process(result)
        self.result = result
        self._persist()
        return self.result

    def _post_process(self, result: RunResult) -> RunResult:
        """Record hook times, then gather ranks to rank 0 and aggregate (distributed runs)."""
        env = result.environment
        extra = {**env.extra, "hook_time": self.hook_times.summary()}
        result = result.model_copy(update={"environment": env.model_copy(update={"extra": extra})})
        for impl in self.dispatcher.impls("perfsdk_session_result"):
            try:
                out = impl.function(*[{"session": self, "result": result}[a] for a in impl.argnames])
            except Exception as exc:  # a failing session plugin never loses the run: it becomes partial
                self.record_error(impl.plugin_name, "perfsdk_session_result", exc)
                result = result.model_copy(update={
                    "errors": [*result.errors, self.errors[-1]],
                    "status": "partial" if result.status == "ok" else result.status})
                continue
            if out is not None:
                result = out
        return result

    def _validate_result(self, owner: str, res: Any) -> dict[str, Any] | None:
        cls = type(self.collectors[owner]).Result if owner in self.collectors else None
        try:
            if cls is None:
                if isinstance(res, BaseModel):
                    return res.model_dump(mode="json")
                raise TypeError(f"plugin {owner} returned {type(res).__name__} from perfsdk_finalize")
            if isinstance(res, cls):
                return res.model_dump(mode="json")
            data = res.model_dump() if isinstance(res, BaseModel) else res
            return cls.model_validate(data).model_dump(mode="json")
        except (ValidationError, TypeError, ValueError) as e:
            self.record_error(owner, "perfsdk_finalize", ValueError(f"result failed validation: {e}"))
            return None

    def _persist(self) -> None:
        from perfsdk.plugins import using_registry

        with using_registry(self.registry):  # read back and export with this session's collectors
            self._persist_and_export()

    def _persist_and_export(self) -> None:
        assert self.result is not None
        if not self.store_dir:
            return
        from perfsdk.store import Store

        try:
            store = Store(self.store_dir)
            self.run_dir = str(store.save(self.result, series=self.series, artifacts=self.artifacts))
            # store.save may have added series/artifact names: read back the stored result
            self.result = store.get(self.result.run_id)
        except Exception as exc:
            log.error("could not store the run", store=self.store_dir, error=repr(exc))
            from perfsdk.terminal import error_line

            print(error_line(f"could not store run {self.run_id} in {self.store_dir}: {exc}"), file=sys.stderr)
            return
        for name in self.config.exporters:
            cls = self.registry.exporters.get(name)
            if cls is None:
                log.error("unknown exporter", exporter=name, available=sorted(self.registry.exporters))
                continue
            try:
                store.write_export(self.result.run_id, cls())
            except Exception as exc:
                log.error("exporter failed", exporter=name, error=repr(exc))


def session(config: Config | dict[str, Any] | str | None = None, **kwargs: Any) -> Session:
    """Start a measurement session: ``with perfsdk.session(cfg) as s: ...``.

    ``config`` may be a :class:`~perfsdk.config.Config`, a dict, a YAML path or ``None`` for
    defaults. Keyword arguments: ``collectors`` (extra collector classes or instances),
    ``store`` (a folder, or ``None`` to keep the run in memory only), ``plugins`` (extra plugin
    objects to register), ``run_id``.
    """
    return Session(config, **kwargs)

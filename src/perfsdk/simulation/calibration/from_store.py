"""Fitting from stored runs: each run's operations rebuilt from its model configuration at its
measured shapes (:func:`calibrate_from_store`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfsdk.simulation.calibration.fit import (ConfigurationSamples, FitResult, Observation, bootstrap_coefficients, fit,
                                              checked_cache, keep_held_out)
from perfsdk.simulation.calibration.measure import Measurement, observations_for


def model_config_of_run(run: Any) -> Any:
    """The model configuration a stored run measured, for the analytic op generator.

    ``builtin:NAME`` resolves to the embedded configuration; a Hub id or local path to its
    ``config.json`` when it is available without downloading; otherwise a config built from the
    architecture fields of the run's ``model`` section (model type, hidden size, layers, heads,
    ...), which must name every field the architecture depends on.
    """
    info = run.model
    if info is None:
        raise ValueError(f"run {run.run_id}: no model section")
    model_id = info.model_id or (run.config.get("model") or {}).get("id")
    overrides = _config_overrides(run)
    if isinstance(model_id, str) and model_id.startswith("builtin:"):
        from perfsdk.models.tiny import tiny_llama_config

        cfg = tiny_llama_config(model_id.removeprefix("builtin:"))
        for key, value in overrides.items():
            setattr(cfg, key, value)
        return cfg
    if isinstance(model_id, str) and model_id:
        try:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(model_id, local_files_only=True, **overrides)
        except Exception:
            pass
    from perfsdk.models.arch import architecture_from_config

    names = {"model_type": "model_type", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
             "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
             "head_dim": "head_dim", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}
    data = {key: getattr(info, field) for key, field in names.items() if getattr(info, field, None) is not None}
    try:
        architecture_from_config(data)
    except ValueError as exc:
        raise ValueError(f"run {run.run_id}: model {model_id!r} cannot be rebuilt from its model section: {exc}") from None
    return data


def _config_overrides(run: Any) -> dict[str, Any]:
    """The ``model.config_overrides`` a stored run was loaded with (what its model was built as)."""
    model = (getattr(run, "config", None) or {}).get("model") or {}
    return dict(model.get("config_overrides") or {})


def model_label_of_run(run: Any) -> str:
    """The model a stored run measured, named by its id and the configuration fields it overrode
    (``builtin:tiny-llama-large{num_hidden_layers=4}``): runs of one checkpoint at two depths are
    two models, each left out in turn when the calibration measures how far it misses a model."""
    label = (run.model.model_id if run.model and run.model.model_id else run.name) or run.run_id
    overrides = _config_overrides(run)
    if overrides:
        label += "{" + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())) + "}"
    return label


@dataclass(frozen=True)
class MeasuredMachine:
    """The device a set of stored runs measured: what the fitted profile describes."""

    kind: str  #: ``gpu`` (CUDA runs) or ``cpu``
    device: str  #: the GPU's name, or the CPU model
    host_cpu: str | None
    base: str | None  #: catalogue profile of the GPU by its name (energy, capacity, unidentified rates)
    capacity_gb: float | None
    dtype: str

    @property
    def label(self) -> str:
        if self.kind == "gpu" and self.host_cpu:
            return f"{self.device} (host {self.host_cpu})"
        return self.device


def machine_of_run(run: Any) -> MeasuredMachine:
    """Where a stored run measured: the CUDA device its model ran on, else the host's CPU."""
    from perfsdk.hardware.catalog import profile_for_gpu_name

    env = run.environment
    device = str(getattr(run.model, "device", None) or "cpu")
    dtype = (getattr(run.model, "dtype", None) or "float32").removeprefix("torch.")
    cpu = getattr(env, "cpu_model", None) or "unknown CPU"
    if device.startswith("cuda"):
        names = list(getattr(env, "gpu_names", None) or [])
        idx = int(device.split(":", 1)[1]) if ":" in device and device.split(":", 1)[1].isdigit() else 0
        gpu = names[idx] if idx < len(names) else (names[0] if names else "CUDA device")
        return MeasuredMachine(kind="gpu", device=gpu, host_cpu=cpu, base=profile_for_gpu_name(gpu), capacity_gb=None,
                               dtype=dtype)
    ram = getattr(env, "ram_bytes", None)
    return MeasuredMachine(kind="cpu", device=cpu, host_cpu=None, base=None,
                           capacity_gb=round(ram / 1e9, 1) if ram else None, dtype=dtype)


def measurements_of_run(run: Any, requests: list[dict[str, Any]] | None = None) -> list[Measurement]:
    """One :class:`Measurement` per distinct (batch, input tokens, output tokens) of a stored run,
    as the latency collector reports them (:meth:`LatencyCollector.step_timings`)."""
    from perfsdk.collectors.latency import LatencyCollector

    label = model_label_of_run(run)
    return [Measurement(model=label, batch_size=t.batch_size, input_tokens=t.input_tokens,
                        output_tokens=t.output_tokens, ttft_s=t.ttft_s, decode_s=t.decode_s, repeats=t.repeats)
            for t in LatencyCollector.step_timings(run, requests)]


def calibrate_from_store(store_dir: str, run_ids: list[str] | None = None, *,
                         fit_step_overhead: bool = True) -> tuple[FitResult, list[Measurement], list[str]]:
    """Fit a host profile from measured runs in a store (all complete runs, or ``run_ids``).

    Each run's operations are rebuilt by the analytic generator from its model configuration
    (:func:`model_config_of_run`) at its measured batch sizes and token counts
    (:func:`measurements_of_run`), in the run's dtype. Returns the fit, the measurements used and
    one note per run skipped (no model, no latency, failed, quantized: the cost model describes
    dense kernels). The runs must come from one device (:func:`machine_of_run`): the fit's
    ``machine`` says which, and the profile made of it describes that device, not this host.
    """
    from perfsdk.models.arch import architecture_from_config
    from perfsdk.store import Store, StoreError

    store = Store(store_dir)
    ids = list(run_ids) if run_ids else store.run_ids()
    if not ids:
        raise ValueError(f"{store_dir}: no runs")
    obs: list[Observation] = []
    machines: dict[MeasuredMachine, list[str]] = {}
    samples: list[ConfigurationSamples] = []
    used: list[Measurement] = []
    skipped: list[str] = []
    threads: set[int | None] = set()  # torch threads the runs used (what a CPU's times depend on)
    for rid in ids:
        try:
            run = store.get(rid)
        except StoreError as exc:
            if run_ids:
                raise ValueError(str(exc)) from exc
            skipped.append(f"{rid}: {exc}")
            continue
        if run.status == "failed":
            skipped.append(f"{rid}: status failed")
            continue
        quant = getattr(run.model, "quantization", None) if run.model is not None else None
        if quant not in (None, "none"):
            skipped.append(f"{rid}: {quant} model (the cost model describes dense kernels)")
            continue
        try:
            cfg = model_config_of_run(run)
        except ValueError as exc:
            skipped.append(str(exc))
            continue
        meas = measurements_of_run(run)
        if not meas:
            skipped.append(f"{rid}: no latency measurements")
            continue
        dtype = (run.model.dtype if run.model and run.model.dtype else "float32").removeprefix("torch.")
        machines.setdefault(machine_of_run(run), []).append(rid)
        threads.add(getattr(run.environment, "torch_threads", None))
        shape = architecture_from_config(cfg)
        for m in meas:
            o = observations_for(shape, m, dtype=dtype)
            obs.extend(o)
            samples.append(ConfigurationSamples(model=m.model, observations=o,
                                                per_pass=[[x.measured_s] for x in o],
                                                width=shape.hidden_size, family=shape.model_type or None))
        used.extend(meas)
    devices = {(m.kind, m.device, m.host_cpu) for m in machines}
    if len(devices) > 1:
        listed = "; ".join(f"{m.label} in {m.dtype}: {', '.join(r)}" for m, r in machines.items())
        raise ValueError(f"{store_dir}: the runs were measured on different devices ({listed}); a profile describes "
                         "one: choose its runs with --run")
    if len(obs) < 3:
        raise ValueError(f"{store_dir}: {len(obs)} usable measured phases in {len(ids)} run(s); at least 3 needed "
                         f"(skipped: {'; '.join(skipped) or 'none'})")
    result = fit(obs, fit_step_overhead=fit_step_overhead, weight_row_term=False)
    # as on this host: a cache only where it also predicts the runs' models left out better
    result, _ = checked_cache(result, [], lambda: (fit(obs, fit_step_overhead=fit_step_overhead, weight_row_term=False,
                                                       cache_bytes=(0.0,)), []),
                              samples, fit_step_overhead=fit_step_overhead)
    # the device of the runs (one device; a dtype picks the unidentified FLOP/s: the first run's)
    result.machine = next(iter(machines))
    if result.machine.kind == "cpu" and len(threads) == 1:  # runs with one thread count: the fit is of such runs
        result.threads = next(iter(threads))
    # each stored configuration is one measurement: the bootstrap draws configurations only
    result.replicates = bootstrap_coefficients(result, samples, [], fit_step_overhead=fit_step_overhead)
    keep_held_out(result, samples, [], fit_step_overhead=fit_step_overhead)
    return result, used, skipped

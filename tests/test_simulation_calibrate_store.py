"""Calibration from stored runs, the cache and weight-repacking terms of the fit and cost model."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

import perfsdk
from perfsdk.hardware.profile import HardwareProfile
from perfsdk.capture.ops import OpRecord
from perfsdk.simulation.calibration import (
    Measurement,
    Observation,
    calibrate_from_store,
    fit,
    measurements_of_run,
    model_config_of_run,
    profile_from_fit,
)
from perfsdk.simulation.costmodel import cost_op
from perfsdk.cli.simulate import calibrate_command
from perfsdk.simulation.predictor import simulate_model
from perfsdk.models.arch import architecture_from_config


def _cpu(**kw: object) -> HardwareProfile:
    base = dict(name="t", kind="cpu", variant="test", source="test", memory_bandwidth_gbs=10.0,
                memory_pj_per_bit=0.0, memory_capacity_gb=64.0, peak_tflops={"fp32": 1.0}, compute_pj_per_flop=0.0)
    base.update(kw)
    return HardwareProfile(**base)  # type: ignore[arg-type]


def _linear(rows: int, k: int = 1000, n: int = 1000) -> OpRecord:
    w = k * n * 4
    return OpRecord(module_path="l", op="linear", category="matmul", phase="decode", step=1, dtype="float32",
                    input_shapes=[(rows, k)], output_shape=(rows, n), flops=2 * rows * k * n, macs=rows * k * n,
                    weight_bytes=w, bytes_read=w + rows * k * 4, bytes_written=rows * n * 4, elements=rows * n)


def test_cache_share_and_repacking_by_hand() -> None:
    prof = _cpu(cache_mb=10.0, cache_bandwidth_gbs=100.0, matmul_pack_rows=4, matmul_pack_gbs=20.0)
    op = _linear(1)
    nbytes = op.bytes_read + op.bytes_written
    # the pass touches 20 MB: half of its bytes come from the 10 MB cache
    c = cost_op(op, prof, resident_bytes=20e6)
    assert c.memory_s == pytest.approx(0.5 * nbytes / 10e9 + 0.5 * nbytes / 100e9)
    assert c.pack_s == 0.0  # one row: matrix-vector path, no repacking
    # everything fits: all bytes at the cache rate; no resident size given: memory rate
    assert cost_op(op, prof, resident_bytes=5e6).memory_s == pytest.approx(nbytes / 100e9)
    assert cost_op(op, prof).memory_s == pytest.approx(nbytes / 10e9)
    c4 = cost_op(_linear(4), prof, resident_bytes=20e6)
    assert c4.pack_s == pytest.approx(4e6 / 20e9)
    assert c4.time_s == pytest.approx(max(c4.compute_s, c4.memory_s) + c4.pack_s)


def _cache_observations(truth: np.ndarray, cache: float) -> list[Observation]:
    """Sixteen synthetic phases timed by ``truth`` with a cache of ``cache`` bytes and repacking from 4 rows."""
    rng = np.random.default_rng(1)
    obs = []
    for i in range(16):
        n = int(rng.integers(20, 60))
        rows = rng.choice([1.0, 2.0, 8.0, np.inf], n)
        wb = np.where(np.isfinite(rows), rng.uniform(1e5, 4e6, n), 0.0)
        o = Observation(f"o{i}", "prefill" if i % 2 else "decode", 1.0, rng.uniform(1e5, 1e9, n),
                        rng.uniform(1e4, 1e7, n) + wb, np.ones(n), float(rng.integers(1, 5)), rows=rows,
                        resident=np.full(n, rng.choice([4e6, 16e6, 32e6, 64e6])), weight_bytes=wb)
        o.measured_s = o.predict(truth, 0.0, cache, 4.0)
        obs.append(o)
    return obs


def test_fit_recovers_cache_and_repacking_terms() -> None:
    truth = np.array([1e-11, 2e-10, 3e-5, 1e-3, 2e-3, 5e-11, 4e-11])
    obs = _cache_observations(truth, 16e6)
    res = fit(obs, half_rows=(0.0,), cache_bytes=(0.0, 16e6, 48e6), pack_rows=(0.0, 2.0, 4.0))
    assert res.cache_bytes == 16e6 and res.pack_rows == 4.0
    got = np.array([res.coefficients[k] for k in ("s_per_flop", "s_per_byte", "op_overhead_s", "step_overhead_s",
                                                  "prefill_overhead_s", "s_per_cached_byte", "s_per_packed_byte")])
    assert got == pytest.approx(truth, rel=1e-5)
    prof = profile_from_fit(res, name="fitted")
    assert prof.cache_mb == pytest.approx(16.0) and prof.cache_bandwidth_gbs == pytest.approx(20.0)
    assert prof.matmul_pack_rows == 4 and prof.matmul_pack_gbs == pytest.approx(25.0)


def test_measurements_from_request_rows() -> None:
    class Run:
        run_id, name, model, workload, collectors = "r", "n", None, None, {}

    rows = [  # two calls of batch 2 (one request stopped early), one of batch 1
        {"step": 0, "request": 0, "input_tokens": 8, "output_tokens": 5, "ttft_s": 0.010, "tpot_s": 0.002, "e2e_s": 0.018},
        {"step": 0, "request": 1, "input_tokens": 6, "output_tokens": 3, "ttft_s": 0.010, "tpot_s": 0.002, "e2e_s": 0.014},
        {"step": 1, "request": 0, "input_tokens": 8, "output_tokens": 5, "ttft_s": 0.012, "tpot_s": 0.003, "e2e_s": 0.024},
        {"step": 1, "request": 1, "input_tokens": 8, "output_tokens": 5, "ttft_s": 0.012, "tpot_s": 0.003, "e2e_s": 0.024},
        {"step": 2, "request": 0, "input_tokens": 4, "output_tokens": 1, "ttft_s": 0.005, "tpot_s": None, "e2e_s": 0.005},
    ]
    ms = measurements_of_run(Run(), rows)
    got = {(m.batch_size, m.input_tokens, m.output_tokens): m for m in ms}
    assert set(got) == {(2, 8, 5), (1, 4, 1)}
    assert got[(2, 8, 5)].ttft_s == pytest.approx(0.011) and got[(2, 8, 5)].decode_s == pytest.approx(0.010)
    assert got[(2, 8, 5)].repeats == 2 and got[(1, 4, 1)].tpot_s is None


def _measured_runs(store: Path) -> list[str]:
    """Two stored runs on small built-in configurations, several batch sizes and prompt lengths each."""
    from transformers import AutoModelForCausalLM

    from perfsdk.models.tiny import tiny_llama_config

    torch.set_num_threads(1)
    shapes = [(1, 16), (2, 32), (4, 16), (1, 64)]
    ids = []
    # no energy/utilization: CodeCarbon's start-up is not needed to fit timings
    only_latency = {"energy": False, "utilization": False}
    cfg_small = {"name": "cal-small", "model": {"id": "builtin:tiny-llama-small", "dtype": "float32", "device": "cpu"},
                 "collectors": only_latency, "exporters": []}
    adopted_cfg = tiny_llama_config("tiny-llama")
    torch.manual_seed(0)
    adopted = AutoModelForCausalLM.from_config(adopted_cfg, dtype=torch.float32).eval()
    for cfg, model in ((cfg_small, None), ({"name": "cal-adopted", "collectors": only_latency, "exporters": []},
                                          adopted)):
        with perfsdk.session(cfg, store=str(store)) as s:
            m, _ = s.load(model=model) if model is not None else s.load()
            g = torch.Generator().manual_seed(0)
            kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
            with s.warmup():
                x = torch.randint(4, 256, (1, 8), generator=g)
                s.generate(m, input_ids=x, attention_mask=torch.ones_like(x), **kw)
            for _ in range(2):
                for b, n in shapes:
                    x = torch.randint(4, 256, (b, n), generator=g)
                    s.generate(m, input_ids=x, attention_mask=torch.ones_like(x), **kw)
        ids.append(s.run_id)
    return ids


def test_calibrate_from_store_predicts_its_runs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ids = _measured_runs(store)
    result, used, skipped = calibrate_from_store(str(store))
    assert not skipped and len(used) == 8  # 4 shapes x 2 runs, repeats combined by the median
    assert {(m.batch_size, m.input_tokens, m.output_tokens) for m in used} == {(1, 16, 6), (2, 32, 6), (4, 16, 6),
                                                                              (1, 64, 6)}
    prof = profile_from_fit(result, name="from-store")
    # what the intervals are drawn from: bootstrap refits over the stored configurations, and each
    # of the two models' four configurations predicted by a fit on the other model's
    assert prof.calibration is not None and len(prof.calibration.replicates) == 40
    assert len(prof.calibration.held_out) == 8 and prof.calibration.levels == []
    # the runs all used one torch thread: the fit is of such runs, and says so
    from perfsdk.models.tiny import tiny_llama_config

    assert prof.calibration.threads == 1
    assert f"calibrated on {prof.calibration.host} with 1 torch thread, " in (simulate_model(
        architecture_from_config(tiny_llama_config("tiny-llama-small")), prof, batch_size=1, input_tokens=8,
        output_tokens=2, dtype="float32").origin_detail or "")
    # the fitted profile predicts the runs it was fitted on: tolerance for timing on a shared
    # machine: the median error within 40%, and every TTFT and TPOT within a factor of 2 but
    # for at most two (the robust fit leaves a measurement disturbed by other load out, rather
    # than bending every coefficient towards it)
    errs, outside = [], []
    for m in used:
        name = "tiny-llama-small" if m.model == "builtin:tiny-llama-small" else "tiny-llama"
        shape = architecture_from_config(tiny_llama_config(name))
        p = simulate_model(shape, prof, batch_size=m.batch_size, input_tokens=m.input_tokens,
                           output_tokens=m.output_tokens, dtype="float32")
        assert m.tpot_s is not None and p.tpot_s is not None
        for pred, meas in ((p.ttft_s, m.ttft_s), (p.tpot_s, m.tpot_s)):
            if not 0.5 * meas <= pred <= 2.0 * meas:
                outside.append((m, pred, meas))
            errs.append(abs(pred - meas) / meas)
    assert len(outside) <= 2, outside
    assert statistics.median(errs) <= 0.40

    # the command: one run only, YAML written and loadable as a profile
    out = tmp_path / "host.yaml"
    r = CliRunner().invoke(calibrate_command, ["--from-store", str(store), "--run", ids[0], "-o", str(out),
                                               "--name", "my-host"])
    assert r.exit_code == 0, r.output
    prof2 = HardwareProfile.model_validate(yaml.safe_load(out.read_text(encoding="utf-8")))
    assert prof2.name == "my-host" and "Stored runs" in prof2.source and ids[0] in prof2.source
    assert "using builtin:tiny-llama-small batch 4 in 16 out 6" in r.output
    assert re.search(r"uncertainty: \d+ bootstrap refits over configurations and passes; no model could be left out "
                     r"of the fit \(one model measured\): its predictions carry no interval; no reference workload "
                     r"was timed \(stored runs\): no term for the machine's drift", r.output), r.output
    # one model: nothing held out, so its predictions carry no interval and say why
    assert prof2.calibration is not None and prof2.calibration.held_out == []
    p2 = simulate_model(architecture_from_config(tiny_llama_config("tiny-llama-small")), prof2, batch_size=1,
                        input_tokens=16, output_tokens=6, dtype="float32")
    assert p2.origin == "calibrated" and p2.ttft_s_low is None
    assert p2.interval_note == ("no interval: the calibration of my-host predicted no model it was not fitted on "
                                "(it needs measurements of at least two models), so it cannot say how far it "
                                "misses one")


H200_STORE = Path(__file__).parent / "data" / "h200-store"


def test_calibrate_from_runs_stored_on_a_gpu_describes_that_gpu(tmp_path: Path) -> None:
    """Runs recorded on an H200 (benchmarks/gpu_check.sh, 2026-11-26): two bf16 runs of a 0.74 B
    Llama shape and a bitsandbytes 4-bit one. The profile describes the H200 those runs measured,
    not the machine that fits it."""
    import shutil

    from perfsdk.hardware import get_profile
    from perfsdk.store import Store

    store = tmp_path / "store"
    shutil.copytree(H200_STORE, store)
    result, used, skipped = calibrate_from_store(str(store))
    assert skipped == ["20261126T043854-0fbf2e19a1c5: bnb-4bit model (the cost model describes dense kernels)"]
    assert {(m.batch_size, m.input_tokens, m.output_tokens) for m in used} == {(8, 35, 32), (8, 405, 32)}
    m = result.machine
    assert (m.kind, m.device, m.host_cpu, m.base, m.dtype) == ("gpu", "NVIDIA H200", "Intel(R) Xeon(R) Processor",
                                                               "h200", "bfloat16")
    prof = profile_from_fit(result, name="h200-here")
    assert prof.kind == "gpu" and prof.variant == "NVIDIA H200 (host Intel(R) Xeon(R) Processor), fitted rates"
    assert prof.calibration is not None and prof.calibration.host == "NVIDIA H200 (host Intel(R) Xeon(R) Processor)"
    assert prof.calibration.threads is None  # a GPU's times do not hang on the host's torch threads
    # what timings cannot measure comes from the catalogue's h200, not from host-cpu or this machine's RAM
    h200 = get_profile("h200")
    assert (prof.memory_capacity_gb, prof.host_to_device_gbs, prof.static_power_w) == (141.0, 64.0, 90.0)
    if result.flops_per_s is None:  # FLOP/s are not identifiable from host-bound decode steps
        assert prof.peak_flops("bfloat16") == pytest.approx(h200.effective_flops("bfloat16"))
        assert prof.peak_flops("float32") == pytest.approx(h200.effective_flops("float32"))
        assert "kept from h200: FLOP/s" in prof.source
    # the fitted per-op overhead is the host-bound floor these runs showed: microseconds, not the
    # spec sheet's 5 us, and the prediction of their decode step is no longer a tenth of it
    shape = architecture_from_config(model_config_of_run(Store(str(store)).get("20261126T045438-5454fddf835a")))
    p = simulate_model(shape, prof, batch_size=8, input_tokens=35, output_tokens=32, dtype="bfloat16")
    spec = simulate_model(shape, h200, batch_size=8, input_tokens=35, output_tokens=32, dtype="bfloat16")
    assert spec.tpot_s is not None and spec.tpot_s < 2e-3
    assert p.tpot_s is not None and 8e-3 < p.tpot_s < 20e-3  # measured TPOT p50: 12.43-16.71 ms

    # a run of another device in the same store: refused, naming both
    with perfsdk.session({"name": "cpu-run", "model": {"id": "builtin:tiny-llama-small", "device": "cpu"},
                          "collectors": {"energy": False, "utilization": False}, "exporters": []},
                         store=str(store)) as s:
        mdl, _ = s.load()
        x = torch.ones(1, 4, dtype=torch.long)
        s.generate(mdl, input_ids=x, attention_mask=x, max_new_tokens=3, min_new_tokens=3)
    with pytest.raises(ValueError, match=r"the runs were measured on different devices \(NVIDIA H200 \(host "
                                         r"Intel\(R\) Xeon\(R\) Processor\) in bfloat16: 20261126T045409"):
        calibrate_from_store(str(store))
    r = CliRunner().invoke(calibrate_command, ["--from-store", str(store)])
    assert r.exit_code == 2 and "choose its runs with --run" in r.output
    r = CliRunner().invoke(calibrate_command, ["--from-store", str(store), "--run", s.run_id])
    assert r.exit_code == 2 and "at least 3 needed" in r.output  # one 1-step run is too little to fit


def test_calibrate_from_store_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(calibrate_command, ["--from-store", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no runs" in r.output
    r = CliRunner().invoke(calibrate_command, ["--run", "x"])
    assert r.exit_code == 2 and "--from-store" in r.output


def test_measurement_tpot() -> None:
    m = Measurement(model="m", batch_size=1, input_tokens=4, output_tokens=5, ttft_s=0.1, decode_s=0.4, repeats=1)
    assert m.tpot_s == pytest.approx(0.1)


def _small_run(store: Path, *sets: str) -> str:
    """``perfsdk run`` of the default model on 4 prompts, 4 new tokens, latency only, with ``sets``;
    returns the stored run's id."""
    from perfsdk.cli import cli

    args = ["run", "--store", str(store), "--quiet"]
    for item in ("workload.num_prompts=4", "workload.generate.max_new_tokens=4", "workload.generate.min_new_tokens=4",
                 "workload.warmup_runs=1", "workload.min_iterations=1", "collectors.energy=false",
                 "collectors.utilization=false", "exporters=[]", *sets):
        args += ["--set", item]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return r.output.strip().splitlines()[-1]


def test_calibrate_from_runs_perfsdk_run_stored_without_their_requests_series(tmp_path: Path) -> None:
    """Runs stored by ``perfsdk run`` whose requests series is gone (older or trimmed runs): the
    latency summary (typed: p50, never a made-up key) still yields measurements and a fit."""
    import json

    from perfsdk.store import Store

    store = tmp_path / "st"
    for batch in (1, 2):
        rid = _small_run(store, f"workload.batching.batch_size={batch}")
        run = Store(str(store)).get(rid)
        with_series = measurements_of_run(run)
        assert with_series and {m.batch_size for m in with_series} == {batch}
        # drop the requests series the way an older run would lack it
        path = store / "runs" / rid / "result.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        (store / "runs" / rid / data["series"].pop("requests")).unlink()
        path.write_text(json.dumps(data), encoding="utf-8")
        run = Store(str(store)).get(rid)
        lat = run.collector_result("latency")
        (m,) = measurements_of_run(run)
        assert (m.batch_size, m.output_tokens) == (batch, 4)
        assert m.input_tokens == round(lat.input_tokens / lat.requests)
        assert m.ttft_s == pytest.approx(lat.ttft_s.p50) and m.tpot_s == pytest.approx(lat.tpot_s.p50)
    result, used, skipped = calibrate_from_store(str(store))
    assert sorted((u.batch_size, u.output_tokens) for u in used) == [(1, 4), (2, 4)] and not skipped


def test_runs_with_config_overrides_are_fitted_as_the_model_they_measured(tmp_path: Path) -> None:
    """A run of ``builtin:tiny-llama`` with ``model.config_overrides`` ran a 1- or 3-layer model:
    the fit rebuilds that model's operations, and the two depths are two models (each left out
    in turn when the calibration measures how far it misses a model)."""
    from perfsdk.simulation.calibration.from_store import model_label_of_run
    from perfsdk.store import Store

    store = tmp_path / "st"
    ids = []
    for layers in (1, 3):
        ids.append(_small_run(store, "workload.batching.batch_size=2", f"model.config_overrides.num_hidden_layers={layers}"))
    runs = [Store(str(store)).get(rid) for rid in ids]
    assert [model_config_of_run(run).num_hidden_layers for run in runs] == [1, 3]
    assert [model_label_of_run(run) for run in runs] == ["builtin:tiny-llama{num_hidden_layers=1}",
                                                         "builtin:tiny-llama{num_hidden_layers=3}"]
    assert {m.model for m in measurements_of_run(runs[0])} == {"builtin:tiny-llama{num_hidden_layers=1}"}
    result, used, skipped = calibrate_from_store(str(store))
    assert not skipped
    assert {m.model for m in used} == {"builtin:tiny-llama{num_hidden_layers=1}",
                                       "builtin:tiny-llama{num_hidden_layers=3}"}
    # every measured configuration predicted by a fit on the other depth alone
    assert len(used) >= 2 and len(result.held_out) == len(used)


def test_a_cache_is_kept_only_where_it_also_predicts_the_models_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from perfsdk.simulation.calibration import ConfigurationSamples, keep_cache

    fitmod = sys.modules["perfsdk.simulation.calibration.fit"]  # the package's `fit` is the function

    truth = np.array([1e-11, 2e-10, 3e-5, 1e-3, 2e-3, 5e-11, 4e-11])
    obs = _cache_observations(truth, 16e6)
    # four "models" of two configurations, each a decode and a prefill
    configs = [ConfigurationSamples(model=f"m{i // 4}", observations=[obs[i], obs[i + 1]],
                                    per_pass=[[obs[i].measured_s], [obs[i + 1].measured_s]])
               for i in range(0, 16, 2)]
    kw = dict(half_rows=(0.0,), pack_rows=(4.0,))
    cached = fit(obs, cache_bytes=(0.0, 16e6), **kw)
    plain = fit(obs, cache_bytes=(0.0,), **kw)
    assert cached.cache_bytes == 16e6 and plain.cache_bytes == 0.0
    # a machine that has the cache: the fit with it predicts the left-out models far better, kept
    keep, note = keep_cache(cached, plain, configs, [], [])
    assert keep
    m = re.fullmatch(r"a 16 MB cache kept: it predicts the models left out of the fit with (\d+\.\d) % rms error, "
                     r"(\d+\.\d) % without", note)
    assert m is not None, note
    assert float(m.group(1)) < 0.1 < float(m.group(2))
    # what a calibration calls: the kept fit comes back with the note; a fit without a cache
    # comes back as it is, without refitting
    from perfsdk.simulation.calibration.fit import checked_cache

    got, fixed = checked_cache(cached, [], lambda: (plain, []), configs)
    assert got is cached and got.cache_note == note and fixed == []

    def no_refit() -> tuple[object, list]:
        raise AssertionError("refitted a fit without a cache")

    assert checked_cache(plain, [], no_refit, configs) == (plain, [])

    # held-out errors of 10 % with the cache against 5 % without: dropped, and said why
    def fake_held_out(result: object, *a: object, **k: object) -> list[list[float]]:
        return [[0.1, -0.1]] if getattr(result, "cache_bytes") else [[0.05, -0.05]]

    monkeypatch.setattr(fitmod, "held_out_errors", fake_held_out)
    keep, note = keep_cache(cached, plain, configs, [], [])
    assert not keep
    assert note == ("no cache: a 16 MB cache fitted the calibration better, but predicts the models left out of the "
                    "fit with 10.0 % rms error against 5.0 % without")
    got, _ = checked_cache(cached, [], lambda: (plain, []), configs)
    assert got is plain and got.cache_note == note
    # better, but by less than a fifth of the squared error: not enough to keep it either
    monkeypatch.setattr(fitmod, "held_out_errors",
                        lambda result, *a, **k: [[0.095, 0.095]] if result.cache_bytes else [[0.1, 0.1]])
    assert keep_cache(cached, plain, configs, [], [])[0] is False

"""The simulate, hardware and calibrate commands, through click's CliRunner."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from perfsdk.hardware.profile import SmallMGaps
from perfsdk.simulation.calibration import Observation, fit, profile_from_fit
from perfsdk.cli.simulate import calibrate_command, hardware_group, simulate_command

KEYS = {"ttft_s", "tpot_s", "output_tokens_per_s", "energy_j_per_output_token", "fits_in_memory", "phases", "layers"}


def test_hardware_list_json() -> None:
    r = CliRunner().invoke(hardware_group, ["list", "--json"])
    assert r.exit_code == 0, r.output
    names = {row["name"] for row in json.loads(r.output)}
    assert names == {"a100-80gb-sxm", "h100-sxm", "h100-pcie", "h200", "l4", "host-cpu", "pim-ai-chip", "pim-ai-dimm"}


def test_hardware_show_json_and_unknown() -> None:
    r = CliRunner().invoke(hardware_group, ["show", "h100-sxm", "--json"])
    assert r.exit_code == 0
    data = json.loads(r.output)
    assert data["memory_bandwidth_gbs"] == 3350 and "H100" in data["source"]
    r = CliRunner().invoke(hardware_group, ["show", "nope"])
    assert r.exit_code == 2 and "unknown hardware profile 'nope'" in r.output


def test_hardware_file_bad_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\nkind: cpu\nvariant: v\nsource: s\nmemory_bandwidth_gbs: -1\nmemory_pj_per_bit: 1\n"
                 "memory_capacity_gb: 1\npeak_tflops: {fp32: 1}\ncompute_pj_per_flop: 1\n")
    r = CliRunner().invoke(hardware_group, ["show", "x", "--hardware-file", str(f)])
    assert r.exit_code == 2
    assert str(f) in r.output and "memory_bandwidth_gbs" in r.output


def test_simulate_json_7b_h100() -> None:
    r = CliRunner().invoke(simulate_command, ["--model", "llama-2-7b", "--hardware", "h100-sxm", "--batch-size", "2",
                                              "--input-tokens", "64", "--output-tokens", "16", "--json", "--top", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert KEYS <= set(d)
    assert set(d["phases"]) == {"prefill", "decode"}
    assert {"time_s", "energy_j", "avg_power_w"} <= set(d["phases"]["decode"])
    assert d["batch_size"] == 2 and d["output_tokens"] == 16
    assert d["phases"]["decode"]["bound"] == "memory"
    assert len(d["layers"]) == 6 and {"name", "phase", "time_s", "bound"} <= set(d["layers"][0])


def test_simulate_pim_mapping_and_user_profile(tmp_path: Path) -> None:
    prof = yaml.safe_load(CliRunner().invoke(hardware_group, ["show", "h100-sxm"]).output)
    prof.update(name="my-gpu", memory_bandwidth_gbs=1000)
    pf = tmp_path / "my.yaml"
    pf.write_text(yaml.safe_dump(prof))
    mf = tmp_path / "map.yaml"
    mf.write_text("devices: {gpu: my-gpu, pim0: pim-ai-dimm}\ndefault: gpu\n"
                  "layers:\n  - {match: 'model.layers.*.mlp.*', device: pim0, transfer: t}\n")
    args = ["--model", "llama-2-7b", "--hardware", "my-gpu", "--hardware-file", str(pf), "--output-tokens", "8",
            "--input-tokens", "32", "--json"]
    plain = json.loads(CliRunner().invoke(simulate_command, args).output)
    r = CliRunner().invoke(simulate_command, [*args, "--mapping", str(mf), "--top", "50"])
    assert r.exit_code == 0, r.output
    mapped = json.loads(r.output)
    assert {d["name"] for d in mapped["devices"]} == {"gpu", "pim0"}
    assert mapped["phases"]["decode"]["transfer_s"] > 0 and plain["phases"]["decode"]["transfer_s"] == 0
    mlp = [l for l in mapped["layers"] if ".mlp." in l["name"]]
    assert mlp and all(l["device"] == "pim0" for l in mlp)
    # MLP weights moved to the PIM device with 6.5 TB/s: decode gets faster than on the 1 TB/s GPU alone
    assert mapped["tpot_s"] < plain["tpot_s"]


def test_simulate_errors() -> None:
    r = CliRunner().invoke(simulate_command, ["--model", "no-such-model", "--json"])
    assert r.exit_code == 2 and "no-such-model" in r.output
    r = CliRunner().invoke(simulate_command, ["--model", "llama-2-7b", "--hardware", "pim-ai-dimm", "--dtype", "float32"])
    assert r.exit_code == 2 and "no peak_tflops for fp32" in r.output


def test_simulate_human_output() -> None:
    r = CliRunner().invoke(simulate_command, ["--model", "builtin:tiny-llama", "--hardware", "l4", "--output-tokens", "4"])
    assert r.exit_code == 0, r.output
    assert "TTFT" in r.output and "top layers by time" in r.output


def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(0)
    truth = np.array([1e-11, 2e-10, 3e-5, 1e-3, 2e-3])
    obs = []
    for i in range(12):
        n = int(rng.integers(20, 60))
        flops = rng.uniform(1e5, 1e8, n)
        bytes_ = rng.uniform(1e4, 1e7, n)
        o = Observation(f"o{i}", "prefill" if i % 2 else "decode", 1.0, flops, bytes_, np.ones(n), float(rng.integers(1, 5)))
        o.measured_s = o.predict(truth)
        obs.append(o)
    res = fit(obs)
    got = np.array([res.coefficients[k] for k in ("s_per_flop", "s_per_byte", "op_overhead_s", "step_overhead_s", "prefill_overhead_s")])
    assert got == pytest.approx(truth, rel=1e-6)
    assert max(abs(e) for e in res.errors_pct.values()) < 1e-6
    prof = profile_from_fit(res, name="fitted")
    assert prof.kind == "cpu" and prof.peak_flops("float32") == pytest.approx(1e11)
    assert prof.memory_bandwidth_gbs == pytest.approx(5.0)
    assert prof.op_overhead_s == pytest.approx(3e-5) and prof.step_overhead_s == pytest.approx(1e-3)
    assert prof.prefill_overhead_s == pytest.approx(2e-3)


def test_calibrate_command_writes_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.simulation.calibration.measure as cal

    monkeypatch.setattr(cal, "DEFAULT_CALIBRATION_GRID", [(1, 8, 3), (2, 16, 3)])
    out = tmp_path / "host.yaml"
    r = CliRunner().invoke(calibrate_command, ["--model", "builtin:tiny-llama-small", "--model",
                                               "builtin:tiny-llama-small@layers=1", "--repeats", "1",
                                               "--threads", "1", "--passes", "3", "--max-passes", "3", "-o",
                                               str(out), "--name", "my-host"])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(hardware_group, ["show", "my-host", "--hardware-file", str(out), "--json"])
    assert r2.exit_code == 0, r2.output
    d = json.loads(r2.output)
    assert d["kind"] == "cpu" and d["memory_bandwidth_gbs"] > 0 and "perfsdk calibrate" in d["source"]
    # the three passes asked for: how far they were apart is said on stderr and kept in the profile's source
    assert re.search(r"passes: the same configurations ran \d+\.\d % slower in the slowest pass than in the fastest",
                     r.stderr)
    assert re.search(r"ran \d+\.\d % slower in the calibration's slowest pass than in its fastest", d["source"])
    # timed in sessions around the reference workload: both drifts said, and what the intervals need kept
    tracking = re.search(r"; \d+\.\d % once each was divided by the reference workload timed around it \(to the power "
                         r"(\d\.\d\d): how closely the passes followed it\)", r.stderr)
    assert tracking is not None, r.stderr
    assert re.search(r"uncertainty: 40 bootstrap refits over configurations and passes; 4 configurations predicted "
                     r"with their model \(another family: all of it\) left out of the fit, median \|error\| \d+\.\d %; "
                     r"the machine's level \(the reference timed around\) at \d+ timings", r.stderr)
    # the cost per stored weight row is measured by the micro-kernel pair, said, and held in the profile
    row = re.search(r"measured, not fitted: (\d+\.\d) ns per stored weight row", r.stderr)
    assert row is not None, r.stderr
    assert (d["matmul_ns_per_weight_row"] or 0.0) == pytest.approx(float(row.group(1)), abs=0.051)
    cal = d["calibration"]
    assert len(cal["replicates"]) == 40 and len(cal["held_out"]) == 4
    # the fixed cost of a forward pass: the decode steps' time outside the model's forward, said and held
    step = re.search(r"measured, not fitted: (\d+\.\d{3}) ms per forward pass outside the model's forward", r.stderr)
    assert step is not None, r.stderr
    assert d["step_overhead_s"] * 1e3 == pytest.approx(float(step.group(1)), abs=0.0006)
    at_step = cal["params"].index("step_overhead_s")
    assert {r[at_step] for r in cal["replicates"]} == {cal["coefficients"][at_step]}
    # the layout ladder: said, kept in the record, and each product's h made of it
    lay = re.search(r"layouts: small-M slowdown \(rows \+ h\) / rows by inner size K = 256, 384, 512, 768, 1024 \(the "
                    r"layout ladder, products of 16-48 rows\): h ((?:\d+\.\d ?){5}) over a weight stored \[out, in\] "
                    r"\(a linear layer\), ((?:\d+\.\d ?){5}) over one stored \[in, out\] \(a Conv1D\); fitted h "
                    r"(\d+\.\d)$", r.stderr, re.M)
    no_h = "layouts: products of 16-48 rows measured at inner sizes 256, 384, 512, 768, 1024; no small-M slowdown " \
           "fitted, so every product is priced alike"
    gaps = cal["small_m_gaps"]
    assert gaps["inner"] == [256.0, 384.0, 512.0, 768.0, 1024.0]
    if d.get("matmul_half_rows"):  # the show command leaves unset fields out
        assert lay is not None, r.stderr
        assert d["matmul_small_m_gaps"] == gaps and float(lay.group(3)) == pytest.approx(d["matmul_half_rows"],
                                                                                        abs=0.051)
        # each size's h as the cost model takes it: the fitted h's share (with the ladder's anchor), or h less the gap
        table = SmallMGaps.model_validate(gaps)
        h = d["matmul_half_rows"]
        for said, in_out in ((lay.group(1), False), (lay.group(2), True)):
            expected = [table.half_rows(h, k, in_out) for k in table.inner]
            assert [float(v) for v in said.split()] == pytest.approx(expected, abs=0.051)
            if table.anchor is not None:
                assert expected == pytest.approx([h * min(1.0, max(0.0, 1 - g / table.anchor))
                                                  for g in gaps["in_out" if in_out else "out_in"]])
    else:
        assert d.get("matmul_small_m_gaps") is None and no_h in r.stderr
    # every bootstrap refit kept it
    at = cal["params"].index("s_per_weight_row")
    assert {r[at] for r in cal["replicates"]} == {cal["coefficients"][at]}
    assert cal["reference"] == "builtin:tiny-llama-medium@layers=2 batch 1 in 16 out 8" and cal["reference_s"] > 0
    # two models x two shapes in three passes, and the micro-kernels before the first pass and
    # after each: a machine level around each of the 12 + 4 timings
    assert len(cal["levels"]) == 16 and cal["normalised_drift_pct"] is not None and cal["passes"] == 3
    # one run's scatter: the 4 configurations' TTFT and decode in each of the 3 passes over their
    # median, so each configuration and phase has one pass exactly at 1
    scatter = cal["run_scatter"]
    assert len(scatter) == 24 and sum(x == 1.0 for x in scatter) >= 8 and all(x > 0 for x in scatter)
    from perfsdk.stats import percentile

    rel = sorted(scatter)
    assert (f"one run on the raw clock (each configuration's passes over their median, 24 times) strayed "
            f"{percentile(rel, 5):.2f}–{percentile(rel, 95):.2f} times (5th–95th percentile), the level the "
            "intervals draw a run at") in " ".join(r.stderr.split())
    assert "(median over configurations; 3 passes)" in d["source"]
    # the exponent said is the one kept, between 0 (a reference the passes did not follow) and 1
    assert 0.0 <= cal["reference_tracking"] <= 1.0
    assert f"{cal['reference_tracking']:.2f}" == tracking.group(1)
    assert f"(to the power {tracking.group(1)}, the one the passes follow it with)" in d["source"]
    # the memory traffic's exponent and the rest's: said, and kept only where told apart
    apart = re.search(r"memory traffic and the rest, how closely each followed the reference workload \(by each "
                      r"phase's share of memory traffic in this fit\): (not )?told apart: ([^\n]*)", r.stderr)
    assert apart is not None, r.stderr
    if apart.group(1):
        assert cal.get("memory_tracking") is None and cal.get("rest_tracking") is None
    else:
        assert 0.0 <= cal["memory_tracking"] <= 1.0 and 0.0 <= cal["rest_tracking"] <= 1.0
        assert apart.group(2).endswith("; --at-current-speed scales each by its own")
        assert (f"the memory traffic followed the reference workload to the power {cal['memory_tracking']:.2f}, the "
                f"rest to {cal['rest_tracking']:.2f}.") in d["source"]
    assert re.search(r"; the machine's level \(the reference timed around\) at 16 timings", r.stderr), r.stderr
    # what the seconds mean: the reference's median kept in the profile, and the spread of the level around it
    level = re.search(r"seconds: at this machine's speed while calibrating, the reference workload's median of "
                      r"(\d+\.\d\d) ms; the machine's level around the configurations stood at (\d\.\d\d)–(\d\.\d\d) "
                      r"times it \(10th–90th percentile\); a calibration at another moment states every time in "
                      r"proportion to its own median", r.stderr)
    assert level is not None, r.stderr
    assert level.group(1) == f"{cal['reference_s'] * 1e3:.2f}"
    assert 0.5 < float(level.group(2)) <= float(level.group(3)) < 2.0
    # the memory reference timed beside it: its median kept and said
    memory = re.search(r"memory reference \(one-row linear products over 8 fp32 \[2048, 2048\] weights, streamed\): "
                       r"its median (\d+\.\d\d) ms while calibrating", r.stderr)
    assert memory is not None, r.stderr
    assert cal["memory_reference"] == "one-row linear products over 8 fp32 [2048, 2048] weights, streamed"
    assert memory.group(1) == f"{cal['memory_reference_s'] * 1e3:.2f}"
    compute = re.search(r"compute reference \(a linear product of 128 rows over one fp32 \[2048, 1024\] weight, in "
                        r"cache\): its median (\d+\.\d\d) ms while calibrating", r.stderr)
    assert compute is not None, r.stderr
    assert compute.group(1) == f"{cal['compute_reference_s'] * 1e3:.2f}"
    # the repacking size the staircase gave, said with the staircase itself, and kept in the profile
    pack = re.search(r"^repacking: (?:none|from (\d+) rows) \(the staircase: (?:[+-]\d+\.\d\d, ){3}[+-]\d+\.\d\d "
                     r"one-row products' time more at 2, 3, 4, 8 rows; residual \d\.\d{3}", r.stderr, re.M)
    assert pack is not None, r.stderr
    assert float(pack.group(1) or 0) == float(d.get("matmul_pack_rows") or 0)


def test_calibrate_runs_six_passes_by_default_up_to_nine() -> None:
    # six round-robin passes, more up to nine while the median pass is not settled
    opts = {p.name: p for p in calibrate_command.params}
    assert opts["passes"].default == 6 and opts["max_passes"].default == 9
    r = CliRunner().invoke(calibrate_command, ["--help"])
    flat = " ".join(r.output.split())
    assert re.search(r"--passes INTEGER RANGE [^\[]*\[default: 6; x>=1\]", flat), r.output
    assert re.search(r"--max-passes INTEGER RANGE [^\[]*\[default: 9; x>=1\]", flat), r.output
    from perfsdk.simulation.calibration import calibrate_here

    assert inspect.signature(calibrate_here).parameters["passes"].default == 6


def test_simulate_kv_heads_and_sliding_window_overrides() -> None:
    args = ["--model", "llama-2-7b", "--hardware", "h100-sxm", "--input-tokens", "16", "--output-tokens", "4", "--json"]
    # KV cache = 2 (K and V) x 32 layers x KV heads x 128 head dim x 2 bytes (bf16) x context 16 + 4 - 1
    base = json.loads(CliRunner().invoke(simulate_command, args).output)
    assert base["devices"][0]["kv_cache_bytes"] == 2 * 32 * 32 * 128 * 2 * 19
    r = CliRunner().invoke(simulate_command, [*args, "--kv-heads", "8"])
    assert r.exit_code == 0, r.output
    gqa = json.loads(r.output)
    assert gqa["devices"][0]["kv_cache_bytes"] == 2 * 32 * 8 * 128 * 2 * 19
    assert gqa["notes"] == ["dtype bfloat16 (the config states none; --dtype to choose)",
                            "overrides: KV heads 8 (model: 32)"]
    assert gqa["tpot_s"] < base["tpot_s"]
    r = CliRunner().invoke(simulate_command, [*args, "--num-key-value-heads", "8", "--sliding-window", "8"])
    win = json.loads(r.output)
    assert win["devices"][0]["kv_cache_bytes"] == 2 * 32 * 8 * 128 * 2 * 8
    assert "attention window 8 (model: full)" in win["notes"][-1]
    r = CliRunner().invoke(simulate_command, [*args, "--kv-heads", "5"])
    assert r.exit_code == 2 and "num_key_value_heads 5 must divide the model's 32 attention heads" in r.output


def test_simulate_shows_efficiency() -> None:
    r = CliRunner().invoke(simulate_command, ["--model", "llama-2-7b", "--hardware", "pim-ai-dimm", "--input-tokens",
                                              "8", "--output-tokens", "2"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "compute eff." in r.output and "costed at peak (efficiency 1.0): pim-ai-dimm" in r.output
    r = CliRunner().invoke(simulate_command, ["--model", "llama-2-7b", "--hardware", "h100-sxm", "--json",
                                              "--input-tokens", "8", "--output-tokens", "2"])
    [dev] = json.loads(r.output)["devices"]
    assert dev["peak_assumed"] is False and 0 < dev["compute_efficiency"] < 1


def test_simulate_dtype_auto_follows_the_config_then_the_device(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096}
    plain = tmp_path / "plain" / "config.json"
    plain.parent.mkdir()
    plain.write_text(json.dumps(cfg), encoding="utf-8")
    stated = tmp_path / "stated" / "config.json"
    stated.parent.mkdir()
    stated.write_text(json.dumps({**cfg, "torch_dtype": "float16"}), encoding="utf-8")

    def run(model: Path, *extra: str) -> dict:
        r = CliRunner().invoke(simulate_command, ["--model", str(model), "--output-tokens", "4", "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    # no dtype in the config: float32 on a CPU (what PyTorch runs there, what calibrate measures)
    on_cpu = run(plain, "--hardware", "host-cpu")
    assert on_cpu["dtype"] == "float32"
    assert "dtype float32 (a cpu profile, the config states none; --dtype to choose)" in on_cpu["notes"]
    # ... bfloat16 on an accelerator; a dtype the config states wins on either
    assert run(plain, "--hardware", "h100-sxm")["dtype"] == "bfloat16"
    from_config = run(stated, "--hardware", "host-cpu")
    assert from_config["dtype"] == "float16" and not any(n.startswith("dtype ") for n in from_config["notes"])
    # an explicit --dtype is taken as given, without a note
    explicit = run(plain, "--hardware", "host-cpu", "--dtype", "bfloat16")
    assert explicit["dtype"] == "bfloat16" and not any(n.startswith("dtype ") for n in explicit["notes"])
    # float32 moves twice the weight bytes of bfloat16: the memory-bound decode is slower
    assert on_cpu["tpot_s"] > explicit["tpot_s"]

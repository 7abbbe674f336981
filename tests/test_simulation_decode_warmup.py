"""The first decode steps of a generate call run slower than the steady ones: measured on the
calibration's own per-step times, taken out of the decode the fit prices, and put back into a
prediction in proportion to the decode's length (``decode_warmup_steps``)."""

from __future__ import annotations

import pytest

from perfsdk.hardware.catalog import builtin_profiles
from perfsdk.hardware.profile import parse_profile, profile_to_yaml
from perfsdk.models.tiny import tiny_llama_config
from perfsdk.simulation.calibration import Measurement
from perfsdk.simulation.calibration.measure import (WARMUP_MIN_STEPS, decode_warmup_steps, measured_warmup,
                                                    steady_decode)
from perfsdk.simulation.costmodel import warmup_factor
from perfsdk.simulation.predictor import simulate_config

#: a decode of ten steps whose first three run 30, 20 and 10 % slower than the rest
RAMP = [1.3e-3, 1.2e-3, 1.1e-3] + [1.0e-3] * 7


def _m(steps: list[float] | None, out: int | None = None) -> Measurement:
    n = len(steps) if steps else 3
    return Measurement(model="m", batch_size=1, input_tokens=8, output_tokens=out or n + 1, ttft_s=5e-3,
                       decode_s=sum(steps) if steps else 3e-3, repeats=3, decode_steps_s=steps)


def test_the_warmup_is_what_the_steps_take_beyond_the_steady_step() -> None:
    assert decode_warmup_steps(_m(RAMP)) == pytest.approx(0.6)
    assert decode_warmup_steps(_m([1e-3] * 12)) == pytest.approx(0.0)
    # the steady step is the later half's median: one slow late step does not move it
    assert decode_warmup_steps(_m(RAMP[:-1] + [2e-3])) == pytest.approx(1.6)
    # too few steps to tell a steady step, or none recorded (a bare-loop measurement): no figure
    assert decode_warmup_steps(_m(RAMP[: WARMUP_MIN_STEPS - 1])) is None
    assert decode_warmup_steps(_m(None)) is None


def test_the_calibration_keeps_the_median_over_every_pass_and_never_a_negative_one() -> None:
    runs = [_m(RAMP), _m([x * 2 for x in RAMP]), _m([1.4e-3] + [1e-3] * 9), _m(RAMP[:4])]
    # 0.6, 0.6 (scale-free), 0.4; the four-step pass shows nothing
    assert measured_warmup(runs) == pytest.approx(0.6)
    assert measured_warmup([_m([0.9e-3] + [1e-3] * 9)]) == 0.0  # a faster first step is noise, not a warm-up
    assert measured_warmup([_m(None), _m(RAMP[:3])]) == 0.0


def test_a_decode_is_brought_to_the_steady_step_and_a_prediction_back_by_its_length() -> None:
    m = _m(RAMP)  # 10 steps, 10.6 steady steps' worth
    s = steady_decode(m, 0.6)
    assert s.decode_s == pytest.approx(10e-3)
    assert s.decode_steps_s == pytest.approx([x / 1.06 for x in RAMP])
    assert s.ttft_s == m.ttft_s and s.output_tokens == m.output_tokens
    assert steady_decode(m, 0.0) == m
    assert warmup_factor(0.6, 10) == pytest.approx(1.06)
    assert warmup_factor(0.6, 0) == 1.0 and warmup_factor(0.0, 5) == 1.0


def test_a_profile_with_a_warmup_predicts_a_slower_tpot_over_few_new_tokens() -> None:
    base = builtin_profiles()["host-cpu"]
    warm = base.model_copy(update={"decode_warmup_steps": 0.7})
    cfg = tiny_llama_config()
    for out in (8, 32):
        a = simulate_config(cfg, base, batch_size=1, input_tokens=32, output_tokens=out, dtype="float32", name="t")
        b = simulate_config(cfg, warm, batch_size=1, input_tokens=32, output_tokens=out, dtype="float32", name="t")
        assert b.tpot_s / a.tpot_s == pytest.approx(1 + 0.7 / (out - 1))  # type: ignore[operator]
        assert b.ttft_s == pytest.approx(a.ttft_s)
        extra = b.phases["decode"].time_s - a.phases["decode"].time_s
        assert b.phases["decode"].overhead_s - a.phases["decode"].overhead_s == pytest.approx(extra)
    # a profile file keeps it; one without the field has none
    again = parse_profile(__import__("yaml").safe_load(profile_to_yaml(warm)), "warm.yaml")
    assert again.decode_warmup_steps == 0.7 and base.decode_warmup_steps == 0.0


def test_calibrate_here_measures_the_warmup_and_fits_the_steady_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.simulation.calibration.measure as cal

    fitted: list[list] = []
    real = cal.fit_with_micro

    def spy(micro, measured, **kw):  # type: ignore[no-untyped-def]
        fitted.append(measured)
        return real(micro, measured, **kw)

    def measure(model, b, i, o, *, calls, label, seed, min_time_s):  # type: ignore[no-untyped-def]
        steady = 2e-4 * b
        steps = [steady * (1.3 if k == 0 else 1.2 if k == 1 else 1.0) for k in range(o - 1)]
        return Measurement(model=label, batch_size=b, input_tokens=i, output_tokens=o, ttft_s=1e-3 * b * i,
                           decode_s=sum(steps), repeats=calls, decode_steps_s=steps)

    monkeypatch.setattr(cal, "measure_in_session", measure)
    monkeypatch.setattr(cal, "fit_with_micro", spy)
    models = ["builtin:tiny-llama-small", "builtin:tiny-llama-small@layers=1"]
    res, meas = cal.calibrate_here(models, grid=[(1, 8, 11), (2, 16, 11)], passes=2, repeats=1, normalise=False,
                                   micro=False, replicates=2)
    assert res.decode_warmup_steps == pytest.approx(0.5)
    # what was measured is returned as measured; what was fitted is the steady decode
    assert meas[0].decode_s == pytest.approx(2e-4 * 10.5)
    decode = [ob for ob in fitted[0] if ob.phase == "decode"]
    assert len(decode) == 4
    assert sorted(ob.measured_s for ob in decode) == pytest.approx([2e-3, 2e-3, 4e-3, 4e-3])
    from perfsdk.simulation.calibration import profile_from_fit

    assert profile_from_fit(res).decode_warmup_steps == pytest.approx(0.5)

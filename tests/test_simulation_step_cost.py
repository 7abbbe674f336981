"""The fixed cost of a forward pass is measured, not fitted: a calibration times how long each
decode step spends outside the model's forward (hooks before and after it, in the same session
that times the step) and holds that in the fit, its bootstrap and its held-out refits."""

from __future__ import annotations

import statistics

import pytest

from perfsdk.simulation.calibration import Measurement
from perfsdk.simulation.calibration.measure import (build_random_model, measure_in_session, measured_step_cost,
                                                    median_of, scaled)
from perfsdk.simulation.costmodel import warmup_factor


def _m(outside: float | None, out: int = 11, decode: float = 1e-2) -> Measurement:
    return Measurement(model="m", batch_size=1, input_tokens=8, output_tokens=out, ttft_s=5e-3, decode_s=decode,
                       repeats=3, outside_step_s=outside)


def test_the_step_cost_is_the_median_outside_time_at_the_steady_step() -> None:
    runs = [_m(2e-4), _m(3e-4), _m(9e-4), _m(None), _m(1e-3, out=1)]
    # the run that did not time it and the one without a decode step say nothing
    assert measured_step_cost(runs) == pytest.approx(3e-4)
    # each brought to the steady step as its decode is: 0.5 warm-up steps over 10 steps
    assert measured_step_cost(runs, 0.5) == pytest.approx(3e-4 / warmup_factor(0.5, 10))
    assert measured_step_cost([_m(None)]) is None and measured_step_cost([]) is None
    # it follows a drift normalisation and the passes' median like the times beside it
    assert scaled(_m(2e-4), 1.5).outside_step_s == pytest.approx(3e-4)
    assert median_of([_m(2e-4), _m(5e-4), _m(3e-4)]).outside_step_s == pytest.approx(3e-4)
    assert median_of([_m(None), _m(None)]).outside_step_s is None
    assert _m(2e-4).merged(_m(3e-4)).outside_step_s == pytest.approx(2e-4)


def test_a_session_measurement_times_the_steps_outside_the_forward() -> None:
    import torch

    torch.manual_seed(0)
    model = build_random_model("builtin:tiny-llama-small@layers=1")
    m = measure_in_session(model, 2, 8, 6, calls=2, label="t")
    assert m.repeats == 2 and m.decode_steps_s is not None and len(m.decode_steps_s) == 5
    step = m.decode_s / 5
    assert m.outside_step_s is not None and 0.0 < m.outside_step_s < step
    # the hooks are gone afterwards
    assert not model._forward_hooks and not model._forward_pre_hooks
    # a single new token has no decode step to time
    assert measure_in_session(model, 1, 8, 1, calls=1, label="t").outside_step_s is None


def test_calibrate_here_holds_the_measured_step_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.simulation.calibration.measure as cal

    outside = {1: 2.0e-4, 2: 2.6e-4}

    def measure(model, b, i, o, *, calls, label, seed, min_time_s):  # type: ignore[no-untyped-def]
        # a step of 0.5 ms (+0.1 ms per row) at one layer, twice that at two, each pass 3 % slower than the last
        f = 1.0 + 0.03 * seed
        layers = 1 if "layers=1" in label else 2
        step = 3e-4 + layers * (2e-4 + 1e-4 * b)
        return Measurement(model=label, batch_size=b, input_tokens=i, output_tokens=o,
                           ttft_s=f * (1e-3 + layers * 1e-5 * b * i), decode_s=f * step * (o - 1), repeats=calls,
                           outside_step_s=f * outside[b])

    monkeypatch.setattr(cal, "measure_in_session", measure)
    models = ["builtin:tiny-llama-small", "builtin:tiny-llama-small@layers=1"]
    kw = dict(grid=[(1, 8, 3), (2, 16, 3), (1, 32, 3)], passes=3, repeats=1, normalise=False, micro=False,
              replicates=3)
    res, _ = cal.calibrate_here(models, **kw)
    # the median over every pass of every configuration: 2.0e-4 at batch 1, 2.6e-4 at batch 2, passes 0-6 % slower
    expected = statistics.median(outside[b] * (1.0 + 0.03 * p) for _ in models for b in (1, 2, 1) for p in range(3))
    assert res.held["step_overhead_s"] == pytest.approx(expected)
    assert res.coefficients["step_overhead_s"] == pytest.approx(expected)
    # every bootstrap refit kept it
    from perfsdk.simulation.calibration.fit import PARAMS

    at = PARAMS.index("step_overhead_s")
    assert len(res.replicates) == 3 and [r[at] for r in res.replicates] == pytest.approx([expected] * 3)
    # without it (or with the step cost left out of the fit) the fit sets the cost itself
    fitted, _ = cal.calibrate_here(models, measured_step=False, **kw)
    assert "step_overhead_s" not in fitted.held
    none, _ = cal.calibrate_here(models, fit_step_overhead=False, **kw)
    assert "step_overhead_s" not in none.held and none.coefficients["step_overhead_s"] == 0.0

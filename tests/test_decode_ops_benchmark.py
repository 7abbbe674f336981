"""benchmarks/decode_ops.py: each matrix product of a decode step is found by its weight's shape,
measured and priced under the same key."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_ops.py"


@pytest.fixture(scope="module")
def decode_ops():
    spec = importlib.util.spec_from_file_location("decode_ops", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_products_are_measured_and_priced_under_one_key_per_weight_shape(decode_ops):
    from perfsdk.hardware.catalog import get_profile
    from perfsdk.simulation.calibration import build_random_model

    torch.set_num_threads(1)
    model = build_random_model("builtin:tiny-llama-small")  # 2 layers, hidden 128, MLP 352, 2 of 4 heads for k/v
    measured = decode_ops.measured_steps(model, batch=2, prompt=8, steps=2, repeats=1)
    products = {k: calls for k, (_, calls) in measured.items() if k.startswith("mm ")}
    # a decode step: per layer q, o [128 -> 128], k, v [128 -> 64], gate, up [128 -> 352], down
    # [352 -> 128]; then the head [128 -> 4096]
    assert products == {"mm (128, 128)": 4.0, "mm (128, 64)": 4.0, "mm (128, 352)": 4.0,
                        "mm (352, 128)": 2.0, "mm (128, 4096)": 1.0}
    # each time is a difference of two timings (a generate of 3 new tokens less one of 1): with one
    # repeat its sign is the host's noise, only its being a number is certain
    assert all(math.isfinite(measured[k][0]) for k in products)
    priced = decode_ops.priced_products(model.config, get_profile("host-cpu"), batch=2, prompt=8)
    assert {k: len(v) for k, v in priced.items()} == {k: int(c) for k, c in products.items()}
    # the head streams the most bytes of any product: the cost model prices it dearest
    assert max(priced, key=lambda k: max(priced[k])) == "mm (128, 4096)"


def test_a_vocabulary_changes_only_the_output_layer_and_its_price(decode_ops):
    from perfsdk.hardware.catalog import get_profile
    from perfsdk.simulation.calibration import build_random_model

    model = build_random_model("builtin:tiny-llama-small")
    cfg = decode_ops.config_with_vocab(model, 1024)
    assert cfg.vocab_size == 1024 and model.config.vocab_size == 4096  # a copy: the model's own is kept
    small = decode_ops.with_vocab(model, 1024)
    assert tuple(small.lm_head.weight.shape) == (1024, 128)
    assert small.generation_config.eos_token_id is None  # decodes every step asked for
    profile = get_profile("host-cpu")
    big = decode_ops.priced_products(model.config, profile, batch=1, prompt=8)
    less = decode_ops.priced_products(cfg, profile, batch=1, prompt=8)
    # every product but the head is priced alike; the head is found under its new shape
    assert {k: v for k, v in big.items() if k != "mm (128, 4096)"} == {
        k: v for k, v in less.items() if k != "mm (128, 1024)"}
    assert max(big["mm (128, 4096)"]) > max(less["mm (128, 1024)"])


def test_head_rows_cost_times_both_vocabularies_at_each_batch(decode_ops):
    from perfsdk.simulation.calibration import build_random_model

    torch.set_num_threads(1)
    model = build_random_model("builtin:tiny-llama-small")
    steps = decode_ops.head_rows_cost(model, (2048, 512), [1, 2], prompt=4, steps=2, repeats=1)
    assert sorted(steps) == [1, 2]
    assert all(len(v) == 2 and min(v) > 0 for v in steps.values())


def test_the_whole_step_prints_the_prediction_the_rounds_and_the_products_sums(decode_ops, capsys):
    from perfsdk.hardware.catalog import get_profile
    from perfsdk.simulation.calibration import build_random_model
    from perfsdk.simulation.predictor import simulate_config

    torch.set_num_threads(1)
    model = build_random_model("builtin:tiny-llama-small")
    profile = get_profile("host-cpu")
    # hand-made timings: two priced products and a call that is not one, which the products' sum leaves out
    measured = {1: {"mm (128, 128)": (40e-6, 4.0), "addmm (128, 4096)": (100e-6, 1.0), "cat.default": (7e-6, 5.0)}}
    priced = {1: {"mm (128, 128)": [10e-6, 11e-6], "mm (128, 4096)": [30e-6]}}
    decode_ops.print_step(model, profile, measured, priced, [1], prompt=8, steps=2, repeats=3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("The whole step, µs:")
    row = lines[1]
    tpot = simulate_config(model.config, profile, batch_size=1, input_tokens=8, output_tokens=3,
                           dtype="float32").tpot_s
    assert row.startswith(f"  batch 1: predicted {tpot * 1e6:.0f}; session ")
    rounds = row.split("; session ")[1].split("; products")[0].split(", ")
    assert len(rounds) == 3 and all(float(r) > 0 for r in rounds)
    assert row.endswith("; products 140 / 51")

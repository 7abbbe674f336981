"""Quantization as a search space: bitsandbytes settings, float8, model-config overrides, and
recording the real quantization of a model the user adopted."""

from __future__ import annotations

from typing import Any

import pytest

import perfsdk
from perfsdk.config import ConfigError, ModelConfig
from perfsdk.models.info import describe_model, detect_quantization
from perfsdk.models.loader import bnb_config, check_model_config, load_model


def test_bnb_4bit_settings_reach_the_bitsandbytes_config() -> None:
    import torch

    c = bnb_config(ModelConfig(quantization="bnb-4bit", bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="bfloat16",
                               bnb_4bit_use_double_quant=True))
    assert (c.load_in_4bit, c.bnb_4bit_quant_type, c.bnb_4bit_compute_dtype, c.bnb_4bit_use_double_quant) == \
        (True, "fp4", torch.bfloat16, True)
    # defaults: nf4, computing in the model's dtype (float32 for auto)
    c = bnb_config(ModelConfig(quantization="bnb-4bit", dtype="float16"))
    assert (c.bnb_4bit_quant_type, c.bnb_4bit_compute_dtype) == ("nf4", torch.float16)
    assert bnb_config(ModelConfig(quantization="bnb-4bit", dtype="auto")).bnb_4bit_compute_dtype == torch.float32
    assert bnb_config(ModelConfig(quantization="bnb-8bit")).load_in_8bit is True
    with pytest.raises(ValueError, match="bnb_4bit_quant_type"):
        ModelConfig(bnb_4bit_quant_type="int4")


def test_config_overrides_change_the_built_model() -> None:
    model, _ = load_model(ModelConfig(id="builtin:tiny-llama-small", device="cpu",
                                      config_overrides={"num_hidden_layers": 1}))
    assert len(model.model.layers) == 1 and model.config.num_hidden_layers == 1
    assert describe_model(model).num_layers == 1
    with pytest.raises(ConfigError, match=r"^model\.config_overrides\.num_hidden_layer: not a field of LlamaConfig$"):
        load_model(ModelConfig(id="builtin:tiny-llama-small", device="cpu", config_overrides={"num_hidden_layer": 1}))


def test_float8_model_runs_and_is_recorded() -> None:
    import torch

    from perfsdk.models.float8 import float8_status

    ok, why = float8_status("cpu")
    if not ok:
        pytest.skip(why)
    cfg = ModelConfig(id="builtin:tiny-llama-small", device="cpu", dtype="float8_e4m3fn")
    model, tok = load_model(cfg)
    ref, _ = load_model(cfg.model_copy(update={"dtype": "float32"}))
    info = describe_model(model)
    # 2 layers x 7 linears + the LM head
    assert (info.quantization, info.quant_type, info.quantized_modules, info.dtype) == ("float8-e4m3fn", "e4m3fn", 15, "float32")
    # the float8 weights are buffers: counted by their shape, the model has as many parameters as before
    assert info.parameters == describe_model(ref).parameters == sum(p.numel() for p in ref.parameters())
    enc = tok(["the cache holds"], return_tensors="pt")
    with torch.no_grad():
        a = model(**enc).logits
        b = ref(**enc).logits
    # float8 matrix products (aten._scaled_mm) count like the float32 ones they replace
    from perfsdk.flops.counter import count_forward

    fp8_count, ref_count = count_forward(model, **enc), count_forward(ref, **enc)
    assert fp8_count.flops_total == ref_count.flops_total > 0
    assert fp8_count.categories["matmul"] == ref_count.categories["matmul"]
    # e4m3 keeps 3 mantissa bits: close to float32, not equal
    assert not torch.equal(a, b)
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.99


def test_float8_unsupported_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.models.float8 as f8

    monkeypatch.setattr(f8, "float8_status", lambda device: (False, "Tesla T4 has compute capability 7.5; float8 "
                                                                    "matmuls need 8.9 or newer (L4, L40, H100, RTX 40xx)"))
    with pytest.raises(ConfigError, match=r"^model\.dtype: float8_e4m3fn is not supported here: Tesla T4 has compute "
                                          r"capability 7\.5"):
        check_model_config(ModelConfig(device="cpu", dtype="float8_e4m3fn"))
    with pytest.raises(ConfigError, match=r"^model\.dtype: float8_e4m3fn already quantizes the linear layers"):
        check_model_config(ModelConfig(device="cpu", dtype="float8_e4m3fn", quantization="dynamic-int8"))


def _fake_bnb_model(kind: str) -> Any:
    """A model built like one that bitsandbytes quantized: module classes named as bnb names them."""
    import torch
    from torch import nn

    class Params4bit(nn.Parameter):
        pass

    class Linear4bit(nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 4)
            self.compute_dtype = torch.bfloat16
            self.weight = Params4bit(self.weight.data)
            self.weight.quant_type = "fp4"

    class Linear8bitLt(nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 4)

    layer = Linear4bit if kind == "4bit" else Linear8bitLt

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.head = layer(), layer(), nn.Linear(4, 2)

        def forward(self, x: Any) -> Any:
            return self.head(self.b(self.a(x)))

    return Net()


def test_packed_4bit_weights_count_their_unpacked_shape() -> None:
    import torch
    from torch import nn

    from perfsdk.models.info import parameter_count

    class QuantState:  # what bitsandbytes keeps beside a packed 4-bit weight
        shape = torch.Size([6, 4])

    lin = nn.Linear(4, 6, bias=True)
    # 24 4-bit values packed two a byte: 12 bytes of storage, as bitsandbytes stores them
    packed = nn.Parameter(torch.zeros(12, 1, dtype=torch.uint8), requires_grad=False)
    packed.quant_state = QuantState()  # type: ignore[attr-defined]
    lin.weight = packed
    assert parameter_count(lin) == 24 + 6


def test_adopted_quantized_models_are_recorded_as_they_are() -> None:
    import torch

    q4 = detect_quantization(_fake_bnb_model("4bit"))
    assert q4 == {"quantization": "bnb-4bit", "quant_type": "fp4", "quant_compute_dtype": "bfloat16", "quantized_modules": 2}
    assert detect_quantization(_fake_bnb_model("8bit"))["quantization"] == "bnb-8bit"
    # only the transformers config says so (e.g. a model whose layers were wrapped differently)
    plain = torch.nn.Linear(2, 2)
    plain.config = type("Cfg", (), {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                             "bnb_4bit_quant_type": "nf4",
                                                             "bnb_4bit_compute_dtype": "float16"}})()
    assert detect_quantization(plain) == {"quantization": "bnb-4bit", "quant_type": "nf4",
                                          "quant_compute_dtype": "float16", "quantized_modules": None}
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch marks its quantized tensor types as deprecated
        dyn = torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
    with perfsdk.session({"exporters": [], "collectors": {"memory": False, "energy": False, "utilization": False}},
                         store=None) as s:
        s.load(model=dyn)
        s.forward(dyn, torch.ones(1, 8))
    m = s.result.model  # type: ignore[union-attr]
    assert (m.quantization, m.quant_type, m.quantized_modules) == ("dynamic-int8", "qint8", 2)  # type: ignore[union-attr]
    with perfsdk.session({"exporters": []}, store=None) as s:
        s.load(model=_fake_bnb_model("4bit"))
    assert s.model_info.quantization == "bnb-4bit" and s.model_info.quant_type == "fp4"  # type: ignore[union-attr]

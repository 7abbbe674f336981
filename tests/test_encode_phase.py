"""The ``encode`` phase on the embedded tiny-t5 and tiny-llava: detection, windows, latency split,
layers, measured FLOPs (hand formulas), energy windows (scripted NVML counter), and a stored VLM
run with its vision-token count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import perfsdk
from perfsdk.collectors.energy import EnergyCollector, EnergyConfig
from perfsdk.energy.fake import FakeNvmlReader
from perfsdk.models.encode import encode_parts, feature_tokens, split_per_request
from perfsdk.models.images import builtin_shapes, image_views
from perfsdk.models.tiny import build_tiny_llama, build_tiny_llava, build_tiny_t5
from perfsdk.store import Store

KEY = "nvml:gpu:0"


@pytest.fixture(scope="module")
def t5() -> tuple[Any, Any]:
    return build_tiny_t5()


@pytest.fixture(scope="module")
def llava() -> tuple[Any, Any]:
    return build_tiny_llava()


def _energy() -> EnergyCollector:
    # every counter read advances 1000 mJ: a window between two reads holds exactly 1 J
    reader = FakeNvmlReader(names=["Fake GPU"], energy_mj=[list(range(0, 10_000_000, 1000))])
    return EnergyCollector(EnergyConfig(codecarbon={"enabled": False}, sources=["nvml"]), nvml_reader=reader)


def _phase_windows(s: perfsdk.Session, step_index: int) -> list[Any]:
    return [w for w in s.windows if w.step_index == step_index and w.kind in ("encode", "prefill", "decode")]


# -- detection -----------------------------------------------------------------------------------


def test_encode_parts_come_from_the_model(t5: tuple, llava: tuple) -> None:
    parts = encode_parts(t5[0])
    assert parts is not None and parts.kind == "encoder-decoder"
    assert parts.paths == ["encoder"] and [p for p, _ in parts.followers] == ["decoder"]
    assert parts.runs_for({"input_ids": 1}) and not parts.runs_for({"encoder_outputs": object()})

    parts = encode_parts(llava[0])
    assert parts is not None and parts.kind == "vision"
    assert parts.paths == ["model.vision_tower", "model.multi_modal_projector"]
    assert [p for p, _ in parts.followers] == ["model.language_model"]
    assert parts.features is not None and parts.features[0] == "model.multi_modal_projector"
    assert parts.runs_for({"pixel_values": torch.zeros(1)}) and not parts.runs_for({"input_ids": 1})

    small, _ = build_tiny_llama(name="tiny-llama-small")
    assert encode_parts(small) is None


def test_feature_tokens_and_split() -> None:
    assert feature_tokens(torch.zeros(3, 16, 64)) == (3, 16)
    assert feature_tokens(torch.zeros(40, 64)) == (1, 40)  # packed (tokens, hidden) features
    assert feature_tokens("no tensor") is None
    assert split_per_request(96, 2, [80, 16]) == [80, 16]  # proportional to the placeholders
    assert split_per_request(10, 3) == [4, 3, 3]  # no placeholders: as even as whole tokens allow
    assert split_per_request(10, 3, [1, 1, 1]) == [4, 3, 3]
    assert sum(split_per_request(7, 3, [1, 2, 4])) == 7


# -- T5: encoder in the encode phase -------------------------------------------------------------


def t5_encoder_flops(batch: int, length: int) -> int:
    """Hand formula, FLOPs = 2 x MACs, per encoder layer of tiny-t5 (d_model 64, 4 heads of 16,
    gated-GELU d_ff 128): q, k, v, o projections 4 x d x (h*d_kv), feed-forward wi_0, wi_1 and wo
    3 x d x d_ff per token, attention QK^T and PV h x L x L x (d_kv + d_kv) per sequence."""
    d, h, dk, ff, layers = 64, 4, 16, 128, 2
    macs = batch * length * (4 * d * h * dk + 3 * d * ff) + batch * h * length * length * 2 * dk
    return 2 * macs * layers


def test_t5_encoder_is_the_encode_phase(t5: tuple) -> None:
    model, tok = t5
    ids = torch.randint(4, 4096, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    cfg = {"collectors": {"layers": {"steps": {"first": 2}}, "flops": {}}}
    with perfsdk.session(cfg, store=None, collectors=[_energy()]) as s:
        s.load(model=model, tokenizer=tok)
        with s.warmup():
            s.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3)
        for _ in range(2):
            s.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3)
    res = s.result
    assert res is not None and res.status == "ok", res.errors if res else None

    # windows: encode, prefill, decode back to back; encode ends where the step's encode ended
    for st in s.steps:
        enc_w, pre_w, dec_w = _phase_windows(s, st.index)
        assert [enc_w.name, pre_w.name, dec_w.name] == ["encode", "prefill", "decode"]
        assert enc_w.start_ns <= st.start_ns < enc_w.end_ns == st.encode_end_ns == pre_w.start_ns
        assert pre_w.end_ns == st.token_times_ns[0] == dec_w.start_ns
        assert st.vision_tokens is None  # an encoder, not a vision tower

    # latency: TTFT = encode + prefill for every request
    lat = res.collectors["latency"]
    assert lat["encode_s"]["count"] == lat["prefill_s"]["count"] == lat["ttft_s"]["count"] == 4
    assert lat["vision_tokens"] == 0 and lat["vision_tokens_per_request"]["count"] == 0
    for row in s.series["requests"]:
        assert row["encode_s"] > 0 and row["encode_s"] + row["prefill_s"] == pytest.approx(row["ttft_s"], abs=1e-12)

    # layers: the encoder stack is encode, the decoder prefill and decode
    lay = res.collectors["layers"]
    assert [(p["phase"], p["forwards"]) for p in lay["phases"]] == [("encode", 2), ("prefill", 2), ("decode", 4)]
    phases_of = {}
    for row in lay["modules"]:
        phases_of.setdefault(row["path"].split(".")[0], set()).add(row["phase"])
    assert phases_of["encoder"] == {"encode"}
    assert phases_of["decoder"] == {"prefill", "decode"}
    assert "encoder" not in lay["coverage_modules"] and "encoder.block.0.layer.0" in lay["coverage_modules"]

    # FLOPs: one counted step (both measured steps have the same shape); exact encoder count
    fl = res.collectors["flops"]
    assert fl["steps_counted"] == 1
    assert fl["flops_encode"] == t5_encoder_flops(2, 7) == 2_343_936
    assert fl["flops_encode"] + fl["flops_prefill"] + fl["flops_decode"] == fl["flops_total"]
    assert fl["flops_forward"] == 0
    assert fl["macs_encode"] * 2 == fl["flops_encode"]

    # energy: each phase window spans exactly one counter step (1 J), warm-up left out
    en = res.collectors["energy"]
    pp = en["per_phase"]
    assert pp["encode"][KEY]["energy_j"] == 2.0 and pp["encode"][KEY]["windows"] == 2
    assert pp["prefill"][KEY]["energy_j"] == 2.0 and pp["decode"][KEY]["energy_j"] == 2.0
    assert [w["window"] for w in en["windows"] if w["step_index"] == 2] == ["encode", "prefill", "decode", "step:2"]
    assert set(en["j_per_output_token_per_phase"]) >= {"encode", "prefill", "decode"}
    assert {"encode", "prefill", "decode"} <= set(res.collectors["memory"]["rss_peak_by_phase_bytes"])


# -- LLaVA: vision tower and projector -----------------------------------------------------------


def clip_tower_and_projector_flops(images: int) -> int:
    """Hand formula for tiny-llava's encode pass, FLOPs = 2 x MACs, per 32x32 image.

    Patch embedding: a stride-8 convolution, 16 patches x 64 channels x (3 x 8 x 8) MACs.
    Two CLIP layers over 17 tokens (16 patches + class token), hidden 64, 4 heads of 16:
    q, k, v, o 4 x 64 x 64 and MLP 64 x 128 + 128 x 64 per token, attention 4 x 17 x 17 x (16 + 16).
    Projector: two 64 x 64 linears over the 16 selected patch tokens (class token dropped).
    """
    conv = 16 * 64 * 3 * 8 * 8
    layer = 17 * (4 * 64 * 64 + 2 * 64 * 128) + 4 * 17 * 17 * (16 + 16)
    projector = 16 * 2 * 64 * 64
    return 2 * images * (conv + 2 * layer + projector)


def _llava_inputs(processor: Any, views_per_request: list[list[Any]]) -> dict[str, Any]:
    texts = [processor.image_token * len(v) + "\ndescribe the picture" for v in views_per_request]
    return dict(processor(text=texts, images=views_per_request, return_tensors="pt", padding=True))


def test_stored_vlm_run_has_encode_prefill_decode_and_vision_tokens(llava: tuple, tmp_path: Path) -> None:
    model, processor = llava
    shapes = builtin_shapes()
    inputs = _llava_inputs(processor, [[shapes[0]], [shapes[1]]])
    assert tuple(inputs["pixel_values"].shape) == (2, 3, 32, 32)
    with perfsdk.session({"collectors": {"layers": {"steps": 1}, "flops": {}}}, store=tmp_path,
                         collectors=[_energy()]) as s:
        s.load(model=model, tokenizer=processor)
        with s.warmup():
            s.generate(model, **inputs, max_new_tokens=3, min_new_tokens=3)
        for _ in range(2):
            s.generate(model, **inputs, max_new_tokens=3, min_new_tokens=3)
    assert s.result is not None and s.result.status == "ok", s.result.errors if s.result else None
    store = Store(tmp_path)
    run = store.get(s.result.run_id)

    # the timed steps' windows (the layers and flops collectors' instrumented copies are marked)
    windows = [w["window"] for w in run.collectors["energy"]["windows"] if not w["warmup"] and not w["instrumented"]]
    assert [windows.count(n) for n in ("encode", "prefill", "decode")] == [2, 2, 2]
    lat = run.collectors["latency"]
    assert lat["encode_s"]["count"] == 4 and lat["prefill_s"]["count"] == 4
    assert lat["vision_tokens"] == 64  # 2 steps x 2 requests x 16 tokens (4 x 4 patches, class token dropped)
    assert lat["vision_tokens_per_request"]["mean"] == 16.0
    rows = store.read_series(run.run_id, "requests")
    assert [r["vision_tokens"] for r in rows] == [16, 16, 16, 16]
    assert all(r["encode_s"] + r["prefill_s"] == pytest.approx(r["ttft_s"], abs=1e-12) for r in rows)

    fl = run.collectors["flops"]
    assert fl["flops_encode"] == clip_tower_and_projector_flops(2) == 6_063_104
    assert fl["flops_encode"] + fl["flops_prefill"] + fl["flops_decode"] == fl["flops_total"]
    lay = run.collectors["layers"]
    enc_rows = {r["path"] for r in lay["modules"] if r["phase"] == "encode"}
    assert {"model.vision_tower", "model.multi_modal_projector"} <= enc_rows
    assert all(r["path"].startswith(("model.vision_tower", "model.multi_modal_projector"))
               for r in lay["modules"] if r["phase"] == "encode")
    assert [p["phase"] for p in lay["phases"]] == ["encode", "prefill", "decode"]


def test_vision_tokens_follow_each_request_s_views(llava: tuple) -> None:
    """A 64x48 image at image_size 64 gives a global view + 2x2 tiles (5 x 16 tokens); a 32x32
    image at its native size one view (16)."""
    model, processor = llava
    shapes = builtin_shapes()
    views = [image_views(shapes[1], image_size=64, native=(32, 32)), image_views(shapes[0], image_size=32,
                                                                                native=(32, 32))]
    assert [len(v) for v in views] == [5, 1]
    with perfsdk.session({}, store=None) as s:
        s.generate(model, **_llava_inputs(processor, views), max_new_tokens=2, min_new_tokens=2)
    assert s.steps[0].vision_tokens == [80, 16]


def test_text_only_prompt_on_a_vlm_has_no_encode_phase(llava: tuple) -> None:
    model, processor = llava
    enc = processor.tokenizer(["just text"], return_tensors="pt")
    with perfsdk.session({}, store=None) as s:
        s.generate(model, **enc, max_new_tokens=2, min_new_tokens=2)
    assert [w.name for w in _phase_windows(s, 0)] == ["prefill", "decode"]
    assert s.steps[0].encode_end_ns is None and s.steps[0].vision_tokens is None
    assert s.result is not None and s.result.collectors["latency"]["encode_s"]["count"] == 0


def test_ranks_merge_the_encode_split_and_vision_tokens(llava: tuple) -> None:
    """Two ranks' latency shares, each from a real session: pooled encode/prefill samples and
    summed vision tokens."""
    from perfsdk.collector import RankShare
    from perfsdk.collectors.latency import LatencyCollector, LatencyResult

    model, processor = llava
    shapes = builtin_shapes()
    shares = []
    for rank, views in enumerate(([[shapes[0]], [shapes[1]]], [image_views(shapes[1], image_size=64, native=(32, 32))])):
        with perfsdk.session({}, store=None) as s:
            s.generate(model, **_llava_inputs(processor, views), max_new_tokens=2, min_new_tokens=2)
        col = s.collectors["latency"]
        assert s.result is not None
        res = LatencyResult.model_validate(s.result.collectors["latency"])
        shares.append(RankShare(rank, 2, "host", res, col.rank_payload(s)))
    merged = LatencyCollector.merge_ranks(shares)
    assert merged.vision_tokens == 16 + 16 + 80
    assert merged.vision_tokens_per_request.count == 3 and merged.vision_tokens_per_request.max == 80.0
    assert merged.encode_s.count == merged.prefill_s.count == merged.ttft_s.count == 3
    assert merged.prefill_s.max is not None and merged.ttft_s.max is not None
    assert merged.prefill_s.max < merged.ttft_s.max  # prefill no longer stands for TTFT

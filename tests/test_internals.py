"""The seam to transformers internals: the cache is found by type, phases come from the call
order, and a rename of the cache argument is one change here."""

from __future__ import annotations

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from perfsdk.capture import OperationCapture
from perfsdk.models import internals as hf


def _cache(positions: int) -> DynamicCache:
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=64)
    cache = DynamicCache(config=cfg)
    if positions:
        k = torch.zeros(1, 2, positions, 16)
        cache.update(k, k.clone(), 0)
    return cache


def test_cache_found_by_type_whatever_its_argument_name():
    cache = _cache(5)
    ids = torch.zeros(1, 1, dtype=torch.long)
    for kwargs in ({"cache": cache}, {"past_key_values": cache}, {"some_future_name": cache}):
        assert hf.find_cache((), {"input_ids": ids, **kwargs}) is cache
        assert hf.forward_context((), {"input_ids": ids, **kwargs}) == (5, 1)
        assert hf.context_length((), {"input_ids": ids, **kwargs}) == 6
    assert hf.find_cache((ids, cache), {}) is cache
    legacy = ((torch.zeros(1, 2, 7, 16), torch.zeros(1, 2, 7, 16)),)
    assert hf.find_cache((), {"past": legacy}) is legacy and hf.cache_length(legacy) == 7
    # no cache: position ids tell the cached positions
    assert hf.forward_context((), {"input_ids": ids, "position_ids": torch.tensor([[9]])}) == (9, 1)
    assert hf.forward_context((), {"input_ids": ids}) == (None, 1)
    assert not hf.is_cache("cache") and not hf.is_cache(torch.zeros(2))


def test_cache_bytes_counts_keys_and_values():
    assert hf.cache_bytes(_cache(5)) == 2 * (1 * 2 * 5 * 16) * 4
    assert hf.cache_bytes(_cache(0)) == 0
    assert hf.cache_bytes("not a cache") is None


def test_phase_tracker_follows_the_call_order():
    t = hf.PhaseTracker()
    ids1, ids4 = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)
    assert t.on_forward((), {"input_ids": ids4, "cache": _cache(0)}) == ("prefill", 0, 4)
    assert t.on_forward((), {"input_ids": ids1, "cache": _cache(4)}) == ("decode", 1, 5)
    # a release that hands the cache under a name nobody knows yet: still decode, context unknown
    assert t.on_forward((), {"input_ids": ids1}) == ("decode", 2, 1)
    assert t.unavailable is None
    t.start()
    assert t.on_forward((), {"input_ids": ids4})[0] == "prefill"
    # a second forward from an empty cache contradicts the call order: said, not mislabelled silently
    t.on_forward((), {"input_ids": ids4, "cache": _cache(0)})
    assert t.unavailable is not None and t.unavailable.startswith("phase split unavailable: forward 2 of a generate")


def test_cache_kwargs_follow_the_forward_signature():
    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None):
            return input_ids

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, **kwargs):
            return input_ids

    c = object()
    assert hf.cache_kwargs(Old(), c) == {"past_key_values": c}
    assert hf.cache_kwargs(New(), c) == {"cache": c}


def test_real_generate_phases_on_this_release():
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=64, vocab_size=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 60, (2, 5))
    with torch.inference_mode(), OperationCapture(model, auto_phase=True) as cap:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
    assert [(f["phase"], f["step"], f["context_len"]) for f in cap.forwards] == [
        ("prefill", 0, 5), ("decode", 1, 6), ("decode", 2, 7), ("decode", 3, 8)]
    assert cap.phase_unavailable is None


def test_tested_range_and_version():
    low, high = hf.TESTED_TRANSFORMERS
    assert hf.tested_range_text() == f"{low} – {high}"
    assert hf.within_tested_range(low) is True and hf.within_tested_range("4.0.0") is False
    assert hf.within_tested_range(None) is None


def test_tested_range_starts_at_the_declared_lower_bound():
    """CI tests the lowest release pyproject.toml declares (make test-lowest): the tested range
    that doctor shows starts there."""
    import re
    from pathlib import Path

    from packaging.version import Version

    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    declared = re.search(r'"transformers>=([0-9][0-9.]*)"', text)
    assert declared is not None
    assert Version(declared.group(1)) == Version(hf.TESTED_TRANSFORMERS[0])
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    assert "test-lowest:" in makefile and "make test-lowest" in (Path(__file__).parent.parent / ".ci" / "run").read_text()


def test_a_model_whose_forwards_contradict_the_call_order_is_said_unavailable():
    """A wrapper that runs the decoder twice per token from an empty cache: the capture cannot
    tell prefill from decode, and the FLOPs collector says so instead of mislabelling."""
    import perfsdk

    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=64)
    torch.manual_seed(0)
    inner = LlamaForCausalLM(cfg).eval()

    class Rerun(torch.nn.Module):
        """Scores every position again at each step, each time from a fresh cache."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            from transformers import DynamicCache

            return self.inner(input_ids=input_ids, **hf.cache_kwargs(self.inner, DynamicCache(config=cfg))).logits

        def generate(self, input_ids, max_new_tokens=3, **_):
            ids = input_ids
            for _ in range(max_new_tokens):
                nxt = self(ids)[:, -1:].argmax(-1)
                ids = torch.cat([ids, nxt], dim=1)
            return ids

    model = Rerun()
    with torch.inference_mode(), OperationCapture(model.inner, auto_phase=True) as cap:
        model.generate(torch.randint(3, 60, (1, 4)))
    assert cap.phase_unavailable is not None
    assert cap.phase_unavailable.startswith("phase split unavailable: forward 2 of a generate call")
    with perfsdk.session({"collectors": {"flops": {}, "utilization": False, "energy": False}}, store=None) as s:
        s.load(model=model)
        s.generate(model, input_ids=torch.randint(3, 60, (1, 4)), max_new_tokens=3)
    flops = s.result.collectors["flops"]
    # the wrapper is handed no cache and feeds 5, 6, 7 positions: as many as its first forward
    assert flops["reason"] == ("phase split unavailable: forward 2 of a generate call fed 5 positions without a "
                               "cache, as many as the prefill, so the call order does not tell prefill from decode")
    assert flops["reason"] in flops["notes"]

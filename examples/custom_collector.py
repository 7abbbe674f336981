"""Write a collector inline and use it in one session, without packaging it.

The collector below counts how many output tokens each step produced per second of decode
(decode throughput per step) and keeps the slowest step. For a reusable, installable collector
see plugins/perfsdk-pyruntime and docs/writing-a-collector.md.

    python examples/custom_collector.py
"""

from __future__ import annotations

import argparse
from typing import Any

import perfsdk


class DecodeRateConfig(perfsdk.CollectorConfig):
    min_tokens: int = 2


class DecodeRateResult(perfsdk.CollectorResult):
    steps: int
    slowest_step: int | None
    slowest_decode_tokens_per_s: float | None
    fastest_decode_tokens_per_s: float | None


class DecodeRateCollector(perfsdk.Collector):
    """Decode tokens/s for every measured generate step."""

    name = "decode_rate"
    Config = DecodeRateConfig
    Result = DecodeRateResult

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.rates: dict[int, float] = {}

    @perfsdk.hookimpl
    def perfsdk_after_generate(self, session: Any, step: perfsdk.Step) -> None:
        if step.warmup or step.kind != "generate" or len(step.token_times_ns) < self.config.min_tokens:
            return
        decode_s = (step.token_times_ns[-1] - step.token_times_ns[0]) / 1e9
        tokens = sum(max(n - 1, 0) for n in step.output_tokens or [])
        if decode_s > 0:
            self.rates[step.index] = tokens / decode_s

    @perfsdk.hookimpl
    def perfsdk_finalize(self, session: Any) -> DecodeRateResult:
        slowest = min(self.rates, key=self.rates.__getitem__) if self.rates else None
        return DecodeRateResult(
            steps=len(self.rates),
            slowest_step=slowest,
            slowest_decode_tokens_per_s=self.rates[slowest] if slowest is not None else None,
            fastest_decode_tokens_per_s=max(self.rates.values(), default=None),
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="perfsdk-results")
    args = ap.parse_args()

    cfg = {"name": "custom-collector", "store": args.store, "collectors": {"decode_rate": {"min_tokens": 3}}}
    with perfsdk.session(cfg, collectors=[DecodeRateCollector]) as s:
        model, tok = s.load()
        batch = s.tokenize(tok, ["The quick brown fox", "A slow green turtle walks"])
        for _ in range(4):
            s.generate(model, **batch, max_new_tokens=12)
    print(s.result.collectors["decode_rate"])


if __name__ == "__main__":
    main()

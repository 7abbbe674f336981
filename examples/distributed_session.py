"""A measured session on every rank, stored as one run by rank 0.

Run on CPU with two processes::

    torchrun --nproc-per-node 2 examples/distributed_session.py --store perfsdk-results

Each rank generates from its own share of the prompts; perfsdk detects the ranks from the
environment ``torchrun`` sets, joins a gloo process group, gives every rank rank 0's run id and
gathers everything to rank 0, which stores one run with a ``ranks`` section and the aggregate.
"""

from __future__ import annotations

import argparse
import os

import torch

import perfsdk
from perfsdk.distributed import shard_prompts
from perfsdk.testing import build_tiny_causal_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", default="perfsdk-results")
    parser.add_argument("--prompts", type=int, default=6, help="prompts over all ranks")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)

    model = build_tiny_causal_lm()
    # Token-id "prompts" of different lengths; every rank takes its strided share.
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (1, 4 + i), generator=g) for i in range(args.prompts)]
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mine = shard_prompts(prompts, rank, world)

    cfg = {"name": "distributed-example", "collectors": {"energy": False, "utilization": False}}
    with perfsdk.session(cfg, store=args.store) as s:
        s.load(model=model)
        for ids in mine:
            s.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                       max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False)
    result = s.result
    assert result is not None
    if rank == 0:
        lat = result.collectors.get("latency", {})
        ttft = lat.get("ttft_s", {}).get("p50")
        ttft_text = f"{ttft * 1e3:.2f} ms" if ttft is not None else "-"
        print(f"run {result.run_id}: {len(result.ranks or [])} ranks, status {result.status}, "
              f"{lat.get('output_tokens')} output tokens, ttft p50 {ttft_text}")
    else:
        print(f"rank {rank}: run {result.run_id}")


if __name__ == "__main__":
    main()

"""Worker for tests/plan/test_phases.py, run under torchrun: the bytes one rank holds of the
FSDP2-sharded tiny model's parameters, gradients (after a backward, before zero_grad) and AdamW
state (after one step), written to <out>/rank-R.json. Two counts each: the sum of the local shards'
nbytes (the real elements) and the sum of the distinct storages behind them (what the allocator
holds: FSDP2 pads dim 0 to a multiple of the world)."""

import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from psyrl.core.config import ModelConfig, OptimConfig
from psyrl.runtime.distributed import cleanup, init_distributed, load_sharded
from psyrl.runtime.model import Policy, load_model, load_tokenizer
from psyrl.runtime.optim import build_optimizer

# odd MLP width and one KV head: dim 0 of gate/up (129) does not split evenly over 2 ranks, so the
# padding shows
MODEL = ModelConfig(
    tokenizer="tiny",
    hidden_size=48,
    num_layers=2,
    num_heads=3,
    num_kv_heads=1,
    intermediate_size=129,
)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def count(tensors) -> dict[str, int]:
    tensors = [local(t) for t in tensors]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return {"local": sum(t.nbytes for t in tensors), "storage": sum(storages.values())}


def check(dist, out: Path) -> None:
    tokenizer = load_tokenizer(MODEL)
    policy = load_sharded(
        lambda empty: Policy(load_model(MODEL, tokenizer, seed=3, empty=empty)), dist
    )
    optimizer = build_optimizer(policy, OptimConfig())
    ids = torch.randint(
        0, len(tokenizer), (2, 24), generator=torch.Generator().manual_seed(dist.rank)
    )
    policy(ids, torch.ones_like(ids)).sum().backward()
    params = list(policy.parameters())
    figures = {"params": count(params), "grads": count(p.grad for p in params)}
    optimizer.step()
    state = [s[k] for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    figures["adam"] = count(state)
    (out / f"rank-{dist.rank}.json").write_text(json.dumps(figures), encoding="utf-8")


def main(out: Path) -> None:
    dist = init_distributed("cpu")
    check(dist, out)
    cleanup(dist)  # after check() released its models: cleanup joins gloo's threads


if __name__ == "__main__":
    main(Path(sys.argv[1]))

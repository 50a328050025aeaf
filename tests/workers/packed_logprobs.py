"""Worker for tests/runtime/test_model_packing.py, run under torchrun with 2 ranks: each rank
scores its own sequences through an FSDP2-sharded tiny policy, padded and packed, with a tied and
an untied LM head, and takes one backward of each; log-probs and the rank's gradient shards go to
<out>/rank-R.safetensors."""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from psyrl.core.config import ModelConfig
from psyrl.runtime.distributed import cleanup, init_distributed, load_sharded
from psyrl.runtime.model import Policy, collate, load_model, load_tokenizer, pack

TINY = ModelConfig(
    tokenizer="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
)


def untied(empty: bool):
    model = load_model(TINY, load_tokenizer(TINY), seed=7, empty=empty)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight + 0.01)
    model.config.tie_word_embeddings = False
    return Policy(model)


def tied(empty: bool):
    return Policy(load_model(TINY, load_tokenizer(TINY), seed=7, empty=empty))


def main(out: Path) -> None:
    dist = init_distributed("cpu")
    g = torch.Generator().manual_seed(dist.rank)
    shapes = [(7, 3), (5, 11), (9, 2)] if dist.rank == 0 else [(4, 13), (8, 5)]
    ids = [torch.randint(10, 200, (p + r,), generator=g).tolist() for p, r in shapes]
    prompts = [p for p, _ in shapes]
    pad = load_tokenizer(TINY).pad_token_id
    tensors = {}
    for head, build in (("tied", tied), ("untied", untied)):
        policy = load_sharded(build, dist)
        input_ids, attention_mask, mask = collate(ids, prompts, pad)
        for name, inputs in (
            (
                "padded",
                {"input_ids": input_ids, "attention_mask": attention_mask, "positions": mask},
            ),
            ("packed", {"input_ids": pack(ids, prompts)}),
        ):
            policy.zero_grad()
            logp = policy(**inputs, temperature=0.8)  # [b, T-1]
            (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
            tensors[f"{head}_{name}"] = logp.detach()
            grads = [p.grad.to_local().flatten() for p in policy.parameters() if p.grad is not None]
            tensors[f"{head}_grad_{name}"] = torch.cat(grads)
        del policy
    save_file(tensors, str(out / f"rank-{dist.rank}.safetensors"))
    cleanup(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

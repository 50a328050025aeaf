"""Worker for tests/runtime/test_distributed.py, run under torchrun: token log-probs of a sharded
tiny model, of the unsharded copy each rank fills from its shards, and of its HF export loaded back
into a sharded model, written per rank to <out>/rank-R.safetensors."""

import dataclasses
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from psyrl.core.config import ModelConfig
from psyrl.runtime.checkpoint import export_hf
from psyrl.runtime.distributed import cleanup, init_distributed, load_sharded, unsharded_copy
from psyrl.runtime.model import Policy, load_model, load_tokenizer, token_logprobs

TINY = ModelConfig(
    tokenizer="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
)


def check(dist, out: Path) -> None:
    tokenizer = load_tokenizer(TINY)
    ids = torch.tensor(
        [tokenizer("Stimuli: my sister won the prize.\nQuestion: how did I feel?")["input_ids"]] * 2
    )
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    policy = load_sharded(
        lambda empty: Policy(load_model(TINY, tokenizer, seed=7, empty=empty)), dist
    )
    with torch.no_grad():
        before = policy(ids, mask)
        copy = token_logprobs(
            unsharded_copy(policy, load_model(TINY, tokenizer, empty=True), dist), ids, mask
        )
        bf16 = unsharded_copy(policy, load_model(TINY, tokenizer, empty=True), dist, "bfloat16")
    export_hf(policy, tokenizer, out / "hf", dist)
    exported = dataclasses.replace(TINY, path=str(out / "hf"), tokenizer="")
    reloaded = load_sharded(
        lambda empty: Policy(load_model(exported, tokenizer, empty=empty)), dist
    )
    with torch.no_grad():
        after = reloaded(ids, mask)
    tensors = {
        "before": before,
        "copy": copy,
        "after": after,
        "ids": ids,
        "mask": mask,
        "bf16_inv_freq": bf16.model.rotary_emb.inv_freq,
        "bf16_norm": bf16.model.norm.weight.float(),
    }
    save_file(tensors, str(out / f"rank-{dist.rank}.safetensors"))


def main(out: Path) -> None:
    dist = init_distributed("cpu")
    check(dist, out)
    cleanup(dist)  # after check() released its models: cleanup joins gloo's threads


if __name__ == "__main__":
    main(Path(sys.argv[1]))

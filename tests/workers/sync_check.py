"""Worker for tests/test_gpu_path.py, run under torchrun on 2 gloo ranks: the bucketed weight sync
against the one-at-a-time float32 gather followed by a cast (tied and untied LM heads, several
bucket sizes), the rank-0 gather of an export against the full gather, and the phase offload's round
trip of shards and AdamW state through its one host block. Writes <out>/rank-R.json with the
comparisons' outcomes."""

import json
import math
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from psyrl.plan.architecture import shapes
from psyrl.plan.host_ram import offload_bytes
from psyrl.runtime.distributed import (
    cleanup,
    gather_full_state_dict,
    gather_to_rank0,
    init_distributed,
    load_sharded,
    sync_buckets,
)
from psyrl.runtime.model import Policy
from psyrl.runtime.offload import PhaseOffload, fsdp_params


def build(tied: bool, empty: bool) -> Policy:
    config = Qwen2Config(
        vocab_size=101,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        tie_word_embeddings=tied,
    )
    with torch.device("meta" if empty else "cpu"), torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        # odd sizes: shards of unequal rows, one rank's padded
        return Policy(Qwen2ForCausalLM(config))


def check(dist, out: Path) -> None:
    result = {}
    for tied in (True, False):
        policy = load_sharded(lambda empty, tied=tied: build(tied, empty), dist)
        reference = [
            (n, t.to(torch.bfloat16)) for n, t in gather_full_state_dict(policy, prefix="lm.")
        ]
        for bucket in (1, 4096, 1 << 30):  # one tensor per bucket, a few, everything in one
            got = list(sync_buckets(policy, dist.device, torch.bfloat16, bucket, prefix="lm."))
            same = [n for n, _ in got] == [n for n, _ in reference] and all(
                a.dtype == b.dtype and torch.equal(a, b) for (_, a), (_, b) in zip(got, reference)
            )
            result[f"sync tied={tied} bucket={bucket}"] = same
        full = [(n, t) for n, t in gather_full_state_dict(policy, prefix="lm.")]
        on_rank0 = list(gather_to_rank0(policy, prefix="lm."))
        names_match = [n for n, _ in on_rank0] == [n for n, _ in full]
        if dist.rank == 0:
            result[f"rank0 tied={tied}"] = names_match and all(
                torch.equal(a, b) for (_, a), (_, b) in zip(on_rank0, full)
            )
        else:
            result[f"rank0 tied={tied}"] = names_match and all(t is None for _, t in on_rank0)
        result[f"names tied={tied}"] = [n for n, _ in full]

    # the phase offload's round trip keeps the Parameters the optimiser's state is keyed by, and
    # every value
    policy = load_sharded(lambda empty: build(True, empty), dist)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    ids = torch.arange(12).reshape(2, 6)
    policy(ids, torch.ones_like(ids)).sum().backward()
    optimizer.step()
    params = list(policy.parameters())
    before = [p.detach().to_local().clone() for p in params]
    moments = [optimizer.state[p]["exp_avg"].to_local().clone() for p in params]
    offload = PhaseOffload(policy, optimizer, dist.device, enabled=True)
    storage = params[0].to_local().untyped_storage().data_ptr()
    offload.to_host()
    # a new allocation (the CPU path too)
    moved = params[0].to_local().untyped_storage().data_ptr() != storage
    offload.to_device()
    kept = list(policy.parameters()) == params and all(p in optimizer.state for p in params)
    result["offload keeps parameters"] = kept
    result["offload moved storage"] = moved
    result["offload keeps values"] = all(
        torch.equal(p.detach().to_local(), b) for p, b in zip(params, before)
    ) and all(
        torch.equal(optimizer.state[p]["exp_avg"].to_local(), m) for p, m in zip(params, moments)
    )
    with torch.no_grad():  # a forward after the round trip all-gathers the re-registered shards
        result["offload forward"] = bool(torch.isfinite(policy(ids, torch.ones_like(ids))).all())
    result.update(host_block(dist, policy, optimizer, offload, ids))
    result.update(reference_block(dist, ids))
    (out / f"rank-{dist.rank}.json").write_text(json.dumps(result))


def host_block(dist, policy, optimizer, offload, ids) -> dict[str, bool]:
    """The host side is one block of exactly the padded shards' and AdamW state's bytes, made once;
    on the host every shard (uneven ones too: FSDP2 does not re-pad them elsewhere) and every
    moment is a view into it; training with moves between steps equals training without them."""
    result = {}
    params = list(policy.parameters())
    # FSDP2 pads dim 0 to a multiple of the world size; AdamW's state is the unpadded local shard
    padded = sum(
        math.ceil(p.shape[0] / dist.world) * math.prod(p.shape[1:]) * p.element_size()
        for p in params
    )
    local = sum(p.to_local().numel() * p.element_size() for p in params)
    uneven = any(p.shape[0] % dist.world for p in params)
    result["host bytes"] = uneven and offload.host_bytes == padded + 2 * local
    # what `psyrl plan` counts for this rank's phase offload
    planned = offload_bytes(shapes(policy.lm.config), dist.world, dist.rank)
    result["host bytes = plan"] = offload.host_bytes == sum(planned.values())
    offload.to_host()
    buffer = offload.block.buffer
    ptr = buffer.untyped_storage().data_ptr()
    held = [p.to_local() for p in params] + [
        optimizer.state[p][k].to_local() for p in params for k in ("exp_avg", "exp_avg_sq")
    ]
    fsdp_data = [f._sharded_param_data for f in fsdp_params(policy).values()]
    result["host views"] = all(t.untyped_storage().data_ptr() == ptr for t in held + fsdp_data)
    result["host buffer size"] = buffer.numel() == offload.host_bytes
    offload.to_device()
    offload.to_host()
    result["host allocated once"] = (
        offload.block.buffer is buffer and offload.block.allocations == 1
    )
    offload.to_device()

    # two steps each side: moves between them change no number
    def step(model, opt):
        model(ids, torch.ones_like(ids)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    twin = load_sharded(lambda empty: build(True, empty), dist)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    twin(ids, torch.ones_like(ids)).sum().backward()  # where `policy` is: the step above taken
    twin_opt.step()
    for opt in (optimizer, twin_opt):
        opt.zero_grad(set_to_none=True)
    twin_offload = PhaseOffload(twin, twin_opt, dist.device, enabled=False)
    for model, opt, moves in ((policy, optimizer, offload), (twin, twin_opt, twin_offload)):
        for _ in range(2):
            moves.to_host()
            moves.to_device()
            step(model, opt)
    result["host training equal"] = all(
        torch.equal(a.to_local(), b.to_local())
        for a, b in zip(policy.parameters(), twin.parameters())
    )
    return result


def reference_block(dist, ids) -> dict[str, bool]:
    """A frozen model under FSDP2 CPU offload with `host_block`: its shards live in one block of the
    padded shards' bytes (FSDP2's own pinning would copy each shard to a block of its own), and its
    forward equals that of the same model kept on the device."""
    plain = load_sharded(lambda empty: build(False, empty), dist)
    held = load_sharded(lambda empty: build(False, empty), dist, offload=True, host_block=True)
    block = held.host_block
    ptr = block.buffer.untyped_storage().data_ptr()
    padded = sum(
        math.ceil(p.shape[0] / dist.world) * math.prod(p.shape[1:]) * p.element_size()
        for p in held.parameters()
    )
    fsdp_data = [f._sharded_param_data for f in fsdp_params(held).values()]
    with torch.no_grad():
        same = torch.equal(held(ids, torch.ones_like(ids)), plain(ids, torch.ones_like(ids)))
    return {
        "reference block bytes": block.nbytes == padded and block.state_bytes == 0,
        "reference views": all(
            t.untyped_storage().data_ptr() == ptr
            for t in [p.to_local() for p in held.parameters()] + fsdp_data
        ),
        "reference forward": same,
        "reference allocated once": block.allocations == 1,
    }


def main(out: Path) -> None:
    dist = init_distributed("cpu")
    check(dist, out)
    cleanup(dist)  # after check() released its models: cleanup joins gloo's threads


if __name__ == "__main__":
    main(Path(sys.argv[1]))

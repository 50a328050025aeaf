"""The models a trainer holds, built from the config: the policy (FSDP2-sharded under torchrun), the
frozen reference of eq. 1's KL term, and the sampler that generates with the policy's current
weights, kept in sync."""

from __future__ import annotations

from psyrl.core.config import Config
from psyrl.runtime.distributed import (
    DTYPES,
    Dist,
    cast_parameters,
    load_sharded,
    sync_buckets,
    unsharded_copy,
)
from psyrl.runtime.model import Policy, load_model, model_config
from psyrl.runtime.sampler import TorchSampler


def build_policy(cfg: Config, tokenizer, dist: Dist) -> Policy:
    """The policy that trains: one process holds the whole model; under torchrun rank 0 reads it and
    FSDP2 shards it, float32 master weights, on the host throughout when fsdp.offload = "always"
    (FSDP2 CPUOffloadPolicy)."""
    if not dist.sharded:
        return Policy(load_model(cfg.model, tokenizer, seed=cfg.run.seed, device=dist.device))
    build = lambda empty: Policy(load_model(cfg.model, tokenizer, seed=cfg.run.seed, empty=empty))
    return load_sharded(
        build, dist, cfg.model.dtype, cfg.fsdp.offload == "always", cfg.fsdp.reshard_after_forward
    )


def build_reference(cfg: Config, tokenizer, dist: Dist) -> Policy:
    """pi_ref (eq. 1's KL term): the starting checkpoint, frozen, held in the compute dtype
    (model.dtype; verl and EasyR1 load theirs in bf16), under torchrun sharded with FSDP2 CPU
    offload when fsdp.ref_offload (A.3), its shards then in one exact-size host block
    (`load_sharded(host_block=True)`)."""
    if not dist.sharded:
        model = load_model(cfg.model, tokenizer, seed=cfg.run.seed, device=dist.device)
        cast_parameters(model, cfg.model.dtype)
        reference = Policy(model)
    else:
        build = lambda empty: Policy(
            load_model(cfg.model, tokenizer, seed=cfg.run.seed, empty=empty)
        )
        reference = load_sharded(
            build,
            dist,
            cfg.model.dtype,
            cfg.fsdp.ref_offload,
            cfg.fsdp.reshard_after_forward,
            storage_dtype=cfg.model.dtype,
            host_block=True,
        )
    return reference.eval().requires_grad_(False)


def build_sampler(
    policy: Policy,
    cfg: Config,
    tokenizer,
    dist: Dist,
    temperature: float | None = None,
    longest_prompt: int = 0,
):
    """The sampler of `sampler.engine`, holding the policy's current weights. `torch`: its own
    unsharded copy of the policy in the compute dtype, filled one tensor at a time from the
    (possibly sharded) policy. `vllm`: a colocated engine started on dummy weights, then given the
    policy's by a first weight sync, whose log-probs are exact at `temperature` (default
    rollout.temperature; see `psyrl.runtime.vllm_sampler.logprobs_mode`), whose sequences hold the
    longer of rollout.max_prompt_tokens and `longest_prompt` (validation prompts are not filtered)
    plus rollout.max_new_tokens: vLLM's KV cache must hold one such sequence, not the model's 32k
    positions. Collective under torchrun."""
    if cfg.sampler.engine == "vllm":
        # imported for this engine only: a torch run reads none of its code
        from psyrl.runtime.vllm_sampler import VLLMSampler, engine_model_dir

        architecture = model_config(cfg.model, tokenizer)
        with engine_model_dir(architecture) as model_dir:
            sampler = VLLMSampler(
                model_dir,
                tokenizer,
                dist,
                dtype=cfg.model.dtype,
                max_model_len=max(cfg.rollout.max_prompt_tokens, longest_prompt)
                + cfg.rollout.max_new_tokens,
                batch=cfg.sampler.max_num_seqs,
                tensor_parallel=cfg.sampler.tensor_parallel,
                gpu_memory_utilization=cfg.sampler.gpu_memory_utilization,
                sleep=cfg.sampler.sleep,
                temperature=cfg.rollout.temperature if temperature is None else temperature,
                enforce_eager=cfg.sampler.enforce_eager,
                disable_custom_all_reduce=cfg.sampler.disable_custom_all_reduce,
                seed=cfg.run.seed,
            )
        sync_weights(sampler, policy, cfg, dist)
        return sampler
    lm = unsharded_copy(policy, load_model(cfg.model, tokenizer, empty=True), dist, cfg.model.dtype)
    return TorchSampler(lm, tokenizer, dist.device, cfg.sampler.batch)


def sync_weights(sampler, policy: Policy, cfg: Config, dist: Dist) -> None:
    """The weight sync: every parameter of the trainer, cast to model.dtype on the device and
    all-gathered in buckets of sampler.sync_bucket_mib (`psyrl.runtime.distributed.sync_buckets`),
    streamed into the sampler. Collective."""
    sampler.load_weights(
        sync_buckets(
            policy,
            dist.device,
            DTYPES[cfg.model.dtype],
            cfg.sampler.sync_bucket_mib << 20,
            prefix="lm.",
        )
    )

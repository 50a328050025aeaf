"""T-GRPO: GRPO with the trajectory cache and the bilateral reward (paper §3.2, eq. 1-9; SPEC §2-4,
§9).

    python train_tgrpo.py --config configs/tgrpo/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node 4 train_tgrpo.py --config configs/tgrpo/qwen2.5-3b.toml      (FSDP2,
    SPEC §1)
    psyrl train-tgrpo ... / torchrun --nproc_per_node 4 -m psyrl train-tgrpo ...   (installed)

Its command line (--config, --set, --overwrite, --resume) is psyrl.cli.commands.train_tgrpo; `train`
below is the program.

One step (SPEC §9): B prompts in a seeded, resumable order, split over ranks (a prompt's G samples
stay on one rank) -> G samples each from the sampler -> answers scored -> cache phase 1 over the
records of all ranks (L-bar, r-bar_F1) -> final rewards of `reward.variant` -> cache phase 2 ->
advantages (eq. 2) -> reference log-probs (and logp_old for the mini-batches after the first when a
rollout gives several updates) -> one update per mini-batch of `optim.global_batch` prompts ->
weight sync to the sampler. With `fsdp.offload = "phase"` the actor's shards and optimiser state
leave the device before the sync and the next rollout and come back after it. Every
`checkpoint.every` steps: validation on the held-out split and `runs/<name>/checkpoints/step-N/`
(model, optimiser, RNG, data position, trajectory cache). A preemption signal (run.preempt_signals)
on any rank ends the run after the step it is in (with run.preempt_now: after the sampling, dropping
the step), with a checkpoint and exit status 75.
"""

from __future__ import annotations

import contextlib
import json

import click
import torch

from psyrl.core.config import ConfigError
from psyrl.core.records import Cursor, DataError, load_records, load_stimuliqa, next_indices
from psyrl.core.runlog import Laps, peak_memory_gib
from psyrl.rl.rewards import answer_components, load_reward_plugin
from psyrl.rl.rollout import (
    build_prompts,
    gather_step,
    rank_positions,
    rollout_batch,
    sample_seed,
    score,
    step_metrics,
    write_samples,
)
from psyrl.rl.trajectory_cache import TrajectoryCache
from psyrl.rl.update import reduce_sums, sequence_logprobs, update
from psyrl.run.directory import Run, check_memory_plan
from psyrl.run.validation import longest_prompt, sample_items, validate
from psyrl.runtime.checkpoint import json_text
from psyrl.runtime.distributed import Dist, PhaseOffload, all_reduce, print0
from psyrl.runtime.model import autocast, load_tokenizer
from psyrl.runtime.optim import build_optimizer, lr_factor, set_lr
from psyrl.runtime.policy import build_policy, build_reference, build_sampler, sync_weights

LINE_FIELDS = [
    ("reward", "reward/final", ".3f"),
    ("f1", "reward/f1", ".3f"),
    ("format", "reward/format", ".2f"),
    ("len", "response/length", ".0f"),
    ("kl", "actor/kl", ".4f"),
    ("grad", "actor/grad_norm", ".3f"),
    ("clip", "actor/clip_frac", ".3f"),
    ("s/step", "time/step", ".1f"),
    ("valid f1", "valid/f1", ".4f"),
    ("valid acc", "valid/accuracy", ".4f"),
]


def check_batches(cfg, dist: Dist) -> None:
    B, batch, G = cfg.rollout.prompts, cfg.optim.global_batch, cfg.rollout.samples
    if B % batch:
        raise click.ClickException(
            f"rollout.prompts = {B} must be a multiple of optim.global_batch = {batch} "
            "(each mini-batch of global_batch prompts is one update)"
        )
    if batch % dist.world:
        raise click.ClickException(
            f"optim.global_batch = {batch} must be a multiple of the {dist.world} ranks "
            "(each rank takes an equal share of every mini-batch)"
        )
    if cfg.advantage.scope == "group" and G < 2:
        raise click.ClickException(
            f"advantage.scope = 'group' needs rollout.samples >= 2 (the std of a group of "
            f"{G} is undefined); use scope 'cache' or 'batch', or more samples"
        )


def train(cfg, dist: Dist, overwrite: bool, resume: bool) -> None:
    # --------------------------------------------------- setup: everything checked before any write
    run = Run(cfg, dist, "tgrpo", LINE_FIELDS, overwrite, resume)
    check_batches(cfg, dist)
    try:
        train_records = load_stimuliqa(cfg.data.train_file)
        valid_records = []
        if cfg.data.valid_file:
            valid_records = sample_items(
                load_records(cfg.data.valid_file), cfg.data.valid_items, cfg.run.seed
            )
        tokenizer = load_tokenizer(cfg.model)
        train_prompts, too_long = build_prompts(train_records, tokenizer, cfg)
        if not train_prompts:
            raise DataError(
                f"{cfg.data.train_file}: all {too_long} prompts are longer than "
                f"rollout.max_prompt_tokens = {cfg.rollout.max_prompt_tokens} tokens; nothing to "
                "train on"
            )
        run.check_data(cfg.data.train_file, len(train_prompts))
        check_memory_plan(cfg, dist, "tgrpo")
        policy = build_policy(cfg, tokenizer, dist)
        reference = build_reference(cfg, tokenizer, dist) if cfg.loss.kl_coef > 0 else None
        plugin = load_reward_plugin(cfg.reward.custom) if cfg.reward.custom else None
    except (ConfigError, DataError, OSError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    run.start(train_records, valid_records)
    pad_id = tokenizer.pad_token_id

    policy.train()
    optimizer = build_optimizer(policy, cfg.optim)
    offload = PhaseOffload(policy, optimizer, dist.device, cfg.fsdp.offload == "phase")
    # FSDP: its own policy
    amp = contextlib.nullcontext() if dist.sharded else autocast(cfg.model, dist.device)
    B, G = cfg.rollout.prompts, cfg.rollout.samples
    batch, steps = cfg.optim.global_batch, cfg.run.steps
    updates_per_step = B // batch
    cache = TrajectoryCache(cfg.cache.size)
    state = run.resume(policy, optimizer)
    if state:
        cache.load_state_dict(
            json.loads((run.checkpoint / "trajectory_cache.json").read_text(encoding="utf-8"))
        )
    cursor, skipped_updates = Cursor(**state.get("cursor", {})), state.get("skipped_updates", 0)
    offload.to_host()  # before the engine starts: vLLM refuses a pool larger than the free memory
    sampler = build_sampler(
        policy,
        cfg,
        tokenizer,
        dist,  # its own copy, filled from the shards
        longest_prompt=longest_prompt(valid_records, tokenizer, cfg),
    )
    params = sum(p.numel() for p in policy.parameters())
    run.banner(
        f"{params / 1e6:.2f}M parameters on {dist.world} x {dist.device}"
        f"{' (FSDP2, offload ' + cfg.fsdp.offload + ')' if dist.sharded else ''}; reward "
        f"{cfg.reward.variant}, advantage scope {cfg.advantage.scope}, cache {cfg.cache.size} "
        f"steps; {len(train_prompts)} training prompts ({too_long} over "
        f"{cfg.rollout.max_prompt_tokens} tokens dropped); {len(valid_records)} validation items; "
        f"{steps} steps of {B} prompts x {G} samples, {updates_per_step} update(s) each"
    )

    with run:
        # the starting model's scores: the baseline of every later row
        if valid_records and run.first == 1:
            metrics, _ = validate(
                policy, sampler, tokenizer, valid_records, cfg, dist, offload.on_device, plugin
            )
            run.log({"step": 0, "steps": steps, **metrics}, echo=True)

        def checkpoint(step, cursor, validation=None):
            run.save(
                step,
                policy,
                optimizer,
                tokenizer,
                {
                    "cursor": vars(cursor),
                    "skipped_updates": skipped_updates,
                    "sampler_seeds": "sha256(run.seed:step:prompt position)",
                },
                {"trajectory_cache.json": json_text(cache.state_dict())},
                validation,
            )

        for step in range(run.first, steps + 1):
            lap = Laps(dist.device)
            # -------------------------------------------------------- sample G responses per prompt
            before = cursor
            indices, cursor = next_indices(
                cursor, len(train_prompts), B, cfg.run.seed, cfg.data.shuffle
            )
            positions = rank_positions(B, batch, dist)
            prompt_ids = [train_prompts[indices[p]][1] for p in positions]
            groups = sampler.generate(
                prompt_ids,
                G,
                cfg.rollout.temperature,
                cfg.rollout.top_p,
                cfg.rollout.max_new_tokens,
                [sample_seed(cfg.run.seed, step, p) for p in positions],
            )
            lap("sample")
            # run.preempt_now: nothing of this step is kept yet (cache, model, cursor as after the
            # previous step; the sampler's seeds are per step), so the previous step is checkpointed
            if cfg.run.preempt_now and (stop := run.preempted()):
                if 0 < step - 1 != run.saved:
                    checkpoint(step - 1, before)
                sampler.close()
                raise run.stop(stop)

            # ------------------------------------------------ score, cache (two phases), advantages
            local = []
            for p, group in zip(positions, groups):
                record = train_prompts[indices[p]][0]
                parts = answer_components(
                    [s.text for s in group],
                    [record.answer] * G,
                    cfg.prompt.mode,
                    cfg.reward,
                    plugin,
                    [record] * G,
                )
                for i, s in enumerate(group):
                    local.append(
                        {
                            "position": p,
                            "index": i,
                            "id": record.id,
                            "text": s.text,
                            **{k: v[i].item() for k, v in parts.items()},
                            "length": len(s.token_ids),
                            "finish_reason": s.finish_reason,
                        }
                    )
            samples = gather_step(local, dist)
            adv, components = score(samples, cache, cfg)
            # this rank's sequences, in step order
            rollout = rollout_batch(groups, prompt_ids, adv, positions, G)
            lap("score")
            if cfg.log.samples_every and step % cfg.log.samples_every == 0 and dist.is_main:
                run.log_samples(
                    step,
                    *write_samples(
                        run.dir / "samples",
                        step,
                        samples,
                        components,
                        adv,
                        [train_prompts[indices[p]][0] for p in range(B)],
                        cfg.log.samples_prompts,
                        cfg.reward.variant,
                    ),
                )

            # phase offload: the actor's shards and AdamW state back for experience and update
            offload.to_device()
            lap("offload")

            # ---------------------------------------------------------- reference and old log-probs
            if reference is not None:
                rollout.logp_ref = sequence_logprobs(reference, rollout, pad_id, cfg, dist, amp)
            minibatches = rollout.split(updates_per_step)
            # mini-batches after the first are off-policy: the sampling policy's log-probs, computed
            # now; the first updates the policy that sampled, so its logp_old is the update's own
            # detached logp_theta (SPEC §3 skips the pass only for a single mini-batch; the first of
            # several is as on-policy as that one)
            later = rollout.select(range(len(minibatches[0]), len(rollout)))
            old = sequence_logprobs(policy, later, pad_id, cfg, dist, amp)
            for u, minibatch in enumerate(minibatches[1:]):
                minibatch.logp_old = old[u * len(minibatch) : (u + 1) * len(minibatch)]
            lap("logprobs")

            # ------------------------------------------------------------ one update per mini-batch
            sums, grad_norms = [], []
            for u, minibatch in enumerate(minibatches):
                update_index = (step - 1) * updates_per_step + u
                lr = cfg.optim.lr * lr_factor(update_index, cfg.optim, steps * updates_per_step)
                set_lr(optimizer, lr)
                grad_norm, applied, update_sums = update(
                    policy, optimizer, minibatch, pad_id, cfg, dist, amp
                )
                sums.append(update_sums)
                grad_norms.append(grad_norm)
                if not applied:
                    skipped_updates += 1
                    print0(
                        f"step {step}: non-finite gradient norm {grad_norm}; update skipped", dist
                    )
            lap("update")
            # phase offload: the device is the engine's from here to the next experience pass
            offload.to_host()
            lap("offload")
            sync_weights(sampler, policy, cfg, dist)
            lap("sync")

            # ------------------------------------------------------------ log, validate, checkpoint
            row = {
                "step": step,
                "steps": steps,
                **step_metrics(samples, components, adv, G),
                **reduce_sums(sums, dist),
                "actor/grad_norm": sum(grad_norms) / len(grad_norms),
                "actor/lr": lr,
                "actor/skipped_updates": skipped_updates,
                "actor/updates": updates_per_step,
                "cache/steps": len(cache),
                "data/epoch": cursor.epoch,
                "data/filtered_prompts": too_long,
                **lap.row(),
            }
            # CUDA: per-phase peaks
            peak = max(lap.peaks.values()) if lap.peaks else peak_memory_gib(dist.device)
            row["perf/peak_mem_gib"] = float(all_reduce(torch.tensor(peak), dist, "max"))
            save = run.should_save(step)
            if valid_records and (save or step == steps):
                metrics, outputs = validate(
                    policy, sampler, tokenizer, valid_records, cfg, dist, offload.on_device, plugin
                )
                row.update(metrics)
            # before the save: a crash right after it must not lose the row of a step it kept
            run.log(row)
            # a signal on any rank during the step: its checkpoint, then out (not at the last)
            stop = run.preempted_after(step)
            if save or stop:
                checkpoint(
                    step,
                    cursor,
                    (valid_records, metrics, outputs) if valid_records and save else None,
                )
            run.advance(step, row)
            if stop or (save and (stop := run.preempted_after(step))):  # or during the save
                sampler.close()
                raise run.stop(stop)

    # ---------------------------------------------------------------- final export
    run.finish(policy, tokenizer)
    sampler.close()

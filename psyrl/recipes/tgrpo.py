"""T-GRPO: GRPO with the trajectory cache and the bilateral reward (paper §3.2, eq. 1-9; SPEC §2-4,
§9). `train` below is the whole loop, read top to bottom; `train_tgrpo.py` runs it.

    python train_tgrpo.py --config configs/tgrpo/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node 4 train_tgrpo.py --config configs/tgrpo/qwen2.5-3b.toml   (FSDP2)
    psyrl train-tgrpo ... / torchrun --nproc_per_node 4 -m psyrl train-tgrpo ...   (installed)

One step, one call per phase:
  1. sample      B prompts in a seeded, resumable order, split over ranks (a prompt's G responses
                 stay on one rank), G responses each from the sampler (rollout.filter_groups:
                 more rounds until B groups have unequal accuracies)
  2. score       each response's r_F1, r_fmt and p_rep (eq. 4-6, 9), gathered from every rank
  3. cache       the trajectory cache takes the step's F1s and lengths: L-bar, r-bar_F1 (eq. 7)
  4. rewards     the final reward of `reward.variant` (eq. 3, 8; appendix A.2), cached in turn
  5. advantages  eq. 2 over the cached final rewards (`advantage.scope`)
  6. experience  reference log-probs, and pi_old's for the mini-batches after the first
  7. updates     one optimiser step per mini-batch of `optim.global_batch` prompts (eq. 1)
  8. sync        the new weights into the sampler
  9. end         log, validate (every `checkpoint.every` steps and at the last), checkpoint
With `fsdp.offload = "phase"` the actor's shards and optimiser state leave the device before the
sync and the next rollout and come back for the experience pass. A checkpoint holds the model,
optimiser, RNG, data position and trajectory cache. A preemption signal (run.preempt_signals) on any
rank ends the run after the step it is in (with run.preempt_now: right after the sampling, dropping
the step), with a checkpoint and exit status 75.
"""

from __future__ import annotations

import contextlib
import json

from psyrl.core.checkpoints import json_text
from psyrl.core.config import Config
from psyrl.core.errors import RunError
from psyrl.core.records import Cursor, DataError, load_stimuliqa, next_indices
from psyrl.rl.fallbacks import masked_advantages
from psyrl.rl.rewards import final_rewards
from psyrl.rl.rollout import (
    Drawn,
    build_prompts,
    keep_groups,
    rank_positions,
    rollout_batch,
    sample_seed,
    varied_groups,
)
from psyrl.rl.scoring import answer_tensors, gather_samples, score_responses, step_metrics
from psyrl.rl.tgrpo import advantages
from psyrl.rl.trajectory_cache import TrajectoryCache
from psyrl.rl.update import experience, reduce_sums, update
from psyrl.run.directory import Run
from psyrl.run.launch import check_memory_plan, setup_errors
from psyrl.run.validation import load_valid_sets, longest_prompt, validate_sets
from psyrl.runtime.distributed import Dist, print0
from psyrl.runtime.model import autocast, load_tokenizer
from psyrl.runtime.offload import PhaseOffload
from psyrl.runtime.optim import build_optimizer, set_lr
from psyrl.runtime.policy import build_policy, build_reference, build_sampler, sync_weights
from psyrl.runtime.timing import PhaseTimer
from psyrl.signals.build import Accuracy

LINE_FIELDS = [
    ("reward", "reward/final", ".3f"),
    ("f1", "reward/f1", ".3f"),
    ("format", "reward/format", ".2f"),
    ("len", "response/length", ".0f"),
    ("kl", "actor/kl", ".4f"),
    ("grad", "actor/grad_norm", ".3f"),
    ("clip", "actor/clip_frac", ".3f"),
    ("judge fallbacks", "reward/judge_fallback_rate", ".2f"),  # with a judge only
    ("s/step", "time/step", ".1f"),
    ("valid f1", "valid/f1", ".4f"),
    ("valid acc", "valid/accuracy", ".4f"),
]


def check_batches(cfg: Config, dist: Dist) -> None:
    """The batch sizes a step can split (B prompts into mini-batches, a mini-batch over ranks), and
    the options that need another table's value."""
    B, batch, G = cfg.rollout.prompts, cfg.optim.global_batch, cfg.rollout.samples
    if B % batch:
        raise RunError(
            f"rollout.prompts = {B} must be a multiple of optim.global_batch = {batch} "
            "(each mini-batch of global_batch prompts is one update)"
        )
    if batch % dist.world:
        raise RunError(
            f"optim.global_batch = {batch} must be a multiple of the {dist.world} ranks "
            "(each rank takes an equal share of every mini-batch)"
        )
    if cfg.reward.overlong_buffer > cfg.rollout.max_new_tokens:
        raise RunError(
            f"reward.overlong_buffer = {cfg.reward.overlong_buffer} must be at most "
            f"rollout.max_new_tokens = {cfg.rollout.max_new_tokens} (the penalty's ramp ends there)"
        )
    T, top_p = cfg.rollout.temperature, cfg.rollout.top_p
    if cfg.loss.rollout_correction != "none" and cfg.sampler.engine == "vllm":
        if T not in (0, 1) and top_p < 1:
            raise RunError(
                f"loss.rollout_correction with sampler.engine = 'vllm' at rollout.temperature = {T}"
                f" and top_p = {top_p}: vLLM reports log-probs renormalised over the nucleus "
                "there (psyrl.runtime.vllm_sampler.logprobs_mode), biased by up to -log(top_p) a "
                "token, which the weights would multiply; use temperature 1 or top_p = 1"
            )
    if cfg.rollout.filter_groups and G < 2:
        raise RunError(
            f"rollout.filter_groups needs rollout.samples >= 2 (a group of {G} has no spread to "
            "filter on; verl keeps such groups)"
        )
    if cfg.advantage.scope == "group" and G < 2:
        raise RunError(
            f"advantage.scope = 'group' needs rollout.samples >= 2 (the std of a group of "
            f"{G} is undefined); use scope 'cache' or 'batch', or more samples"
        )


def train(cfg: Config, dist: Dist, overwrite: bool, resume: str) -> None:
    # --------------------------------------------------- setup: everything checked before any write
    run = Run(cfg, dist, "tgrpo", LINE_FIELDS, overwrite, resume)
    check_batches(cfg, dist)
    with setup_errors():
        train_records = load_stimuliqa(cfg.data.train_file)
        valid_sets = load_valid_sets(cfg)  # data.valid_file, then each of data.valid_files
        valid_records = [r for valid_set in valid_sets for r in valid_set.records]
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
    run.start(train_records, valid_records)
    with setup_errors():  # after start: a judge's score cache lives in the run directory
        # reward.accuracy's signals (the paper's F1 by default)
        accuracy = Accuracy(cfg, dist.device, run.dir / "judge_cache", dist.rank)
    pad_id = tokenizer.pad_token_id

    policy.train()
    optimizer = build_optimizer(policy, cfg.optim)
    offload = PhaseOffload(policy, optimizer, dist.device, cfg.fsdp.offload == "phase")
    # under FSDP its MixedPrecisionPolicy casts; one process autocasts
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

    def save(step: int, validation: tuple | None, cursor: Cursor) -> None:
        """checkpoints/step-N/ with the trainer's state at data position `cursor` (`validation`:
        (metrics, outputs) of the held-out items, or None)."""
        trainer = {
            "cursor": vars(cursor),
            "skipped_updates": skipped_updates,
            "sampler_seeds": "sha256(run.seed:step:prompt position)",
        }
        files = {"trajectory_cache.json": json_text(cache.state_dict())}
        held_out = (valid_sets, *validation) if validation else None
        run.save(step, policy, optimizer, tokenizer, trainer, files, held_out)

    def held_out() -> tuple[dict, list]:
        """Validation on every held-out set: (metrics, each set's outputs)."""
        return validate_sets(
            policy, sampler, tokenizer, valid_sets, cfg, dist, offload.on_device, accuracy
        )

    offload.to_host()  # before the engine starts: vLLM refuses a pool larger than the free memory
    longest = longest_prompt(valid_records, tokenizer, cfg)
    # the sampler's own copy of the weights, filled from the shards; closed after the final export
    with build_sampler(policy, cfg, tokenizer, dist, longest_prompt=longest) as sampler:
        params = sum(p.numel() for p in policy.parameters())
        run.banner(
            f"{params / 1e6:.2f}M parameters on {dist.world} x {dist.device}"
            f"{' (FSDP2, offload ' + cfg.fsdp.offload + ')' if dist.sharded else ''}; reward "
            f"{cfg.reward.variant}, advantage scope {cfg.advantage.scope}, cache {cfg.cache.size} "
            f"steps; {len(train_prompts)} training prompts ({too_long} over "
            f"{cfg.rollout.max_prompt_tokens} tokens dropped); {len(valid_records)} validation "
            f"items; {steps} steps of {B} prompts x {G} samples, {updates_per_step} update(s) each"
        )
        with run:
            # the starting model's scores: the baseline of every later row
            if valid_records and run.first == 1:
                metrics, _ = held_out()
                run.log({"step": 0, "steps": steps, **metrics}, echo=True)

            for step in range(run.first, steps + 1):
                # vLLM's sleep-mode pools are not the trainer's memory (psyrl.runtime.timing)
                timer = PhaseTimer(dist.device, sampler.pool_bytes)
                # ------------------------------------------- 1. sample G responses for every prompt
                # (rollout.filter_groups, DAPO: rounds of B more prompts until B groups have unequal
                # accuracies; the paper samples one round)
                before, drawn = cursor, []
                while True:
                    with timer("sample"):
                        indices, cursor = next_indices(
                            cursor, len(train_prompts), B, cfg.run.seed, cfg.data.shuffle
                        )
                        positions = rank_positions(B, batch, dist)  # this rank's prompts
                        seeds = [
                            sample_seed(cfg.run.seed, step, len(drawn) * B + p) for p in positions
                        ]
                        groups = sampler.generate(
                            [train_prompts[indices[p]][1] for p in positions],
                            G,
                            cfg.rollout.temperature,
                            cfg.rollout.top_p,
                            cfg.rollout.max_new_tokens,
                            seeds,
                        )
                    # run.preempt_now: a signal stops the run here, nothing of this step kept yet
                    # (the cache, model, data position are the previous step's; seeds are per step)
                    if cfg.run.preempt_now and (signal := run.preempted()):
                        if 0 < step - 1 != run.saved:
                            save(step - 1, None, before)
                        raise run.stop(signal)
                    # ------------------------- 2. score every response (eq. 4-6, 9), all ranks'
                    with timer("score"):
                        records = [train_prompts[indices[p]][0] for p in positions]
                        local = score_responses(
                            groups, records, positions, cfg.prompt.mode, cfg.reward, accuracy
                        )
                        samples = gather_samples(local, dist)  # B x G, in step order
                    drawn.append(Drawn(indices, positions, groups, samples))
                    if not cfg.rollout.filter_groups:
                        break
                    varied = sum(sum(varied_groups(d.samples, G)) for d in drawn)
                    if varied >= B or len(drawn) == cfg.rollout.filter_max_rounds:
                        break  # at the limit keep_groups fills the step with equal-accuracy groups
                # a judge's fallbacks: the first printed, too many stop the run (judge.*)
                accuracy.watch([s for d in drawn for s in d.samples], step, dist)

                with timer("score"):
                    filtered = {}
                    if cfg.rollout.filter_groups:  # the B groups kept, on the ranks that train them
                        kept, filtered = keep_groups(drawn, B, batch, G, dist)
                        indices, positions, groups = kept.indices, kept.positions, kept.groups
                        samples = kept.samples
                    parts, lengths = answer_tensors(samples)  # [B*G] each
                    keep = accuracy.kept(samples)  # judge.on_failure = "mask"; None: all count
                    # ------------- 3. the trajectory cache takes this step: L-bar, r-bar_F1 (eq. 7)
                    cache.push_answers(parts["f1"], lengths, keep)
                    mean_length, mean_f1 = cache.answer_stats()
                    # --------------------------------------- 4. final rewards (eq. 3, 8; A.2 11-15)
                    final, components = final_rewards(
                        parts, lengths, mean_length, mean_f1, cfg.reward, cfg.rollout.max_new_tokens
                    )
                    cache.push_rewards(final)
                    # -------------------------------- 5. advantages (eq. 2) over the cached rewards
                    a, pool = cfg.advantage, cache.rewards()
                    adv = advantages(final, a.scope, G, pool, a.eps, a.std)  # [B*G]
                    if keep is not None:  # judge.on_failure = "mask": unscored responses left out
                        adv = masked_advantages(final, keep, a.scope, G, pool, a.eps, a.std)
                    prompt_ids = [train_prompts[indices[p]][1] for p in positions]
                    rollout = rollout_batch(groups, prompt_ids, adv, positions, G)  # this rank's
                    scores = step_metrics(samples, components, adv, G)
                step_records = [train_prompts[indices[p]][0] for p in range(B)]
                run.write_samples(step, samples, components, adv, scores, step_records)

                # ------------------------------ 6. experience: reference and old log-probs, no grad
                with timer("offload"):
                    offload.to_device()  # the actor's shards and AdamW state, back from the host
                with timer("logprobs"):
                    minibatches = experience(
                        policy, reference, rollout, updates_per_step, pad_id, cfg, dist, amp
                    )

                # ----------------------------------------------------- 7. one update per mini-batch
                with timer("update"):
                    sums, grad_norms = [], []
                    for u, minibatch in enumerate(minibatches):
                        update_index = (step - 1) * updates_per_step + u
                        lr = cfg.optim.lr * run.lr_factor(update_index, updates_per_step)
                        set_lr(optimizer, lr)
                        grad_norm, applied, update_sums = update(
                            policy, optimizer, minibatch, pad_id, cfg, dist, amp
                        )
                        sums.append(update_sums)
                        grad_norms.append(grad_norm)
                        if not applied:
                            skipped_updates += 1
                            print0(
                                f"step {step}: non-finite gradient norm {grad_norm}; update "
                                "skipped",
                                dist,
                            )

                # --------------------------------------------- 8. sync the weights into the sampler
                with timer("offload"):
                    offload.to_host()  # the device is the engine's until the next experience pass
                with timer("sync"):
                    sync_weights(sampler, policy, cfg, dist)

                # ----------------------------------------------------- 9. log, validate, checkpoint
                row = {
                    "step": step,
                    "steps": steps,
                    **scores,
                    **filtered,
                    **reduce_sums(sums, dist),
                    "actor/grad_norm": sum(grad_norms) / len(grad_norms),
                    "actor/lr": lr,
                    "actor/skipped_updates": skipped_updates,
                    "actor/updates": updates_per_step,
                    "cache/steps": len(cache),
                    "data/epoch": cursor.epoch,
                    "data/filtered_prompts": too_long,
                    # time per phase; memory peaks, the largest rank's (the sampler's readings
                    # inside its phases, on CUDA, counted)
                    **timer.row(dist, sampler.memory_row()),
                }
                # the end of the step: validate when a checkpoint or the last step is due, log the
                # row (before the checkpoint: a crash right after a save must not lose its row),
                # save, stop when a rank got a preemption signal during the step or its save
                checkpoint = run.should_save(step)
                validation = None
                if valid_records and (checkpoint or step == steps):
                    validation = held_out()
                    row.update(validation[0])
                run.log(row)
                signal = run.preempted_after(step)
                if checkpoint or signal:
                    save(step, validation if checkpoint else None, cursor)
                run.advance(step, row)
                if signal or (checkpoint and (signal := run.preempted_after(step))):
                    raise run.stop(signal)

        # ----------------------------------------------------------------------------- final export
        run.finish(policy, tokenizer)

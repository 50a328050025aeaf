"""SFT / knowledge injection (paper §4.1 "Implementation Details", appendix A.4, appendix B).
`train` below is the whole loop, read top to bottom; `train_sft.py` runs it.

    python train_sft.py --config configs/sft/tiny.toml [--set table.key=value ...] [--resume [auto]]
    torchrun --nproc_per_node N train_sft.py --config ... [--resume [auto]]   (FSDP2, SPEC §1)
    psyrl train-sft ... / torchrun --nproc_per_node N -m psyrl train-sft ...         (installed)

Loss on response tokens only (the SFT target of SPEC §6 plus the end-of-turn token), normalised by
the response-token count of the whole optimiser step over all ranks; AdamW; linear warm-up then
cosine; gradient clipping; a non-finite gradient norm skips the update and is logged. A preemption
signal (run.preempt_signals) ends the run after the step it is in, with a checkpoint. Under torchrun
each rank takes a contiguous share of every step's sequences on an FSDP2-sharded model (optionally
CPU-offloaded, bf16 mixed precision). Every `checkpoint.every` steps the model is validated on
held-out items (F1, format, loss) and saved to `runs/<name>/checkpoints/step-N/` (HF export +
resumable state); appendix B starts GRPO from the checkpoint with the median F1 (`psyrl
select-checkpoint runs/<name>`). The final export is `runs/<name>/hf/`. `--resume` continues from
the newest complete checkpoint. Departures from the paper's stack (LLaMA-Factory + DeepSpeed
ZeRO-3): the loss is a token mean over the whole optimiser step rather than per micro-batch;
over-long examples are dropped, not truncated.
"""

from __future__ import annotations

import contextlib
import time

import torch

from psyrl.core.checkpoints import DamagedCheckpoint, select_checkpoint
from psyrl.core.config import Config
from psyrl.core.errors import RunError
from psyrl.core.records import Cursor, DataError, load_stimuliqa, next_indices
from psyrl.run.directory import Run
from psyrl.run.launch import check_memory_plan, setup_errors
from psyrl.run.validation import load_valid_sets, longest_prompt, validate_sets
from psyrl.runtime.distributed import Dist, all_reduce, print0, rank_share
from psyrl.runtime.model import autocast, load_tokenizer
from psyrl.runtime.optim import build_optimizer, clipped_step, set_lr
from psyrl.runtime.policy import build_policy, build_sampler, sync_weights
from psyrl.runtime.timing import peak_memory_gib
from psyrl.sft.loss import build_examples, micro_batch_losses, response_tokens
from psyrl.signals.build import Accuracy

LINE_FIELDS = [
    ("loss", "train/loss", ".4f"),
    ("grad", "train/grad_norm", ".3f"),
    ("lr", "train/lr", ".2e"),
    ("tok/s", "perf/tokens_per_s", ".0f"),
    ("peak GiB", "perf/peak_mem_gib", ".2f"),
    ("valid f1", "valid/f1", ".4f"),
    ("valid acc", "valid/accuracy", ".4f"),
    ("valid loss", "valid/loss", ".4f"),
]


def train(cfg: Config, dist: Dist, overwrite: bool, resume: str) -> None:
    # --------------------------------------------------- setup: everything checked before any write
    run = Run(cfg, dist, "sft", LINE_FIELDS, overwrite, resume)
    if cfg.optim.global_batch % dist.world:
        raise RunError(
            f"optim.global_batch = {cfg.optim.global_batch} must be a multiple of the "
            f"{dist.world} ranks (each rank takes an equal share of every step)"
        )
    with setup_errors():
        train_records = load_stimuliqa(cfg.data.train_file)
        valid_sets = load_valid_sets(cfg)  # data.valid_file, then each of data.valid_files
        tokenizer = load_tokenizer(cfg.model)
        check_memory_plan(cfg, dist, "sft")
        policy = build_policy(cfg, tokenizer, dist)
    examples, counts = build_examples(
        train_records, tokenizer, cfg.prompt, cfg.data.max_length, cfg.data.think_from
    )
    if not examples:
        raise DataError(f"{cfg.data.train_file}: no usable training example ({counts})")
    run.check_data(cfg.data.train_file, len(examples))
    valid_records = [r for valid_set in valid_sets for r in valid_set.records]
    run.start(train_records, valid_records)
    with setup_errors():  # after start: a judge's score cache lives in the run directory
        accuracy = Accuracy(cfg, dist.device, run.dir / "judge_cache", dist.rank)

    policy.train()
    optimizer = build_optimizer(policy, cfg.optim)
    # under FSDP its MixedPrecisionPolicy casts; one process autocasts
    amp = contextlib.nullcontext() if dist.sharded else autocast(cfg.model, dist.device)
    steps, batch, micro = cfg.run.steps, cfg.optim.global_batch, cfg.optim.micro_batch
    state = run.resume(policy, optimizer)
    cursor, skipped_updates = Cursor(**state.get("cursor", {})), state.get("skipped_updates", 0)
    params = sum(p.numel() for p in policy.parameters())
    offload = ", CPU offload" if cfg.fsdp.offload == "always" else ""
    run.banner(
        f"{params / 1e6:.2f}M parameters on {dist.world} x {dist.device}"
        f"{f' (FSDP2{offload})' if dist.sharded else ''}; {counts['kept']} training examples "
        f"(skipped: {counts['no_reasoning']} without {cfg.data.think_from}, {counts['too_long']} "
        f"over {cfg.data.max_length} tokens); {len(valid_records)} validation items; {steps} "
        f"steps of {batch} sequences"
    )

    def save(step: int, validation: tuple | None, cursor: Cursor) -> None:
        """checkpoints/step-N/ with the trainer's state at data position `cursor` (`validation`:
        (metrics, outputs) of the held-out items, or None)."""
        trainer = {"cursor": vars(cursor), "skipped_updates": skipped_updates}
        held_out = (valid_sets, *validation) if validation else None
        run.save(step, policy, optimizer, tokenizer, trainer, {}, held_out)

    def held_out(sync: bool = True) -> tuple[dict, list]:
        """Validation on every held-out set: (metrics, each set's outputs); `sync`: the policy has
        moved since the sampler got its weights."""
        if sync:
            sync_weights(sampler, policy, cfg, dist)
        return validate_sets(policy, sampler, tokenizer, valid_sets, cfg, dist, accuracy=accuracy)

    # validation's sampler (none without held-out items), closed after the final export
    sampler = None
    if valid_records:
        longest = longest_prompt(valid_records, tokenizer, cfg)
        temperature = cfg.rollout.valid_temperature  # it validates only
        sampler = build_sampler(policy, cfg, tokenizer, dist, temperature, longest)
    with sampler or contextlib.nullcontext():
        with run:
            # the untrained model's scores: the baseline of every later row
            if valid_records and run.first == 1:
                metrics, _ = held_out(sync=False)
                run.log({"step": 0, "steps": steps, **metrics}, echo=True)

            for step in range(run.first, steps + 1):
                # --------------------------------------------------------------- one optimiser step
                t0 = time.perf_counter()
                lr = cfg.optim.lr * run.lr_factor(step - 1)  # with --extend's rule
                set_lr(optimizer, lr)
                indices, cursor = next_indices(
                    cursor, len(examples), batch, cfg.run.seed, cfg.data.shuffle
                )
                step_examples = [examples[i] for i in indices]
                # global: the gradient does not depend on micro-batching
                normalizer = response_tokens(step_examples)
                loss_sum = torch.zeros((), device=dist.device)
                for loss in micro_batch_losses(
                    policy,
                    rank_share(step_examples, dist),
                    micro,
                    tokenizer.pad_token_id,
                    normalizer,
                    dist.device,
                    amp,
                    packed=cfg.model.packing,
                ):
                    loss.backward()
                    # read once per step: .item() per micro-batch would sync a GPU each time
                    loss_sum += loss.detach()
                grad_norm, applied = clipped_step(policy, optimizer, cfg.optim.grad_clip)
                if not applied:
                    skipped_updates += 1
                    print0(
                        f"step {step}: non-finite gradient norm {grad_norm}; update skipped", dist
                    )
                elapsed = time.perf_counter() - t0

                # -------------------------------------------------------- log, validate, checkpoint
                peak = all_reduce(torch.tensor(peak_memory_gib(dist.device)), dist, "max")
                row = {
                    "step": step,
                    "steps": steps,
                    "train/loss": all_reduce(loss_sum, dist).item(),
                    "train/grad_norm": grad_norm,
                    "train/lr": lr,
                    "train/tokens": sum(len(e.input_ids) for e in step_examples),
                    "train/response_tokens": normalizer,
                    "train/skipped_updates": skipped_updates,
                    "data/epoch": cursor.epoch,
                    "perf/step_s": elapsed,
                    "perf/peak_mem_gib": float(peak),
                }
                row["perf/tokens_per_s"] = row["train/tokens"] / elapsed
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
    # appendix B's choice reads data.valid_file's valid/f1
    if cfg.data.valid_file and cfg.checkpoint.every and dist.is_main:
        try:
            step, score, path = select_checkpoint(run.dir, "median")
        except DamagedCheckpoint as e:  # the run is complete: say why nothing is chosen
            print0(f"warning: sft: no median-F1 checkpoint chosen: {e}", dist)
        else:
            print0(
                f"sft: median-F1 checkpoint (appendix B): step {step}, valid F1 {score:.4f}, "
                f"{path / 'hf'}",
                dist,
            )

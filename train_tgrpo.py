"""T-GRPO: GRPO with the trajectory cache and the bilateral reward (paper §3.2, eq. 1-9; SPEC §2-4, §9).

    python train_tgrpo.py --config configs/tgrpo/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node 4 train_tgrpo.py --config configs/tgrpo/qwen2.5-3b.toml      (FSDP2, SPEC §1)

One step (SPEC §9): B prompts in a seeded, resumable order, split over ranks (a prompt's G samples stay on one
rank) -> G samples each from the sampler -> answers scored -> cache phase 1 over the records of all ranks
(L-bar, r-bar_F1) -> final rewards of `reward.variant` -> cache phase 2 -> advantages (eq. 2) -> reference
log-probs (and logp_old when a rollout gives several updates) -> one update per mini-batch of
`optim.global_batch` prompts -> weight sync to the sampler. Every `checkpoint.every` steps: validation on the
held-out split and `runs/<name>/checkpoints/step-N/` (model, optimiser, RNG, data position, trajectory cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import defaultdict
from pathlib import Path

import click
import torch

from psyrl import prompts
from psyrl.atomic import write_text
from psyrl.checkpoint import json_text, load_checkpoint
from psyrl.config import ConfigError
from psyrl.data import Cursor, DataError, load_records, load_stimuliqa, next_indices
from psyrl.distributed import Dist, all_gather_lists, all_reduce, print0, rank_share
from psyrl.model import autocast, load_tokenizer
from psyrl.optim import build_optimizer, clipped_step, lr_factor, set_lr
from psyrl.rewards import answer_components, final_rewards, reward_metrics
from psyrl.runlog import Laps, peak_memory_gib, step_line
from psyrl.sft import SFTExample, collate
from psyrl.tgrpo import advantages, tgrpo_loss
from psyrl.trainer import (
    build_policy,
    build_sampler,
    check_resume,
    check_run_dir,
    export_final,
    open_run_dir,
    read_trainer_state,
    rewind_metrics,
    run_entry,
    save_step,
    step_log,
    sync_weights,
    warn_about_inputs,
)
from psyrl.trajectory_cache import TrajectoryCache
from psyrl.validation import sample_items, validate

LINE_FIELDS = [("reward", "reward/final", ".3f"), ("f1", "reward/f1", ".3f"), ("format", "reward/format", ".2f"),
               ("len", "response/length", ".0f"), ("kl", "actor/kl", ".4f"), ("grad", "actor/grad_norm", ".3f"),
               ("clip", "actor/clip_frac", ".3f"), ("s/step", "time/step", ".1f"), ("valid f1", "valid/f1", ".4f"),
               ("valid acc", "valid/accuracy", ".4f")]
TOKEN_METRICS = ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "ppo_kl", "entropy")
SEQUENCE_METRICS = ("pg_loss", "kl")


def sample_seed(seed: int, step: int, position: int) -> int:
    """The sampling seed of the prompt at `position` of `step`: the same on any rank and after a resume."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{position}".encode()).digest()[:8], "little") >> 1


def rank_positions(prompts_per_step: int, global_batch: int, ctx: Dist) -> list[int]:
    """This rank's prompt positions within a step: its share of every mini-batch, so that each update finds its
    samples on the rank that generated them."""
    return [start + j for start in range(0, prompts_per_step, global_batch)
            for j in rank_share(range(global_batch), ctx)]


def check_batches(cfg, ctx: Dist) -> None:
    B, batch, G = cfg.rollout.prompts, cfg.optim.global_batch, cfg.rollout.samples
    if B % batch:
        raise click.ClickException(f"rollout.prompts = {B} must be a multiple of optim.global_batch = {batch} "
                                   "(each mini-batch of global_batch prompts is one update)")
    if batch % ctx.world:
        raise click.ClickException(f"optim.global_batch = {batch} must be a multiple of the {ctx.world} ranks "
                                   "(each rank takes an equal share of every mini-batch)")
    if cfg.advantage.scope == "group" and G < 2:
        raise click.ClickException(f"advantage.scope = 'group' needs rollout.samples >= 2 (the std of a group of "
                                   f"{G} is undefined); use scope 'cache' or 'batch', or more samples")


def build_prompts(records, tokenizer, cfg):
    """(records, prompt ids) of the training prompts that fit rollout.max_prompt_tokens, and the number dropped."""
    kept = []
    for r in records:
        ids = prompts.prompt_ids(tokenizer, r, cfg.prompt)
        if len(ids) <= cfg.rollout.max_prompt_tokens:
            kept.append((r, ids))
    return kept, len(records) - len(kept)


def gather_step(local: list[dict], ctx: Dist) -> list[dict]:
    """Every rank's sample records, in step order (position, then sample index): the same list on every rank."""
    return sorted(all_gather_lists(local, ctx), key=lambda s: (s["position"], s["index"]))


def score(samples: list[dict], cache: TrajectoryCache, cfg) -> tuple[torch.Tensor, dict]:
    """The two cache phases (SPEC §3) on the step's samples of all ranks: (advantages [B*G], reward components)."""
    parts = {k: torch.tensor([s[k] for s in samples], dtype=torch.float64) for k in ("f1", "fmt", "rep")}
    lengths = torch.tensor([s["length"] for s in samples], dtype=torch.float64)
    cache.push_answers(parts["f1"], lengths)
    mean_length, mean_f1 = cache.answer_stats()  # eq. 7, this step included
    final, components = final_rewards(parts, lengths, mean_length, mean_f1, cfg.reward)
    cache.push_rewards(final)
    adv = advantages(final, cfg.advantage.scope, cfg.rollout.samples, cache.rewards(), cfg.advantage.eps)
    return adv, components


def sequence_logprobs(model, sequences: list[SFTExample], size: int, pad_id: int, temperature: float, ctx: Dist,
                      amp) -> list[torch.Tensor]:
    """Per sequence, the log-probs of its response tokens under `model` (no gradient), `size` sequences a forward."""
    out = []
    with torch.no_grad():
        for start in range(0, len(sequences), size):
            chunk = sequences[start:start + size]
            input_ids, attention_mask, mask = (t.to(ctx.device) for t in collate(chunk, pad_id))
            with amp:
                logp = model(input_ids, attention_mask, temperature, mask)  # [b, T-1]
            out += [row[m].cpu() for row, m in zip(logp, mask)]
    return out


def as_padded(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence response values laid out on a collated batch's response mask [b, T-1]."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_scatter(
        mask, torch.cat(values).to(mask.device))


def update(policy, optimizer, batch: list[dict], normalizer: int, old: bool, pad_id: int, cfg, ctx: Dist, amp,
           sums: dict):
    """One optimiser step on this rank's share of a mini-batch (eq. 1), gradients accumulated over micro-batches;
    adds the loss metrics to `sums`. Without `old` (one update per rollout), logp_old is the update's own
    detached logp_theta (ratio 1, SPEC §3). Returns (grad norm, applied)."""
    size, T = cfg.optim.micro_batch, cfg.rollout.temperature
    for start in range(0, len(batch), size):
        chunk = batch[start:start + size]
        input_ids, attention_mask, mask = (t.to(ctx.device) for t in collate([s["sequence"] for s in chunk], pad_id))
        with amp:
            logp = policy(input_ids, attention_mask, T, mask)  # [b, T-1]
        logp_old = as_padded([s["logp_old"] for s in chunk], mask) if old else logp.detach()
        logp_ref = as_padded([s["logp_ref"] for s in chunk], mask) if cfg.loss.kl_coef > 0 else None
        adv = torch.tensor([s["advantage"] for s in chunk], dtype=torch.float32, device=ctx.device)
        loss, metrics = tgrpo_loss(logp, logp_old, adv, mask, normalizer, cfg.loss, logp_ref)
        loss.backward()
        tokens, sequences = metrics["tokens"].item(), metrics["sequences"].item()
        for key in TOKEN_METRICS:
            sums[key] += metrics[key].item() * tokens
        for key in SEQUENCE_METRICS:
            sums[key] += metrics[key].item() * sequences
        sums["tokens"] += tokens
        sums["sequences"] += sequences
        sampler_logp = as_padded([torch.tensor(s["sampler_logprobs"]) for s in chunk], mask)
        sums["gap"] += ((sampler_logp - logp_old.float()).abs() * mask).sum().item()  # the sampler/trainer gap
    return clipped_step(policy, optimizer, cfg.optim.grad_clip)


def reduce_sums(sums: dict, ctx: Dist) -> dict:
    """Loss metrics over all ranks: token-weighted and sequence-weighted means."""
    keys = sorted(sums)
    total = all_reduce(torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64), ctx)
    s = dict(zip(keys, total.tolist()))
    out = {f"actor/{k}": s[k] / max(s["tokens"], 1) for k in TOKEN_METRICS}
    out.update({f"actor/{k}": s[k] / max(s["sequences"], 1) for k in SEQUENCE_METRICS})
    out["actor/clip_frac"] = out["actor/clip_frac_high"] + out["actor/clip_frac_low"]
    out["rollout/logprob_gap"] = s["gap"] / max(s["tokens"], 1)
    return out


def step_metrics(samples: list[dict], components: dict, adv: torch.Tensor, G: int) -> dict:
    """Reward components (SPEC §2), response lengths, truncation and zero-variance groups of one step."""
    lengths = [s["length"] for s in samples]
    groups = components["final"].reshape(-1, G)
    return {**reward_metrics(components), "response/length_max": max(lengths),
            "response/truncated": sum(s["finish_reason"] == "length" for s in samples) / len(samples),
            "rollout/advantage_abs_mean": adv.abs().mean().item(),
            "rollout/zero_variance_groups": (groups.amax(dim=1) == groups.amin(dim=1)).double().mean().item()}


def write_samples(path: Path, samples: list[dict], components: dict, adv: torch.Tensor) -> None:
    """Every sample of a step with its reward components and advantage, one JSON object per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = [k for k in ("f1", "fmt", "rep", "br", "len", "short", "final") if k in components]
    write_text(path, "".join(json.dumps({"id": s["id"], "sample": s["index"], "response": s["text"],
                                         "tokens": s["length"], "finish_reason": s["finish_reason"],
                                         **{k: components[k][n].item() for k in keys}, "advantage": adv[n].item()})
                             + "\n" for n, s in enumerate(samples)))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="TOML run config, e.g. configs/tgrpo/tiny.toml.")
@click.option("--set", "overrides", multiple=True, metavar="TABLE.KEY=VALUE", help="Override one key; repeatable.")
@click.option("--overwrite", is_flag=True, help="Delete an existing runs/<name>/ and start over.")
@click.option("--resume", is_flag=True, help="Continue runs/<name>/ from its newest complete checkpoint (model, "
              "optimiser, trajectory cache, data position, RNG); the config may differ only in run.name, "
              "run.output_dir and the log, checkpoint and fsdp tables.")
def main(config_path, overrides, overwrite, resume):
    """T-GRPO on StimuliQA-format records: the trajectory cache and the bilateral reward of "From Stimuli to Minds".
    Starts from model.path (appendix B: the median-F1 SFT checkpoint). Run it with python (one process) or under
    torchrun (FSDP2 over all ranks)."""
    run_entry(train, config_path, overrides, overwrite, resume)


def train(cfg, ctx: Dist, overwrite: bool, resume: bool) -> None:
    # ---------------------------------------------------------------- setup: everything checked before any write
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    exists = check_run_dir(run_dir, overwrite, resume)
    check_batches(cfg, ctx)
    checkpoint = check_resume(run_dir, cfg, ctx) if resume else None
    try:
        train_records = load_stimuliqa(cfg.data.train_file)
        valid_records = sample_items(load_records(cfg.data.valid_file), cfg.data.valid_items, cfg.run.seed) \
            if cfg.data.valid_file else []
        tokenizer = load_tokenizer(cfg.model)
        train_prompts, too_long = build_prompts(train_records, tokenizer, cfg)
        if not train_prompts:
            raise DataError(f"{cfg.data.train_file}: all {too_long} prompts are longer than rollout.max_prompt_tokens "
                            f"= {cfg.rollout.max_prompt_tokens} tokens; nothing to train on")
        trainer, data_fingerprint = read_trainer_state(checkpoint, cfg.data.train_file, len(train_prompts))
        policy = build_policy(cfg, tokenizer, ctx)
        reference = build_policy(cfg, tokenizer, ctx, offload=cfg.fsdp.ref_offload) if cfg.loss.kl_coef > 0 else None
    except (ConfigError, DataError, OSError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    warn_about_inputs(cfg, ctx, train_records, valid_records)
    resolved = open_run_dir(run_dir, cfg, ctx, wipe=overwrite and exists)
    pad_id = tokenizer.pad_token_id

    policy.train()
    if reference is not None:  # pi_ref: the starting checkpoint, frozen (eq. 1's KL term)
        reference.eval().requires_grad_(False)
    optimizer = build_optimizer(policy, cfg.optim)
    amp = contextlib.nullcontext() if ctx.sharded else autocast(cfg.model, ctx.device)  # FSDP: MixedPrecisionPolicy
    B, G, batch, steps = cfg.rollout.prompts, cfg.rollout.samples, cfg.optim.global_batch, cfg.run.steps
    updates_per_step = B // batch
    cache = TrajectoryCache(cfg.cache.size)
    cursor, skipped_updates, first = Cursor(), 0, 1
    if checkpoint is not None:
        load_checkpoint(checkpoint, policy, optimizer, ctx, lambda line: print(f"rank {ctx.rank}: {line}", flush=True))
        cache.load_state_dict(json.loads((checkpoint / "trajectory_cache.json").read_text(encoding="utf-8")))
        cursor, skipped_updates, first = Cursor(**trainer["cursor"]), trainer["skipped_updates"], trainer["step"] + 1
        rewind_metrics(run_dir, trainer["step"], ctx)
    sampler = build_sampler(policy, cfg, tokenizer, ctx)  # its own copy, filled from the shards
    params = sum(p.numel() for p in policy.parameters())
    print0(f"tgrpo: {params / 1e6:.2f}M parameters on {ctx.world} x {ctx.device}"
           f"{' (FSDP2' + (', CPU offload' if cfg.fsdp.offload else '') + ')' if ctx.sharded else ''}; reward "
           f"{cfg.reward.variant}, advantage scope {cfg.advantage.scope}, cache {cfg.cache.size} steps; "
           f"{len(train_prompts)} training prompts ({too_long} over {cfg.rollout.max_prompt_tokens} tokens dropped); "
           f"{len(valid_records)} validation items; {steps} steps of {B} prompts x {G} samples, {updates_per_step} "
           f"update(s) each; run directory {run_dir}"
           f"{f'; resuming after step {first - 1} from {checkpoint}' if checkpoint else ''}", ctx)

    with step_log(run_dir, cfg, ctx, first, "tgrpo") as (log, bar):
        if valid_records and first == 1:  # the starting model's scores: the baseline of every later row
            metrics, _ = validate(policy, sampler, tokenizer, valid_records, cfg, ctx)
            log({"step": 0, "steps": steps, **metrics})
            print0(step_line({"step": 0, "steps": steps, **metrics}, LINE_FIELDS), ctx)

        for step in range(first, steps + 1):
            lap = Laps()
            # ---------------------------------------------------------------- sample G responses per prompt
            indices, cursor = next_indices(cursor, len(train_prompts), B, cfg.run.seed, cfg.data.shuffle)
            positions = rank_positions(B, batch, ctx)
            groups = sampler.generate([train_prompts[indices[p]][1] for p in positions], G, cfg.rollout.temperature,
                                      cfg.rollout.top_p, cfg.rollout.max_new_tokens,
                                      [sample_seed(cfg.run.seed, step, p) for p in positions])
            lap("sample")

            # ---------------------------------------------------------------- score, cache (two phases), advantages
            local = []
            for p, group in zip(positions, groups):
                record, prompt_ids = train_prompts[indices[p]]
                parts = answer_components([s.text for s in group], [record.answer] * G, cfg.prompt.mode, cfg.reward)
                for i, s in enumerate(group):
                    local.append({"position": p, "index": i, "id": record.id, "text": s.text,
                                  **{k: parts[k][i].item() for k in ("f1", "fmt", "rep")},
                                  "length": len(s.token_ids), "finish_reason": s.finish_reason})
            samples = gather_step(local, ctx)
            adv, components = score(samples, cache, cfg)
            mine = []  # this rank's sequences, in step order
            for p, group in zip(positions, groups):
                prompt_ids = train_prompts[indices[p]][1]
                for i, s in enumerate(group):
                    mine.append({"position": p, "advantage": adv[p * G + i].item(), "sampler_logprobs": s.logprobs,
                                 "sequence": SFTExample("", tuple(prompt_ids) + s.token_ids, len(prompt_ids))})
            lap("score")
            if cfg.log.samples_every and step % cfg.log.samples_every == 0 and ctx.is_main:
                write_samples(run_dir / "samples" / f"step-{step}.jsonl", samples, components, adv)

            # ---------------------------------------------------------------- reference and old log-probs
            sequences = [m["sequence"] for m in mine]
            size, T = cfg.optim.logprob_micro_batch, cfg.rollout.temperature
            if reference is not None:
                for m, lp in zip(mine, sequence_logprobs(reference, sequences, size, pad_id, T, ctx, amp)):
                    m["logp_ref"] = lp
            old = updates_per_step > 1  # later mini-batches are off-policy: keep the sampling policy's log-probs
            if old:
                for m, lp in zip(mine, sequence_logprobs(policy, sequences, size, pad_id, T, ctx, amp)):
                    m["logp_old"] = lp
            lap("logprobs")

            # ---------------------------------------------------------------- one update per mini-batch
            sums, grad_norms = defaultdict(float), []
            per_rank = len(mine) // updates_per_step
            for u in range(updates_per_step):
                update_index = (step - 1) * updates_per_step + u
                lr = cfg.optim.lr * lr_factor(update_index, cfg.optim, steps * updates_per_step)
                set_lr(optimizer, lr)
                grad_norm, applied = update(policy, optimizer, mine[u * per_rank:(u + 1) * per_rank], batch * G, old,
                                            pad_id, cfg, ctx, amp, sums)
                grad_norms.append(grad_norm)
                if not applied:
                    skipped_updates += 1
                    print0(f"step {step}: non-finite gradient norm {grad_norm}; update skipped", ctx)
            lap("update")
            sync_weights(sampler, policy, ctx)
            lap("sync")

            # ---------------------------------------------------------------- log, validate, checkpoint
            row = {"step": step, "steps": steps, **step_metrics(samples, components, adv, G), **reduce_sums(sums, ctx),
                   "actor/grad_norm": sum(grad_norms) / len(grad_norms), "actor/lr": lr,
                   "actor/skipped_updates": skipped_updates, "actor/updates": updates_per_step,
                   "cache/steps": len(cache), "data/epoch": cursor.epoch, "data/filtered_prompts": too_long,
                   **lap.row()}
            row["perf/peak_mem_gib"] = float(all_reduce(torch.tensor(peak_memory_gib(ctx.device)), ctx, "max"))
            save = cfg.checkpoint.every > 0 and (step % cfg.checkpoint.every == 0 or step == steps)
            if valid_records and (save or step == steps):
                metrics, outputs = validate(policy, sampler, tokenizer, valid_records, cfg, ctx)
                row.update(metrics)
            log(row)  # before the save: a crash right after it must not lose the row of a step it kept
            if save:
                files = {"config.resolved.toml": resolved,
                         "trainer.json": json_text({"step": step, "cursor": vars(cursor), "data": data_fingerprint,
                                                    "skipped_updates": skipped_updates,
                                                    "sampler_seeds": "sha256(run.seed:step:prompt position)"}),
                         "trajectory_cache.json": json_text(cache.state_dict())}
                save_step(run_dir, step, policy, optimizer, tokenizer, files,
                          (valid_records, metrics, outputs) if valid_records else None, cfg, ctx)
            bar.update(1)
            if step % cfg.log.every == 0 or step == steps:
                print0(step_line(row, LINE_FIELDS), ctx)

    # ---------------------------------------------------------------- final export
    export_final(policy, tokenizer, run_dir, ctx, "tgrpo")


if __name__ == "__main__":
    main()

"""Held-out validation during training: generate answers, score them with the reward's own F1 and
format checks (one definition, `psyrl.rl.rewards`), and the teacher-forced loss of the SFT targets.

Generation goes through the sampler interface (`psyrl.runtime.sampler`), the one the T-GRPO trainer
samples with: one response per item at `rollout.valid_temperature`, top-p `rollout.top_p`.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Sequence

import torch

from psyrl.core import prompts
from psyrl.core.config import Config
from psyrl.core.records import BenchmarkRecord, StimuliRecord
from psyrl.core.text import best_option, extract_answer
from psyrl.rl.rewards import answer_components, final_rewards
from psyrl.runtime.distributed import ONE_PROCESS, Dist, all_gather_lists, all_reduce, rank_share
from psyrl.runtime.model import autocast
from psyrl.sft.loss import build_examples, micro_batch_losses, response_tokens


def sample_items(records: Sequence, count: int, seed: int) -> list:
    """A fixed seeded sample of `count` records in file order (all of them when count is 0 or too
    large)."""
    if count == 0 or count >= len(records):
        return list(records)
    keep = sorted(random.Random(f"valid:{seed}").sample(range(len(records)), count))
    return [records[i] for i in keep]


def longest_prompt(records, tokenizer, cfg: Config) -> int:
    """Tokens of the longest held-out prompt (0 without records): the engine's sequences must hold
    it."""
    return max((len(prompts.prompt_ids(tokenizer, r, cfg.prompt)) for r in records), default=0)


def validate(
    policy,
    sampler,
    tokenizer,
    records: Sequence[StimuliRecord] | Sequence[BenchmarkRecord],
    cfg: Config,
    dist: Dist = ONE_PROCESS,
    actor_on_device=contextlib.nullcontext,
    accuracy=None,
):
    """(metrics, outputs): valid/f1 (eq. 4-5 on the extracted answer), valid/format (eq. 6),
    valid/length (tokens), valid/reward (the mean final reward of reward.variant, L-bar and r-bar_F1
    taken over these responses: the same items at every validation, so start and end compare without
    the prompt-to-prompt noise of a training step), and valid/loss (NLL per response token of the
    SFT targets) for StimuliQA records, or valid/accuracy (SPEC §7 F1-accuracy: the option of
    highest F1 to the answer; a tie is `E` and wrong) and valid/not_applicable (the fraction of E
    choices) for benchmark-schema records; outputs: one `psyrl.runtime.sampler.Completion` per
    record, in record order.

    `sampler` generates (it holds an unsharded model); `policy` (sharded or not) scores the loss,
    inside `actor_on_device()` (T-GRPO's phase offload brings the actor's shards back for it). Items
    are split across ranks; every rank gets all metrics. Item i is sampled with seed run.seed + i on
    whatever rank it lands."""
    was_training = policy.training
    policy.eval()
    amp = autocast(cfg.model, dist.device)
    local = rank_share(list(enumerate(records)), dist)
    ids = [prompts.prompt_ids(tokenizer, r, cfg.prompt) for _, r in local]
    samples = sampler.generate(
        ids,
        1,
        cfg.rollout.valid_temperature,
        cfg.rollout.top_p,
        cfg.rollout.max_new_tokens,
        [cfg.run.seed + i for i, _ in local],
    )
    mine = [group[0] for group in samples]
    # each rank scores its own items (an encoder or a judge works on a share), then all gather
    local_parts = answer_components(
        [s.text for s in mine],
        [r.answer for _, r in local],
        cfg.prompt.mode,
        cfg.reward,
        accuracy,
        [r for _, r in local],
    )
    rows = [{k: v[n].item() for k, v in local_parts.items()} for n in range(len(mine))]
    gathered = all_gather_lists(list(zip(mine, rows)), dist)
    outputs = [s for s, _ in gathered]
    parts = {
        k: torch.tensor([row[k] for _, row in gathered], dtype=torch.float64)
        for k in gathered[0][1]
    }
    lengths = torch.tensor([len(s.token_ids) for s in outputs], dtype=torch.float64)
    final, _ = final_rewards(
        parts, lengths, lengths.mean().item(), parts["f1"].mean().item(), cfg.reward
    )
    metrics = {
        # reward.variant's final reward, these items as a one-step cache
        "valid/reward": final.mean().item(),
        "valid/f1": parts.get("accuracy/f1", parts["f1"]).mean().item(),  # eq. 4-5, always
        "valid/format": parts["fmt"].mean().item(),
        "valid/length": lengths.mean().item(),
        "valid/items": len(records),
    }
    # each signal beyond the paper's F1 (reward.accuracy, .mix, .log_accuracy), and the one in
    # r_F1's role in valid/reward
    for key in (k for k in parts if k.startswith("accuracy/")):
        metrics[f"valid/{key}"] = parts[key].mean().item()
    if accuracy is not None and not accuracy.paper:
        metrics["valid/reward_accuracy"] = parts["f1"].mean().item()
    if isinstance(records[0], BenchmarkRecord):  # SPEC §7 F1-accuracy; no SFT target, so no loss
        choices = [
            best_option(extract_answer(s.text), list(r.options)) for s, r in zip(outputs, records)
        ]
        metrics["valid/accuracy"] = sum(
            c == r.answer_index for c, r in zip(choices, records)
        ) / len(records)
        metrics["valid/not_applicable"] = sum(c is None for c in choices) / len(records)
        policy.train(was_training)
        return metrics, outputs
    examples, _ = build_examples(
        records, tokenizer, cfg.prompt, cfg.data.max_length, cfg.data.think_from
    )
    if examples:
        size = cfg.optim.logprob_micro_batch
        largest_share = math.ceil(len(examples) / dist.world)
        # every rank runs this many forwards (FSDP all-gathers)
        batches = math.ceil(largest_share / size)
        # FSDP's MixedPrecisionPolicy casts instead
        policy_amp = contextlib.nullcontext() if dist.sharded else amp
        with torch.no_grad(), actor_on_device():
            losses = micro_batch_losses(
                policy,
                rank_share(examples, dist),
                size,
                tokenizer.pad_token_id,
                response_tokens(examples),
                dist.device,
                policy_amp,
                batches,
                examples[0],
                cfg.model.packing,
            )
            metrics["valid/loss"] = all_reduce(torch.stack(list(losses)).sum(), dist).item()
    policy.train(was_training)
    return metrics, outputs

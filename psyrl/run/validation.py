"""Held-out validation during training: generate answers, score them with the reward's own F1 and
format checks (one definition, `psyrl.rl.rewards`), and the teacher-forced loss of the SFT targets.

Generation goes through the sampler interface (`psyrl.runtime.sampler`), the one the T-GRPO trainer
samples with: `data.valid_samples` responses per item (1, the paper's) at
`rollout.valid_temperature`, top-p `rollout.top_p`. Held-out sets: `data.valid_file` (keys
`valid/...`) and each of `data.valid_files` (keys `valid/<stem>/...`), scored one after the other.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from psyrl.core import prompts
from psyrl.core.config import Config
from psyrl.core.records import BenchmarkRecord, StimuliRecord, load_records
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


@dataclass
class ValidSet:
    """One held-out set: `name` "" for data.valid_file (keys `valid/...`), else the file's stem
    (keys `valid/<name>/...`); `records`, its seeded sample of data.valid_items."""

    name: str
    file: str
    records: list

    @property
    def prefix(self) -> str:
        return f"valid/{self.name}/" if self.name else "valid/"

    @property
    def responses_file(self) -> str:
        """Its responses in checkpoints/step-N/."""
        return f"validation-{self.name}.jsonl" if self.name else "validation.jsonl"


def load_valid_sets(cfg: Config) -> list[ValidSet]:
    """data.valid_file (when set), then data.valid_files in order, each loaded and sampled by
    `sample_items` with data.valid_items and run.seed, as if it were the only one."""
    named = [("", cfg.data.valid_file)] if cfg.data.valid_file else []
    named += [(Path(f).stem, f) for f in cfg.data.valid_files]
    return [
        ValidSet(name, f, sample_items(load_records(f), cfg.data.valid_items, cfg.run.seed))
        for name, f in named
    ]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one item from n samples, c of them correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), in exact
    integers (C(n-c, k) = 0 when n - c < k: some correct sample is always drawn)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_at_n(scores: torch.Tensor) -> float:
    """mean@n: the mean over items of each item's mean score over its n samples. `scores`:
    [items, n]."""
    return scores.mean(dim=1).mean().item()


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
    prefix: str = "valid/",
):
    """(metrics, outputs): valid/f1 (eq. 4-5 on the extracted answer), valid/format (eq. 6),
    valid/length (tokens), valid/reward (the mean final reward of reward.variant, L-bar and r-bar_F1
    taken over these responses: the same items at every validation, so start and end compare without
    the prompt-to-prompt noise of a training step), and valid/loss (NLL per response token of the
    SFT targets) for StimuliQA records, or valid/accuracy (SPEC §7 F1-accuracy: the option of
    highest F1 to the answer; a tie is `E` and wrong) and valid/not_applicable (the fraction of E
    choices) for benchmark-schema records; outputs: the `psyrl.runtime.sampler.Completion`s,
    data.valid_samples per record (item-major), in record order. Every key starts with `prefix`
    (`valid/<name>/` for a data.valid_files set).

    With n = data.valid_samples > 1 those keys score each item's first response, and
    valid/f1_mean@n (benchmarks also valid/accuracy_mean@n) and valid/pass@n score all n
    (`mean_at_n`, `pass_at_k` with k = n; correct: F1 = 1, or the right option; the key's docstring
    says why).

    `sampler` generates (it holds an unsharded model); `policy` (sharded or not) scores the loss,
    inside `actor_on_device()` (T-GRPO's phase offload brings the actor's shards back for it). Items
    are split across ranks; every rank gets all metrics. Item i is sampled with seed run.seed + i on
    whatever rank it lands."""
    was_training = policy.training
    policy.eval()
    amp = autocast(cfg.model, dist.device)
    n = cfg.data.valid_samples
    local = rank_share(list(enumerate(records)), dist)
    ids = [prompts.prompt_ids(tokenizer, r, cfg.prompt) for _, r in local]
    samples = sampler.generate(
        ids,
        n,
        cfg.rollout.valid_temperature,
        cfg.rollout.top_p,
        cfg.rollout.max_new_tokens,
        [cfg.run.seed + i for i, _ in local],
    )
    mine = [s for group in samples for s in group]  # n per item, item-major
    mine_records = [r for _, r in local for _ in range(n)]
    # each rank scores its own items (an encoder or a judge works on a share), then all gather
    local_parts = answer_components(
        [s.text for s in mine],
        [r.answer for r in mine_records],
        cfg.prompt.mode,
        cfg.reward,
        accuracy,
        mine_records,
    )
    rows = [{k: v[j].item() for k, v in local_parts.items()} for j in range(len(mine))]
    gathered = all_gather_lists(list(zip(mine, rows)), dist)
    outputs = [s for s, _ in gathered]
    every = {
        k: torch.tensor([row[k] for _, row in gathered], dtype=torch.float64)
        for k in gathered[0][1]
    }
    # the usual keys: each item's first response (all of them when n = 1)
    parts = {k: v[::n] for k, v in every.items()}
    firsts = outputs[::n]
    lengths = torch.tensor([len(s.token_ids) for s in firsts], dtype=torch.float64)
    final, _ = final_rewards(
        parts,
        lengths,
        lengths.mean().item(),
        parts["f1"].mean().item(),
        cfg.reward,
        cfg.rollout.max_new_tokens,
    )
    metrics = {
        # reward.variant's final reward, these items as a one-step cache
        "reward": final.mean().item(),
        "f1": parts.get("accuracy/f1", parts["f1"]).mean().item(),  # eq. 4-5, always
        "format": parts["fmt"].mean().item(),
        "length": lengths.mean().item(),
        "items": len(records),
    }
    # each signal beyond the paper's F1 (reward.accuracy, .mix, .log_accuracy), and the one in
    # r_F1's role in valid/reward
    for key in (k for k in parts if k.startswith("accuracy/")):
        metrics[key] = parts[key].mean().item()
    if accuracy is not None and not accuracy.paper:
        metrics["reward_accuracy"] = parts["f1"].mean().item()
    f1 = every.get("accuracy/f1", every["f1"]).view(len(records), n)  # [items, n]
    if isinstance(records[0], BenchmarkRecord):  # SPEC §7 F1-accuracy; no SFT target, so no loss
        answers = [r.answer_index for r in records for _ in range(n)]
        choices = [
            best_option(extract_answer(s.text), list(r.options))
            for s, r in zip(outputs, (r for r in records for _ in range(n)))
        ]
        right = torch.tensor([c == a for c, a in zip(choices, answers)], dtype=torch.float64)
        right = right.view(len(records), n)  # [items, n]
        metrics["accuracy"] = right[:, 0].sum().item() / len(records)
        metrics["not_applicable"] = sum(c is None for c in choices[::n]) / len(records)
    else:
        right = f1 == 1.0  # [items, n]; eq. 4-5 is 2c/(|pred|+|gold|): exactly 1 iff the sets match
        metrics.update(validation_loss(policy, records, tokenizer, cfg, dist, actor_on_device, amp))
    if n > 1:
        metrics[f"f1_mean@{n}"] = mean_at_n(f1)
        if isinstance(records[0], BenchmarkRecord):
            metrics[f"accuracy_mean@{n}"] = mean_at_n(right.double())
        correct = right.sum(dim=1).tolist()  # [items]
        metrics[f"pass@{n}"] = sum(pass_at_k(n, int(c), n) for c in correct) / len(records)
    policy.train(was_training)
    return {prefix + k: v for k, v in metrics.items()}, outputs


def validation_loss(
    policy, records, tokenizer, cfg: Config, dist: Dist, actor_on_device, amp
) -> dict[str, float]:
    """{"loss": NLL per response token of the records' SFT targets}, or {} when none has one."""
    examples, _ = build_examples(
        records, tokenizer, cfg.prompt, cfg.data.max_length, cfg.data.think_from
    )
    if not examples:
        return {}
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
        return {"loss": all_reduce(torch.stack(list(losses)).sum(), dist).item()}


def validate_sets(
    policy,
    sampler,
    tokenizer,
    sets: Sequence[ValidSet],
    cfg: Config,
    dist: Dist = ONE_PROCESS,
    actor_on_device=contextlib.nullcontext,
    accuracy=None,
) -> tuple[dict, list[list]]:
    """`validate` on each held-out set in turn: (every set's metrics under its own prefix, each
    set's outputs)."""
    metrics, outputs = {}, []
    for held_out in sets:
        scores, completions = validate(
            policy,
            sampler,
            tokenizer,
            held_out.records,
            cfg,
            dist,
            actor_on_device,
            accuracy,
            held_out.prefix,
        )
        metrics.update(scores)
        outputs.append(completions)
    return metrics, outputs

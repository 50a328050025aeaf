"""A T-GRPO step's rollout on each rank (SPEC §3, §9): the training prompts, which rank samples
which prompt, the sampling seeds, the groups kept under rollout.filter_groups (DAPO's dynamic
sampling), and `RolloutBatch`, the typed batch of this rank's sequences that the experience pass
fills in and the updates read."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from psyrl.core import prompts
from psyrl.core.config import Config
from psyrl.runtime.distributed import Dist, rank_share, scatter_lists


def sample_seed(seed: int, step: int, position: int) -> int:
    """The sampling seed of the prompt at `position` of `step`: the same on any rank and after a
    resume."""
    return (
        int.from_bytes(hashlib.sha256(f"{seed}:{step}:{position}".encode()).digest()[:8], "little")
        >> 1
    )


def rank_positions(prompts_per_step: int, global_batch: int, dist: Dist) -> list[int]:
    """This rank's prompt positions within a step: its share of every mini-batch, so that each
    update finds its samples on the rank that generated them."""
    return [
        start + j
        for start in range(0, prompts_per_step, global_batch)
        for j in rank_share(range(global_batch), dist)
    ]


def build_prompts(records, tokenizer, cfg: Config) -> tuple[list, int]:
    """(records, prompt ids) of the training prompts that fit rollout.max_prompt_tokens, and the
    number dropped."""
    kept = []
    for r in records:
        ids = prompts.prompt_ids(tokenizer, r, cfg.prompt)
        if len(ids) <= cfg.rollout.max_prompt_tokens:
            kept.append((r, ids))
    return kept, len(records) - len(kept)


@dataclass
class Drawn:
    """A step's prompts and responses: one sampling round, or the groups kept from several
    (rollout.filter_groups)."""

    indices: list[int]
    """The step's prompts, position by position, as indices into the training prompts (every
    rank)."""
    positions: list[int]
    """This rank's positions in the step (`rank_positions`)."""
    groups: list
    """This rank's G completions of the prompt at each of its positions."""
    samples: list
    """Every rank's scored responses (psyrl.rl.scoring.Sample), in step order."""


def varied_groups(samples: Sequence, G: int) -> list[bool]:
    """rollout.filter_groups: whether each group of G consecutive samples has unequal accuracies
    (r_F1, or the signal in its role); verl's DAPO filter drops a group whose metric has std 0
    (verl/trainer/ppo/v1/replay_buffer.py:295 at 1dda039)."""
    f1 = [s.f1 for s in samples]
    return [max(f1[k : k + G]) > min(f1[k : k + G]) for k in range(0, len(f1), G)]


def choose_groups(varied: list[list[bool]], prompts: int) -> tuple[list[tuple[int, int]], int]:
    """The step's `prompts` groups as (round, position), from each round's `varied_groups`: the
    varied ones in sampling order, the first `prompts` of them; when there are fewer, the earliest
    all-equal ones fill the rest. Returns (chosen, how many were filled)."""
    order = [(r, p) for r, flags in enumerate(varied) for p in range(len(flags))]
    kept = [(r, p) for r, p in order if varied[r][p]][:prompts]
    fill = [(r, p) for r, p in order if not varied[r][p]][: prompts - len(kept)]
    return kept + fill, len(fill)


def keep_groups(drawn: list[Drawn], prompts: int, global_batch: int, G: int, dist: Dist):
    """rollout.filter_groups: the step's `prompts` groups chosen from every round drawn
    (`choose_groups`), renumbered 0.. in that order and laid over the ranks as `rank_positions`
    lays out a step: a group may move to another rank. Returns (the step, its rollout/filter_*
    metrics). Every rank chooses alike from the samples (on every rank); a kept group's completions
    go to the rank that trains it alone, a dropped group's nowhere."""
    varied = [varied_groups(d.samples, G) for d in drawn]
    chosen, filled = choose_groups(varied, prompts)
    mine = {(r, p): group for r, d in enumerate(drawn) for p, group in zip(d.positions, d.groups)}
    ranks = [
        rank_positions(prompts, global_batch, replace(dist, rank=r)) for r in range(dist.world)
    ]
    outgoing = [[(k, mine[chosen[k]]) for k in ks if chosen[k] in mine] for ks in ranks]
    completions = dict(scatter_lists(outgoing, dist))  # this rank's kept groups, by new position
    renumber = {key: k for k, key in enumerate(chosen)}
    samples = [
        replace(s, position=renumber[r, s.position])
        for r, d in enumerate(drawn)
        for s in d.samples
        if (r, s.position) in renumber
    ]
    positions = rank_positions(prompts, global_batch, dist)
    step = Drawn(
        [drawn[r].indices[p] for r, p in chosen],
        positions,
        [completions[k] for k in positions],
        sorted(samples, key=lambda s: (s.position, s.index)),
    )
    n_varied = sum(map(sum, varied))
    return step, {
        "rollout/filter_rounds": len(drawn),
        "rollout/filter_dropped": len(drawn) * prompts - n_varied,
        "rollout/filter_surplus": max(n_varied - prompts, 0),
        "rollout/filter_filled": filled,
    }


@dataclass
class RolloutBatch:
    """One rank's sequences of a step, in step order: what the experience pass fills in and the
    update reads."""

    token_ids: list[tuple[int, ...]]
    """Prompt then response, per sequence."""
    prompt_lengths: list[int]
    """Tokens of each sequence's prompt: the rest is the response, the tokens the loss sees."""
    advantages: list[float]
    """A_i of eq. 2, one per sequence."""
    sampler_logprobs: list[list[float]]
    """The sampler's log-prob of each response token (the sampler/trainer gap,
    rollout/logprob_gap; loss.rollout_correction's pi_sampler)."""
    truncated: list[bool]
    """Whether rollout.max_new_tokens cut the response (finish reason `length`):
    loss.mask_truncated leaves those out of the loss."""
    logp_ref: list[torch.Tensor] | None = None
    """pi_ref's log-prob of each response token (eq. 1's KL term); None when loss.kl_coef = 0."""
    logp_old: list[torch.Tensor] | None = None
    """pi_old's log-prob of each response token; None: the policy has not moved since sampling (the
    first mini-batch of a rollout), and the update takes its own detached logp_theta (ratio 1, SPEC
    §3)."""

    def __len__(self) -> int:
        return len(self.token_ids)

    def select(self, indices) -> RolloutBatch:
        """The sequences at `indices`, in that order, with everything known about them."""
        pick = lambda values: None if values is None else [values[i] for i in indices]
        return RolloutBatch(
            pick(self.token_ids),
            pick(self.prompt_lengths),
            pick(self.advantages),
            pick(self.sampler_logprobs),
            pick(self.truncated),
            pick(self.logp_ref),
            pick(self.logp_old),
        )

    def split(self, parts: int) -> list[RolloutBatch]:
        """`parts` equal consecutive slices: a rank's share of each mini-batch (`rank_positions`
        orders them)."""
        size = len(self) // parts
        return [self.select(range(k * size, (k + 1) * size)) for k in range(parts)]


def rollout_batch(
    groups, prompt_ids: list[list[int]], adv: torch.Tensor, positions: list[int], G: int
) -> RolloutBatch:
    """This rank's batch: the G samples of the prompt at each of its `positions` (prompt_ids[k] is
    the prompt of positions[k]), with their advantages from the step's advantages over all ranks,
    adv [B*G]."""
    token_ids, prompt_lengths, advantages, sampler_logprobs, truncated = [], [], [], [], []
    for p, ids, group in zip(positions, prompt_ids, groups):
        for i, s in enumerate(group):
            token_ids.append(tuple(ids) + s.token_ids)
            prompt_lengths.append(len(ids))
            advantages.append(adv[p * G + i].item())
            sampler_logprobs.append(s.logprobs)
            truncated.append(s.finish_reason == "length")
    return RolloutBatch(token_ids, prompt_lengths, advantages, sampler_logprobs, truncated)

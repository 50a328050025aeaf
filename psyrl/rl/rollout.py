"""One T-GRPO step's samples across ranks (SPEC §3, §9): training prompts, sampling seeds, which
rank samples which prompt, the records every rank gathers, the two trajectory-cache phases that turn
them into advantages, the typed batch of this rank's sequences that the experience pass and the
update read, the step's reward metrics and the readable dump of its samples."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from psyrl.core import prompts
from psyrl.core.atomic import write_text
from psyrl.rl.rewards import final_rewards, reward_metrics
from psyrl.rl.tgrpo import advantages
from psyrl.rl.trajectory_cache import TrajectoryCache
from psyrl.runtime.distributed import Dist, all_gather_lists, rank_share


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


def build_prompts(records, tokenizer, cfg):
    """(records, prompt ids) of the training prompts that fit rollout.max_prompt_tokens, and the
    number dropped."""
    kept = []
    for r in records:
        ids = prompts.prompt_ids(tokenizer, r, cfg.prompt)
        if len(ids) <= cfg.rollout.max_prompt_tokens:
            kept.append((r, ids))
    return kept, len(records) - len(kept)


def gather_step(local: list[dict], dist: Dist) -> list[dict]:
    """Every rank's sample records, in step order (position, then sample index): the same list on
    every rank."""
    return sorted(all_gather_lists(local, dist), key=lambda s: (s["position"], s["index"]))


def score(samples: list[dict], cache: TrajectoryCache, cfg) -> tuple[torch.Tensor, dict]:
    """The two cache phases (SPEC §3) on the step's samples of all ranks: (advantages [B*G], reward
    components)."""
    parts = {
        k: torch.tensor([s[k] for s in samples], dtype=torch.float64) for k in ("f1", "fmt", "rep")
    }
    lengths = torch.tensor([s["length"] for s in samples], dtype=torch.float64)
    cache.push_answers(parts["f1"], lengths)
    mean_length, mean_f1 = cache.answer_stats()  # eq. 7, this step included
    final, components = final_rewards(parts, lengths, mean_length, mean_f1, cfg.reward)
    cache.push_rewards(final)
    adv = advantages(
        final, cfg.advantage.scope, cfg.rollout.samples, cache.rewards(), cfg.advantage.eps
    )
    return adv, components


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
    rollout/logprob_gap)."""
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
    token_ids, prompt_lengths, advantages, sampler_logprobs = [], [], [], []
    for p, ids, group in zip(positions, prompt_ids, groups):
        for i, s in enumerate(group):
            token_ids.append(tuple(ids) + s.token_ids)
            prompt_lengths.append(len(ids))
            advantages.append(adv[p * G + i].item())
            sampler_logprobs.append(s.logprobs)
    return RolloutBatch(token_ids, prompt_lengths, advantages, sampler_logprobs)


def step_metrics(samples: list[dict], components: dict, adv: torch.Tensor, G: int) -> dict:
    """Reward components (SPEC §2), response lengths, truncation and zero-variance groups of one
    step."""
    lengths = [s["length"] for s in samples]
    groups = components["final"].reshape(-1, G)
    # a reward plug-in's extra components, and the paper's F1 beside its accuracy
    extra = sorted({k for s in samples for k in s if k.startswith("custom/") or k == "token_f1"})
    return {
        **{
            f"reward/{k.removeprefix('custom/')}": sum(s[k] for s in samples) / len(samples)
            for k in extra
        },
        **reward_metrics(components),
        "response/length_max": max(lengths),
        "response/truncated": sum(s["finish_reason"] == "length" for s in samples) / len(samples),
        "rollout/advantage_abs_mean": adv.abs().mean().item(),
        "rollout/zero_variance_groups": (groups.amax(dim=1) == groups.amin(dim=1))
        .double()
        .mean()
        .item(),
    }


COLUMNS = {
    "f1": "F1",
    "fmt": "format",
    "rep": "rep. penalty",
    "br": "BR",
    "len": "length",
    "short": "short",
    "final": "final",
}  # reward components as SPEC §2 names them; a variant has a subset


def write_samples(
    directory: Path,
    step: int,
    samples: list[dict],
    components: dict,
    adv: torch.Tensor,
    records: list,
    shown: int,
    variant: str,
) -> tuple[list[dict], str]:
    """samples/step-N.jsonl (every sample of the step with its reward components and advantage) and
    samples/step-N.md (the first `shown` prompts with their G responses: what people read); returns
    both (the rows and the Markdown) for the trackers."""
    directory.mkdir(parents=True, exist_ok=True)
    keys = [k for k in COLUMNS if k in components]
    rows = [
        {
            "id": s["id"],
            "sample": s["index"],
            "response": s["text"],
            "tokens": s["length"],
            "finish_reason": s["finish_reason"],
            **{k: components[k][n].item() for k in keys},
            "advantage": adv[n].item(),
        }
        for n, s in enumerate(samples)
    ]
    write_text(directory / f"step-{step}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    markdown = samples_markdown(step, rows, components, records, shown, variant)
    write_text(directory / f"step-{step}.md", markdown)
    return rows, markdown


def samples_markdown(
    step: int, rows: list[dict], components: dict, records: list, shown: int, variant: str
) -> str:
    """One step's first `shown` prompts as Markdown: story, question, gold answer, then per response
    its reward components, advantage, length and finish reason, and the response text itself."""
    keys = [k for k in COLUMNS if k in components]
    G = len(rows) // len(records)
    means = reward_metrics(components)
    out = [
        f"# Step {step}",
        "",
        f"{len(records)} prompts x {G} samples, reward `{variant}`. Step means over all "
        f"{len(rows)} samples (the `metrics.jsonl` row of this step): "
        + ", ".join(
            f"{name} {means[label]:.3f}"
            for name, label in (
                ("final", "reward/final"),
                ("F1", "reward/f1"),
                ("format", "reward/format"),
                ("length", "response/length"),
            )
            if label in means
        )
        + ".",
        f"The first {min(shown, len(records))} prompts follow; every sample is in "
        f"`step-{step}.jsonl`.",
        "",
    ]
    for p, record in enumerate(records[:shown]):
        group = rows[p * G : (p + 1) * G]
        out += [
            f"## Prompt {p + 1}: `{record.id}`",
            "",
            quote(record.stimuli),
            ">",
            quote(f"**Q:** {record.question}"),
            "",
            f"Gold answer: **{record.answer}**",
            "",
            "| sample | "
            + " | ".join(COLUMNS[k] for k in keys)
            + " | advantage | tokens | finish |",
            "| ---: | " + " | ".join("---:" for _ in keys) + " | ---: | ---: | --- |",
        ]
        out += [
            f"| {r['sample']} | "
            + " | ".join(f"{r[k]:.3f}" for k in keys)
            + f" | {r['advantage']:+.3f} | {r['tokens']} | {r['finish_reason']} |"
            for r in group
        ]
        out.append("")
        for r in group:
            # a response cannot close its own block
            fence = "`" * max(3, longest_backtick_run(r["response"]) + 1)
            out += [f"Sample {r['sample']}:", "", f"{fence}text", r["response"], fence, ""]
    return "\n".join(out)


def quote(text: str) -> str:
    return "\n".join(f"> {line}" for line in text.splitlines() or [""])


def longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)

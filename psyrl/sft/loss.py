"""Supervised fine-tuning examples and loss (knowledge injection, paper §4.1, appendix A.4 and B).

An example is the rendered prompt followed by the SFT target of SPEC §6 and the end-of-turn token;
only the target and that token carry loss (the model must learn to stop, not to write prompts). The
prompt and the target are tokenized separately, exactly as sampling sees them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from psyrl.core import prompts
from psyrl.core.config import PromptConfig
from psyrl.core.records import StimuliRecord, sft_target
from psyrl.runtime.model import collate, pack


@dataclass(frozen=True)
class SFTExample:
    id: str
    input_ids: tuple[int, ...]
    prompt_len: int
    """input_ids[prompt_len:] is the response (target + end-of-turn): the tokens that carry loss."""


def build_examples(
    records: Sequence[StimuliRecord],
    tokenizer,
    cfg: PromptConfig,
    max_length: int,
    think_from: str = "reasoning",
):
    """(examples, counts): in `cot` mode the think text is each record's `think_from` field
    (data.think_from: `reasoning` or `reason`); records without it and examples over max_length are
    skipped and counted (counts keys: kept, no_reasoning, too_long)."""
    examples, counts = [], Counter(kept=0, no_reasoning=0, too_long=0)
    for r in records:
        target = sft_target(r, cfg.mode, think_from)
        if target is None:
            counts["no_reasoning"] += 1
            continue
        prompt = prompts.prompt_ids(tokenizer, r, cfg)
        response = tokenizer(target, add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
        if len(prompt) + len(response) > max_length:
            counts["too_long"] += 1
            continue
        examples.append(SFTExample(r.id, tuple(prompt + response), len(prompt)))
        counts["kept"] += 1
    return examples, dict(counts)


def response_tokens(examples: Sequence[SFTExample]) -> int:
    return sum(len(e.input_ids) - e.prompt_len for e in examples)


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Summed negative log-likelihood of the response tokens over `normalizer`, the response-token
    count of the whole optimiser step (all micro-batches, all ranks): the gradient does not depend
    on how the step is split."""
    return -(logp * loss_mask).sum() / normalizer  # logp, loss_mask: [B, T-1]


def micro_batch_losses(
    policy,
    examples: Sequence[SFTExample],
    size: int,
    pad_id: int,
    normalizer: float,
    device: torch.device,
    amp,
    batches: int = 0,
    filler: SFTExample | None = None,
    packed: bool = False,
):
    """Each micro-batch's share of the step's SFT loss, in order; their sum is the loss of all
    `examples`. Training calls backward on each, validation sums them under no_grad. `policy` is a
    `psyrl.runtime.model.Policy`. batches > the micro-batches `examples` fill: the rest run `filler`
    with weight 0, so that every FSDP rank takes part in the same number of forward passes (their
    all-gathers) even when its share is smaller. `packed`: each micro-batch one padding-free row
    (`psyrl.runtime.model.pack`); which examples form a micro-batch is the same either way."""
    starts = range(0, len(examples), size)
    for k in range(max(len(starts), batches)):
        chunk, weight = (
            (examples[starts[k] : starts[k] + size], 1.0) if k < len(starts) else ([filler], 0.0)
        )
        token_ids, prompt_lengths = [e.input_ids for e in chunk], [e.prompt_len for e in chunk]
        if packed:
            row = pack(token_ids, prompt_lengths).to(device)
            inputs, loss_mask = {"input_ids": row}, row.layout
        else:
            input_ids, attention_mask, loss_mask = (
                t.to(device) for t in collate(token_ids, prompt_lengths, pad_id)
            )
            inputs = {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "positions": loss_mask,
            }
        with amp:
            logp = policy(**inputs)  # [b, T-1]
        yield sft_loss(logp, loss_mask, normalizer) * weight

"""Held-out validation during training: generate answers, score them with the reward's own F1 and format
checks (one definition, `psyrl.rewards`), and the teacher-forced loss of the SFT targets.

Generation here is transformers' `generate` with a KV cache and a fully explicit generation config (a
model directory's own settings, such as Qwen2.5-Instruct's repetition penalty, never leak in); the
T-GRPO issue's sampler interface replaces it so that vLLM can serve it on GPU nodes.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Sequence

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from psyrl import prompts
from psyrl.config import Config
from psyrl.data import StimuliRecord
from psyrl.distributed import ONE_PROCESS, Dist, all_gather_lists, all_reduce, rank_share
from psyrl.model import autocast, stop_token_ids
from psyrl.rewards import answer_components
from psyrl.sft import build_examples, micro_batch_losses, response_tokens


def sample_items(records: Sequence, count: int, seed: int) -> list:
    """A fixed seeded sample of `count` records in file order (all of them when count is 0 or too large)."""
    if count == 0 or count >= len(records):
        return list(records)
    keep = sorted(random.Random(f"valid:{seed}").sample(range(len(records)), count))
    return [records[i] for i in keep]


def generation_config(tokenizer, max_new_tokens: int, temperature: float, top_p: float) -> GenerationConfig:
    """Everything `generate` may use, stated: temperature 0 = greedy; no top-k, no repetition penalty."""
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 else \
        {"do_sample": False}
    return GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=stop_token_ids(tokenizer),
                            pad_token_id=tokenizer.pad_token_id, repetition_penalty=1.0, **sampling)


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: Sequence[Sequence[int]], config: GenerationConfig, seed: int, batch: int,
             device: torch.device, amp=None, progress: bool = False):
    """Per prompt: (response token ids up to and including the first stop token, decoded text without it).
    Prompts are batched by length (less padding) and returned in input order."""
    stops = set(stop_token_ids(tokenizer))
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    results: list = [None] * len(prompt_ids)
    starts = range(0, len(order), batch)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in tqdm(starts, desc="validate", unit="batch", leave=False, disable=not progress):
            chunk = order[start:start + batch]
            width = max(len(prompt_ids[i]) for i in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)  # [b, P] left-padded
            mask = torch.zeros_like(ids)
            for row, i in enumerate(chunk):
                ids[row, width - len(prompt_ids[i]):] = torch.tensor(prompt_ids[i])
                mask[row, width - len(prompt_ids[i]):] = 1
            with amp if amp is not None else torch.autocast(device.type, enabled=False):
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     generation_config=config)  # [b, P + new]
            for row, i in enumerate(chunk):
                response = out[row, width:].tolist()
                end = next((k for k, t in enumerate(response) if t in stops), None)
                response = response if end is None else response[:end + 1]
                text_ids = response if end is None else response[:-1]
                results[i] = (response, tokenizer.decode(text_ids, skip_special_tokens=False))
    return results


def validate(policy, generator, tokenizer, records: Sequence[StimuliRecord], cfg: Config, ctx: Dist = ONE_PROCESS,
             progress: bool = False):
    """(metrics, outputs): valid/f1 (eq. 4-5 on the extracted answer), valid/format (eq. 6), valid/length (tokens),
    valid/loss (NLL per response token of the SFT targets); outputs as `generate` returns them, in record order.

    `generator` is an unsharded model that samples (`policy.lm` in one process, a full copy on each rank under
    FSDP); `policy` (sharded or not) scores the loss. Items are split across ranks; every rank gets all metrics."""
    was_training = policy.training
    policy.eval()
    generator.eval()
    amp = autocast(cfg.model, ctx.device)
    local = rank_share(records, ctx)
    ids = [prompts.prompt_ids(tokenizer, r, cfg.prompt) for r in local]
    config = generation_config(tokenizer, cfg.rollout.max_new_tokens, cfg.rollout.valid_temperature,
                               cfg.rollout.top_p)
    outputs = all_gather_lists(generate(generator, tokenizer, ids, config, cfg.run.seed, cfg.rollout.valid_batch,
                                        ctx.device, amp, progress), ctx)
    parts = answer_components([text for _, text in outputs], [r.answer for r in records], cfg.prompt.mode, cfg.reward)
    metrics = {
        "valid/f1": parts["f1"].mean().item(),
        "valid/format": parts["fmt"].mean().item(),
        "valid/length": sum(len(resp) for resp, _ in outputs) / len(outputs),
        "valid/items": len(records),
    }
    examples, _ = build_examples(records, tokenizer, cfg.prompt, cfg.data.max_length)
    if examples:
        size = cfg.optim.logprob_micro_batch
        largest_share = math.ceil(len(examples) / ctx.world)
        batches = math.ceil(largest_share / size)  # every rank runs this many forwards (FSDP all-gathers)
        policy_amp = contextlib.nullcontext() if ctx.sharded else amp  # FSDP's MixedPrecisionPolicy casts instead
        with torch.no_grad():
            losses = micro_batch_losses(policy, rank_share(examples, ctx), size, tokenizer.pad_token_id,
                                        response_tokens(examples), ctx.device, policy_amp, batches, examples[0])
            metrics["valid/loss"] = all_reduce(torch.stack(list(losses)).sum(), ctx).item()
    policy.train(was_training)
    return metrics, outputs

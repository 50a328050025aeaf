"""Held-out validation during training: generate answers, score them with the reward's own F1 and format
checks (one definition, `psyrl.rewards`), and the teacher-forced loss of the SFT targets.

Generation here is transformers' `generate` with a KV cache; the T-GRPO issue's sampler interface
replaces it so that vLLM can serve it on GPU nodes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from psyrl import prompts
from psyrl.config import Config
from psyrl.data import StimuliRecord
from psyrl.model import autocast, token_logprobs
from psyrl.rewards import answer_components
from psyrl.sft import build_examples, collate, response_tokens, sft_loss


def sample_items(records: Sequence, count: int, seed: int) -> list:
    """A fixed seeded sample of `count` records in file order (all of them when count is 0 or too large)."""
    if count == 0 or count >= len(records):
        return list(records)
    keep = sorted(random.Random(f"valid:{seed}").sample(range(len(records)), count))
    return [records[i] for i in keep]


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
             seed: int, batch: int, device: torch.device, amp=None):
    """Per prompt: (response token ids up to and including the first end-of-turn, decoded text without it).
    Prompts are batched by length (less padding) and returned in input order; temperature 0 = greedy."""
    stop_ids = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    results: list = [None] * len(prompt_ids)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, len(order), batch):
            chunk = order[start:start + batch]
            width = max(len(prompt_ids[i]) for i in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)  # [b, P] left-padded
            mask = torch.zeros_like(ids)
            for row, i in enumerate(chunk):
                ids[row, width - len(prompt_ids[i]):] = torch.tensor(prompt_ids[i])
                mask[row, width - len(prompt_ids[i]):] = 1
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 \
                else {"do_sample": False}
            with amp if amp is not None else torch.autocast(device.type, enabled=False):
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     max_new_tokens=max_new_tokens, eos_token_id=stop_ids,
                                     pad_token_id=tokenizer.pad_token_id, **sampling)
            for row, i in enumerate(chunk):
                response = out[row, width:].tolist()
                end = next((k for k, t in enumerate(response) if t in stop_ids), None)
                response = response if end is None else response[:end + 1]
                text_ids = response if end is None else response[:-1]
                results[i] = (response, tokenizer.decode(text_ids, skip_special_tokens=False))
    return results


def validate(model, tokenizer, records: Sequence[StimuliRecord], cfg: Config, device: torch.device) -> dict:
    """(metrics, outputs): valid/f1 (eq. 4-5 on the extracted answer), valid/format (eq. 6), valid/length (tokens),
    valid/loss (NLL per response token of the SFT targets); outputs as `generate` returns them, in record order."""
    was_training = model.training
    model.eval()
    amp = autocast(cfg.model, device)
    ids = [prompts.prompt_ids(tokenizer, r, cfg.prompt) for r in records]
    outputs = generate(model, tokenizer, ids, cfg.rollout.max_new_tokens, cfg.rollout.valid_temperature,
                       cfg.run.seed, cfg.rollout.valid_batch, device, amp)
    parts = answer_components([text for _, text in outputs], [r.answer for r in records], cfg.prompt.mode, cfg.reward)
    metrics = {
        "valid/f1": parts["f1"].mean().item(),
        "valid/format": parts["fmt"].mean().item(),
        "valid/length": sum(len(resp) for resp, _ in outputs) / len(outputs),
        "valid/items": len(records),
    }
    examples, _ = build_examples(records, tokenizer, cfg.prompt, max_length=10**9)
    if examples:
        total, normalizer = 0.0, response_tokens(examples)
        with torch.no_grad(), amp:
            for start in range(0, len(examples), cfg.rollout.valid_batch):
                input_ids, attention_mask, loss_mask = collate(examples[start:start + cfg.rollout.valid_batch],
                                                               tokenizer.pad_token_id)
                loss_mask = loss_mask.to(device)
                logp = token_logprobs(model, input_ids.to(device), attention_mask.to(device), 1.0, loss_mask)
                total += sft_loss(logp, loss_mask, normalizer).item()
        metrics["valid/loss"] = total
    model.train(was_training)
    return metrics, outputs

"""The sampler: G responses per prompt, with the sampler's own token log-probs, and the weight sync.

One small interface the trainer calls (SPEC §9 `sampler` table), implemented here in PyTorch for CPUs
and tests; a vLLM engine implements the same two calls:
  generate(prompt_token_ids, n, temperature, top_p, max_new_tokens, seed) -> per prompt, n `Sample`s;
  load_weights(iterator of (name, tensor)) -> the fresh weights, one tensor at a time.
`TorchSampler` holds its OWN unsharded copy of the model, as a colocated vLLM engine does: the trainer
updates its FSDP shards, then streams full tensors into this copy (`psyrl.distributed.gather_full_state_dict`).

Sampling is exact nucleus sampling with a KV cache and last-position logits only. Each prompt has its own
seeded generator, and a token is drawn by the exponential race argmax(p_i / E_i), E_i ~ Exp(1) over the
whole vocabulary, so the random draw does not depend on how the nucleus was found, on the batch a prompt
shares, or on the rank it runs on. The logits themselves can differ in their last bits with the batch's
padding and shapes: in float32 on a CPU that has not changed a sampled token in the tests; in bf16 a
near-tie can flip, so 1 rank and N ranks are then equal in distribution, not token for token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import DynamicCache

from psyrl.model import load_weights, stop_token_ids

TOP_K_PRECUT = 64  # candidates tried before the full sort; enough when the distribution is peaked


@dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]
    """The response: generated tokens up to and including the first stop token."""
    text: str
    """The response decoded without its stop token."""
    finish_reason: str
    """`stop` (a stop token was generated) or `length` (max_new_tokens reached first)."""
    logprobs: tuple[float, ...]
    """The sampler's log softmax(logits / T) of each response token over the full vocabulary (T = 1 when greedy)."""


def nucleus_mask(probs: torch.Tensor, top_p: float, precut: int = TOP_K_PRECUT) -> torch.Tensor:
    """Bool [b, V]: the smallest set of most probable tokens whose mass reaches top_p, per row (top-p of
    Holtzman et al.; the first token is always kept). A top-k pre-cut is used only for rows whose k most
    probable tokens already hold top_p of the mass, where it gives the same set (up to the order of exactly
    tied probabilities at the cut); other rows take the full sort."""
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    k = min(precut, probs.shape[-1])
    top, top_idx = probs.topk(k, dim=-1)  # [b, k], descending
    mask = torch.zeros_like(probs, dtype=torch.bool)
    cheap = top.sum(-1) >= top_p  # [b]: the nucleus lies inside the top k
    if cheap.any():
        keep = _mass_before(top[cheap]) < top_p  # the mass before a token is below top_p: it is still needed
        mask[cheap] = torch.zeros_like(mask[cheap]).scatter(-1, top_idx[cheap], keep)
    if (~cheap).any():
        sorted_p, sorted_idx = probs[~cheap].sort(dim=-1, descending=True)
        keep = _mass_before(sorted_p) < top_p
        mask[~cheap] = torch.zeros_like(mask[~cheap]).scatter(-1, sorted_idx, keep)
    return mask


def _mass_before(sorted_p: torch.Tensor) -> torch.Tensor:
    """Exclusive cumulative sum along the last dim (0 for the first token); exact prefix sums, not cumsum - p."""
    return torch.cat([torch.zeros_like(sorted_p[..., :1]), sorted_p[..., :-1].cumsum(-1)], dim=-1)


def draw(probs: torch.Tensor, mask: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One token per row from probs restricted to mask: argmax p_i / E_i with E_i ~ Exp(1) (the exponential race,
    equivalent to sampling the renormalised distribution). Row r takes its noise from generators[r]."""
    noise = torch.stack([torch.empty(probs.shape[-1], device=probs.device).exponential_(generator=g)
                         for g in generators])  # [b, V]
    return torch.where(mask, probs / noise, -1.0).argmax(dim=-1)  # [b]


class TorchSampler:
    """Batched autoregressive sampling on a plain (unsharded) transformers causal LM."""

    def __init__(self, model, tokenizer, device: torch.device, batch: int = 64, amp=None, progress: bool = False):
        self.model, self.tokenizer, self.device, self.batch = model.eval(), tokenizer, device, batch
        self.amp, self.progress = amp, progress
        self.stops = stop_token_ids(tokenizer)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The weight sync: copy each (name, full tensor) into this sampler's own model as it arrives."""
        load_weights(self.model, named_tensors)

    @torch.no_grad()
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int | Sequence[int]) -> list[list[Sample]]:
        """n samples for each prompt, in prompt order. temperature 0 = greedy. `seed`: one per prompt, or an int
        from which prompt i takes seed + i; a prompt's samples depend only on its prompt, its seed and the
        weights, never on the other prompts of the call."""
        seeds = [seed + i for i in range(len(prompt_token_ids))] if isinstance(seed, int) else list(seed)
        if len(seeds) != len(prompt_token_ids):
            raise ValueError(f"{len(seeds)} seeds for {len(prompt_token_ids)} prompts")
        if any(len(p) == 0 for p in prompt_token_ids):
            raise ValueError("an empty prompt: every prompt needs at least one token")
        per_call = max(1, self.batch // n)  # whole prompts per forward: a prompt's n rows share one generator
        order = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))  # less padding
        results: list = [None] * len(prompt_token_ids)
        starts = range(0, len(order), per_call)
        for start in tqdm(starts, desc="sample", unit="batch", leave=False, disable=not self.progress):
            chunk = order[start:start + per_call]
            samples = self._generate_rows([prompt_token_ids[i] for i in chunk], n, temperature, top_p,
                                          max_new_tokens, [seeds[i] for i in chunk])
            for k, i in enumerate(chunk):
                results[i] = samples[k * n:(k + 1) * n]
        return results

    def _generate_rows(self, prompts, n, temperature, top_p, max_new_tokens, seeds) -> list[Sample]:
        rows = [list(p) for p in prompts for _ in range(n)]
        generators = []
        for s in seeds:  # one generator per prompt, shared by its n rows in order
            g = torch.Generator(device=self.device).manual_seed(s)
            generators += [g] * n
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)  # [b, P] left-padded
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)  # [b, P]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, P]: padding does not shift positions
        cache = DynamicCache(config=self.model.config)
        stops = torch.tensor(self.stops, device=self.device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        tokens, logps = [], []
        for _ in range(max_new_tokens):
            with self.amp if self.amp is not None else torch.autocast(self.device.type, enabled=False):
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                 use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()  # [b, V]
            logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)  # [b, V]
            if temperature > 0:
                probs = logp.exp()
                token = draw(probs, nucleus_mask(probs, top_p), generators)  # [b]
            else:
                token = logits.argmax(dim=-1)
            token = torch.where(done, pad, token)  # finished rows idle on padding
            tokens.append(token)
            logps.append(logp.gather(-1, token[:, None]).squeeze(-1))
            done |= torch.isin(token, stops)
            if done.all():
                break
            ids = token[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=-1)
            positions = positions[:, -1:] + 1
        return [self._sample(row, tokens, logps) for row in range(len(rows))]

    def _sample(self, row: int, tokens: list[torch.Tensor], logps: list[torch.Tensor]) -> Sample:
        ids = [int(t[row]) for t in tokens]
        end = next((k for k, t in enumerate(ids) if t in self.stops), None)
        kept = len(ids) if end is None else end + 1
        text_ids = ids[:kept] if end is None else ids[:end]
        return Sample(tuple(ids[:kept]), self.tokenizer.decode(text_ids, skip_special_tokens=False),
                      "length" if end is None else "stop", tuple(float(lp[row]) for lp in logps[:kept]))

"""The sampler: G responses per prompt, with the sampler's own token log-probs, and the weight sync.

One small interface the trainer calls (SPEC §9 `sampler` table), implemented here in PyTorch for
CPUs and tests, and on a colocated vLLM engine in `psyrl.runtime.vllm_sampler` (`sampler.engine =
"vllm"`):
  generate(prompt_token_ids, n, temperature, top_p, max_new_tokens, seed) -> per prompt, n
  `Completion`s;
  load_weights(iterator of (name, tensor)) -> the fresh weights, one tensor at a time;
  close() -> at the end of the run, after its last collective.
`TorchSampler` holds its OWN unsharded copy of the model, as a colocated vLLM engine does: the
trainer updates its FSDP shards, then streams full tensors into this copy
(`psyrl.runtime.distributed.gather_full_state_dict`).

Sampling is exact nucleus sampling with a KV cache and last-position logits only. A token is drawn
from the full distribution by inverse CDF and redrawn until it falls in the nucleus (rejection:
exact, and no sort of a 152k vocabulary per token, which cost more than the model's forward at
Qwen2.5's vocabulary). Each prompt has its own seeded generator, read in row order, so a prompt's
draws do not depend on the batch it shares or on the rank it runs on. The logits themselves can
differ in their last bits with the batch's padding and shapes: in float32 on a CPU that has not
changed a sampled token in the tests; in bf16 a near-tie can flip, so 1 rank and N ranks are then
equal in distribution, not token for token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import DynamicCache

from psyrl.core.errors import Preempted
from psyrl.runtime.model import load_weights, stop_token_ids

# then a row samples its sorted nucleus directly (only when the nucleus holds little mass)
REJECTION_ROUNDS = 16


@dataclass(frozen=True)
class Completion:
    """One response of the sampler to one prompt."""

    token_ids: tuple[int, ...]
    """The response: generated tokens up to and including the first stop token."""
    text: str
    """The response decoded without its stop token."""
    finish_reason: str
    """`stop` (a stop token was generated) or `length` (max_new_tokens reached first)."""
    logprobs: tuple[float, ...]
    """The sampler's log softmax(logits / T) of each response token over the full vocabulary (T = 1
    when greedy)."""


class ClosedAfterUse:
    """`with sampler:` closes the sampler when the block ends, after the run's last collective: on
    success or preemption, where every rank gets to; after an error another rank may still be in a
    collective, and the process just ends."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None or issubclass(kind, Preempted):
            self.close()


def nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool [b, V]: the nucleus of top-p (Holtzman et al.) by a full sort, the reference `draw` is
    tested against. A token is in it when the mass of the tokens strictly more probable than it is
    below top_p: the smallest set of most probable tokens whose mass reaches top_p, plus any token
    tied with the last one (no sort order decides a tie). Sums in float64."""
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_p, order = probs.double().sort(dim=-1, descending=True)
    before = torch.cat([torch.zeros_like(sorted_p[..., :1]), sorted_p[..., :-1].cumsum(-1)], dim=-1)
    # a tie run takes the mass before its first token
    first_of_tie = torch.searchsorted(-sorted_p, -sorted_p)
    keep = before.gather(-1, first_of_tie) < top_p
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, keep)


def in_nucleus(probs: torch.Tensor, tokens: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool [b]: whether each row's token is in its nucleus (`nucleus_mask`'s rule), without a sort.
    A token of probability p > 1 - top_p is in, since the mass above it is at most 1 - p (the common
    case for a trained model); other rows sum the mass above their token in one pass, in float32
    unless the sum lies within 1e-4 of top_p, where that row is summed again in float64."""
    if top_p >= 1.0:
        return torch.ones_like(tokens, dtype=torch.bool)
    p = probs.gather(-1, tokens[:, None])  # [b, 1]
    # mass above <= 1 - p < top_p (probs sum to 1 within 1e-4)
    inside = p.squeeze(-1) > 1.0 - top_p + 1e-4
    rows = (~inside).nonzero().flatten()
    if len(rows) == 0:
        return inside
    sub, p = (probs, p) if len(rows) == len(probs) else (probs[rows], p[rows])
    # mass of the strictly more probable tokens
    above = torch.where(sub > p, sub, 0.0).sum(-1).double()
    for r in ((above - top_p).abs() < 1e-4).nonzero().flatten().tolist():
        # too close to call in float32
        above[r] = torch.where(sub[r] > p[r], sub[r], 0.0).double().sum().item()
    inside[rows] = above < top_p
    return inside


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """[b] token ids: for each row the token where the cumulative mass crosses u * total (u in [0,
    1)), so a token is hit with probability p_i / total. Two levels: block sums, then a cumulative
    sum inside one block, so the vocabulary is read once and never sorted."""
    b, V = probs.shape
    n = V // block * block
    sums = probs[:, :n].reshape(b, -1, block).sum(-1)  # [b, V // block]
    if n < V:
        sums = torch.cat([sums, probs[:, n:].sum(-1, keepdim=True)], dim=-1)
    edges = sums.double().cumsum(-1)  # [b, blocks]
    below = lambda x: torch.nextafter(x, torch.zeros_like(x))  # the largest double under x
    # [b, 1], < the total
    target = torch.minimum(u.double()[:, None] * edges[:, -1:], below(edges[:, -1:]))
    # [b, 1]: edges[blk - 1] <= target < edges[blk]
    blk = torch.searchsorted(edges, target, right=True)
    start = (blk * block).squeeze(-1)  # [b]
    offsets = torch.arange(block, device=probs.device)
    index = (start[:, None] + offsets).clamp(max=V - 1)
    inside = torch.where(start[:, None] + offsets < V, probs.gather(-1, index), 0.0)  # [b, block]
    before = torch.where(blk > 0, edges.gather(-1, (blk - 1).clamp(min=0)), 0.0)  # [b, 1]
    local = before + inside.double().cumsum(-1)  # [b, block]
    # The float32 block sum can exceed the float64 sum of its entries by a rounding: keep the target
    # under the block's own end, so the token found has local[k - 1] <= target < local[k], i.e.
    # probability > 0.
    pos = torch.searchsorted(local, torch.minimum(target, below(local[:, -1:])), right=True)
    return start + pos.squeeze(-1)


def uniforms(generators: Sequence[torch.Generator], rows: list[int], device) -> torch.Tensor:
    return torch.stack(
        [torch.rand((), generator=generators[r], dtype=torch.float64, device=device) for r in rows]
    )


def draw(probs: torch.Tensor, top_p: float, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One token per row from probs renormalised over the row's nucleus, by rejection: draw from the
    full distribution (inverse CDF, one uniform from the row's generator), keep the token if it is
    in the nucleus, else draw again. Exact, and no sort of the vocabulary: a draw is accepted with
    probability >= top_p. Row r takes its uniforms from generators[r], in row order, so a prompt's
    draws do not depend on the rows of other prompts beside it."""
    rows = list(range(len(probs)))
    tokens = inverse_cdf(probs, uniforms(generators, rows, probs.device))
    outside = ~in_nucleus(probs, tokens, top_p)
    for _ in range(REJECTION_ROUNDS):
        rows = outside.nonzero().flatten()
        if len(rows) == 0:
            return tokens
        sub = probs[rows]  # only the rejected rows are copied
        picked = inverse_cdf(sub, uniforms(generators, rows.tolist(), probs.device))
        tokens[rows] = picked
        outside[rows] = ~in_nucleus(sub, picked, top_p)
    rows = outside.nonzero().flatten()
    if len(rows):  # the nucleus holds little of these rows' mass: draw inside it directly
        sub = probs[rows]
        tokens[rows] = inverse_cdf(
            torch.where(nucleus_mask(sub, top_p), sub, 0.0),
            uniforms(generators, rows.tolist(), probs.device),
        )
    return tokens


def prompt_seeds(prompt_token_ids: Sequence[Sequence[int]], seed: int | Sequence[int]) -> list[int]:
    """One seed per prompt (an int seed gives prompt i seed + i), after checking the prompts: every
    sampler's `generate` takes its arguments through this."""
    seeds = (
        [seed + i for i in range(len(prompt_token_ids))] if isinstance(seed, int) else list(seed)
    )
    if len(seeds) != len(prompt_token_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(prompt_token_ids)} prompts")
    if any(len(p) == 0 for p in prompt_token_ids):
        raise ValueError("an empty prompt: every prompt needs at least one token")
    return seeds


class TorchSampler(ClosedAfterUse):
    """Batched autoregressive sampling on a plain (unsharded) transformers causal LM."""

    def __init__(
        self,
        model,
        tokenizer,
        device: torch.device,
        batch: int = 64,
        amp=None,
        progress: bool = False,
    ):
        self.model, self.tokenizer, self.device, self.batch = model.eval(), tokenizer, device, batch
        self.amp, self.progress = amp, progress
        self.stops = stop_token_ids(tokenizer)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The weight sync: copy each (name, full tensor) into this sampler's own model as it
        arrives."""
        load_weights(self.model, named_tensors)

    def pool_bytes(self) -> int:
        """Bytes of the device allocator held by a sleeping engine: none (the policy generates)."""
        return 0

    def memory_row(self) -> dict[str, float]:
        """Device memory readings before engine wakes: none (VLLMSampler.memory_row has them)."""
        return {}

    def close(self) -> None:
        """Nothing to release (the interface's end-of-run call; the vLLM sampler shuts its engine
        down)."""

    @torch.no_grad()
    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int | Sequence[int],
    ) -> list[list[Completion]]:
        """n samples for each prompt, in prompt order. temperature 0 = greedy. `seed`: one per
        prompt, or an int from which prompt i takes seed + i; a prompt's samples depend only on its
        prompt, its seed and the weights, never on the other prompts of the call."""
        seeds = prompt_seeds(prompt_token_ids, seed)
        # whole prompts per forward: a prompt's n rows share one generator
        per_call = max(1, self.batch // n)
        # prompts of similar lengths side by side: less padding
        order = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))
        results: list = [None] * len(prompt_token_ids)
        starts = range(0, len(order), per_call)
        for start in tqdm(
            starts, desc="sample", unit="batch", leave=False, disable=not self.progress
        ):
            chunk = order[start : start + per_call]
            samples = self._generate_rows(
                [prompt_token_ids[i] for i in chunk],
                n,
                temperature,
                top_p,
                max_new_tokens,
                [seeds[i] for i in chunk],
            )
            for k, i in enumerate(chunk):
                results[i] = samples[k * n : (k + 1) * n]
        return results

    def _generate_rows(
        self, prompts, n, temperature, top_p, max_new_tokens, seeds
    ) -> list[Completion]:
        rows = [list(p) for p in prompts for _ in range(n)]
        generators = []
        for s in seeds:  # one generator per prompt, shared by its n rows in order
            g = torch.Generator(device=self.device).manual_seed(s)
            generators += [g] * n
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor(
            [[pad] * (width - len(r)) + r for r in rows], device=self.device
        )  # [b, P]
        mask = torch.tensor(
            [[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, P]: padding does not shift positions
        cache = DynamicCache(config=self.model.config)
        stops = torch.tensor(self.stops, device=self.device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        tokens, logps = [], []
        for _ in range(max_new_tokens):
            with (
                self.amp
                if self.amp is not None
                else torch.autocast(self.device.type, enabled=False)
            ):
                out = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            logits = out.logits[:, -1].float()  # [b, V]
            probs = torch.softmax(  # [b, V]
                logits / temperature if temperature not in (0, 1) else logits, dim=-1
            )
            # [b]
            token = draw(probs, top_p, generators) if temperature > 0 else logits.argmax(dim=-1)
            token = torch.where(done, pad, token)  # finished rows idle on padding
            tokens.append(token)
            # a drawn token's p is far from 0
            logps.append(probs.gather(-1, token[:, None]).squeeze(-1).log())
            done |= torch.isin(token, stops)
            if done.all():
                break
            ids = token[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=-1)
            positions = positions[:, -1:] + 1
        # one read-back per batch (an element at a time would be one device sync per token per row
        # on a GPU) [b, steps]
        all_ids, all_logps = torch.stack(tokens, dim=1).tolist(), torch.stack(logps, dim=1).tolist()
        return [self._sample(ids, lps) for ids, lps in zip(all_ids, all_logps)]

    def _sample(self, ids: list[int], logps: list[float]) -> Completion:
        end = next((k for k, t in enumerate(ids) if t in self.stops), None)
        kept = len(ids) if end is None else end + 1
        text_ids = ids[:kept] if end is None else ids[:end]
        return Completion(
            tuple(ids[:kept]),
            self.tokenizer.decode(text_ids, skip_special_tokens=False),
            "length" if end is None else "stop",
            tuple(logps[:kept]),
        )

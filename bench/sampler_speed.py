"""The torch sampler's cost: one exact top-p draw at Qwen2.5's vocabulary (psyrl's rejection draw vs
the nucleus found by a full sort, as HF's TopPLogitsWarper and vLLM's torch path do), and sampling
throughput of the tiny model with its KV cache.

    python bench/sampler_speed.py [--rows 16 --vocab 151936 --repeats 20]
"""

from __future__ import annotations

import statistics
import time

import click
import torch

from psyrl.core.config import load_config
from psyrl.runtime.model import load_model, load_tokenizer
from psyrl.runtime.sampler import TorchSampler, draw, inverse_cdf, nucleus_mask


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@click.command()
@click.option("--rows", default=16, help="Sequences sampled together.")
@click.option("--vocab", default=151936, help="Vocabulary size (Qwen2.5: 151,936).")
@click.option("--repeats", default=20, help="Timed calls per case (median reported).")
def main(rows, vocab, repeats):
    gen = torch.Generator().manual_seed(0)
    top_p = 0.99
    generators = [torch.Generator().manual_seed(r) for r in range(rows)]

    def sorted_draw(probs):  # the full-sort way: mask the nucleus, then draw inside it
        u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
        return inverse_cdf(torch.where(nucleus_mask(probs, top_p), probs, 0.0), u)

    for label, scale in (("peaked (a trained model)", 12.0), ("flat (a random-init model)", 1.0)):
        probs = torch.softmax(torch.randn(rows, vocab, generator=gen) * scale, dim=-1)
        fast = timed(lambda: draw(probs, top_p, generators), repeats)  # noqa: B023
        full = timed(lambda: sorted_draw(probs), repeats)  # noqa: B023
        print(
            f"top-p {top_p}, {rows} x {vocab}, {label}: rejection draw {fast * 1e3:.1f} ms, "
            f"full-sort nucleus {full * 1e3:.1f} ms"
        )

    cfg = load_config("configs/sft/tiny.toml", ["model.path=''"])
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, tokenizer, seed=0)
    sampler = TorchSampler(model, tokenizer, torch.device("cpu"), batch=80)
    prompts = [
        tokenizer(f"question {i}: how angry was I?", add_special_tokens=False)["input_ids"]
        for i in range(16)
    ]
    t0 = time.perf_counter()
    groups = sampler.generate(prompts, 5, 1.0, top_p, 64, seed=0)
    seconds = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for g in groups for s in g)
    print(
        f"tiny model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab "
        f"{len(tokenizer)}): 16 prompts x 5 samples x 64 new tokens in {seconds:.2f} s, "
        f"{tokens / seconds:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()

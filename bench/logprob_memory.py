"""Peak memory of token log-probabilities at Qwen2.5's vocabulary: psyrl's chunked `token_logprobs`
vs the naive full-logit log-softmax, forward + backward, each in a fresh process (peak RSS above the
baseline).

    python bench/logprob_memory.py [--batch 8 --seq 256 --vocab 151936 --hidden 64]
"""

from __future__ import annotations

import json
import subprocess
import sys

import click

CHILD = r"""
import json, resource, sys, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from psyrl.runtime.model import token_logprobs
way, batch, seq, vocab, hidden = sys.argv[1], *map(int, sys.argv[2:6])
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=2 * hidden, tie_word_embeddings=True)
model = Qwen2ForCausalLM(cfg)
ids = torch.randint(0, vocab, (batch, seq)); mask = torch.ones_like(ids)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if way == "chunked":
    logp = token_logprobs(model, ids, mask, temperature=1.0)
else:
    logits = model(ids, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
logp.sum().backward()
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"way": way, "peak_above_baseline_gib": (peak - base) / 2**20,
                  "seconds": elapsed}))
"""


def measure(way: str, batch: int, seq: int, vocab: int, hidden: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, way, str(batch), str(seq), str(vocab), str(hidden)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@click.command()
@click.option("--batch", default=8, show_default=True)
@click.option("--seq", default=256, show_default=True)
@click.option("--vocab", default=151936, show_default=True)
@click.option("--hidden", default=64, show_default=True)
def main(batch, seq, vocab, hidden):
    """Print the peak memory of both ways (forward + backward, one decoder layer, tied
    embeddings)."""
    for way in ("naive", "chunked"):
        r = measure(way, batch, seq, vocab, hidden)
        print(
            f"{way:8s} {batch}x{seq} vocab {vocab}: peak {r['peak_above_baseline_gib']:.2f} GiB "
            f"above baseline, {r['seconds']:.2f} s"
        )


if __name__ == "__main__":
    main()

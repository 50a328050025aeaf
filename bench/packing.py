"""Packed (padding-free) vs padded micro-batches on this CPU (issue 29): which exact attention path
a packed row takes here, and what packing saves in the demo's T-GRPO step.

    .venv/bin/python bench/packing.py                      # the attention paths (about 1 minute)
    .venv/bin/python bench/packing.py --demo-model runs/tiny-sft/checkpoints/step-200/hf
                                                           # + the demo's step, packed vs padded

1. Attention paths. The demo's model shape (configs/sft/tiny.toml: hidden 256, 4 layers, 4 heads,
   2 KV heads, FFN 512), random init; the demo's 80 sequences of one step: 16 training prompts of
   data/demo/train.jsonl in the `cot` prompt, each with 5 responses of 10-64 random tokens; one
   forward + backward of `token_logprobs` over all of them (the update), and one gradient-free
   forward (the experience pass), in micro-batches of 16 sequences as the demo's config has them.
   Paths: padded (right-padded rows, SDPA with the padding mask: model.packing = false); packed with
   SDPA per sequence (psyrl's CPU path); packed with one block-diagonal mask over the row (SDPA's
   masked kernel over N x N); packed with flex attention and a document mask (eager: torch compiles
   flex attention only with a C++ toolchain, which psyrl does not require; torch 2.13 has no flex
   backward on a CPU, so the experience only). Median of 5.
2. The demo's step (--demo-model): `train_tgrpo.py --config configs/tgrpo/tiny.toml` for 3 steps,
   packed and padded by 16 sequences, and packed by a token budget (VARIANTS), one process; medians
   of time/logprobs and time/update over steps 2-3, and actor/padding_fraction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512)
PROMPTS, G, MICRO, REPEATS = 16, 5, 16, 5


def sequences(tokenizer):
    """(token ids, prompt lengths) of one demo step: 16 cot prompts x 5 random responses."""
    import torch

    from psyrl.core.config import load_config
    from psyrl.core.records import load_stimuliqa
    from psyrl.rl.rollout import build_prompts

    cfg = load_config(str(ROOT / "configs/tgrpo/tiny.toml"), ["model.path="])
    records = load_stimuliqa(ROOT / "data/demo/train.jsonl")[:PROMPTS]
    prompts, _ = build_prompts(records, tokenizer, cfg)
    g = torch.Generator().manual_seed(0)
    ids, lengths = [], []
    for _, prompt in prompts:
        for _ in range(G):
            n = int(torch.randint(10, 65, (1,), generator=g))
            ids.append(list(prompt) + torch.randint(10, 200, (n,), generator=g).tolist())
            lengths.append(len(prompt))
    return ids, lengths


def block_diagonal(packed):
    """[1, 1, N, N] bool: causal within each sequence of a packed row, nothing across."""
    import torch

    seq = torch.repeat_interleave(
        torch.arange(len(packed.starts) - 1), torch.diff(packed.starts.long())
    )
    n = seq.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return (causal & (seq[:, None] == seq[None, :]))[None, None]


def attention_paths() -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from transformers import AttentionInterface

    from psyrl.core.config import ModelConfig
    from psyrl.runtime.model import (
        HeadLogprobs,
        collate,
        load_model,
        load_tokenizer,
        pack,
        token_logprobs,
    )

    torch.set_num_threads(2)
    cfg = ModelConfig(tokenizer="tiny", **SHAPE)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer, seed=0)
    ids, prompt_lengths = sequences(tokenizer)
    batches = [
        (ids[i : i + MICRO], prompt_lengths[i : i + MICRO]) for i in range(0, len(ids), MICRO)
    ]

    def row_logprobs(packed, mask_fn):
        """A packed row with a whole-row attention: mask_fn(packed) -> what the attention uses."""
        decoder = model.get_decoder()
        out = decoder(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask={"full_attention": mask_fn(packed)},
            use_cache=False,
        )
        hidden = out.last_hidden_state[:, :-1][packed.targets]
        targets = packed.input_ids[:, 1:][packed.targets]
        head = model.get_output_embeddings()
        values = HeadLogprobs.apply(hidden, head.weight, head.bias, targets, 1.0, 256)
        return torch.zeros(packed.layout.shape).masked_scatter(packed.layout, values)

    def flex(module, query, key, value, attention_mask, scaling=None, **kwargs):
        out = flex_attention(
            query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("bench_flex", flex)

    def document_mask(packed):
        seq = torch.repeat_interleave(
            torch.arange(len(packed.starts) - 1), torch.diff(packed.starts.long())
        )
        n = seq.shape[0]
        return create_block_mask(
            lambda b, h, q, k: (seq[q] == seq[k]) & (q >= k), None, None, n, n, device="cpu"
        )

    def run(path: str, grad: bool) -> list[torch.Tensor]:
        outs = []
        for chunk, prompts in batches:
            if path == "padded":
                input_ids, attention_mask, mask = collate(chunk, prompts, tokenizer.pad_token_id)
                logp = token_logprobs(model, input_ids, attention_mask, 1.0, mask)
            elif path == "packed, SDPA per sequence":
                logp = token_logprobs(model, pack(chunk, prompts), None)
            elif path == "packed, one block-diagonal mask":
                logp = row_logprobs(pack(chunk, prompts), block_diagonal)
            else:
                model.config._attn_implementation = "bench_flex"
                try:
                    logp = row_logprobs(pack(chunk, prompts), document_mask)
                finally:
                    model.config._attn_implementation = "psyrl_packed_sdpa"
            if grad:
                logp.sum().backward()
            outs.append(logp.detach())
        return outs

    paths = [
        "padded",
        "packed, SDPA per sequence",
        "packed, one block-diagonal mask",
        "packed, flex attention (eager)",
    ]
    with torch.no_grad():
        reference = run("padded", grad=False)
    results = {}
    for path in paths:
        row = {}
        for phase, grad in (("experience", False), ("update", True)):
            if grad and "flex" in path:  # NotImplementedError: no backward on CPU (torch 2.13)
                continue
            times = []
            for _ in range(REPEATS):
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                with torch.set_grad_enabled(grad):
                    outs = run(path, grad)
                times.append(time.perf_counter() - start)
            row[phase] = statistics.median(times)
        with torch.no_grad():
            outs = run(path, grad=False)
        row["max_abs_diff_vs_padded"] = max(
            (a - b).abs().max().item() for a, b in zip(outs, reference)
        )
        results[path] = row
        print(f"{path}: {row}", flush=True)
    real = sum(len(s) for s in ids)
    padded = sum(len(c) * max(len(s) for s in c) for c, _ in batches)
    results["tokens"] = {"real": real, "padded": padded, "padding_fraction": 1 - real / padded}
    return results


# the demo step's micro-batching: 16 sequences each (configs/tgrpo/tiny.toml), packed or padded,
# or packed by a token budget of 16 sequences of ~160 tokens (optim.micro_batch_tokens)
VARIANTS = (("packed", True, 0), ("padded", False, 0), ("packed-budget", True, 2560))


def demo_step(model_dir: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import train_tgrpo
    from psyrl.core.runlog import read_metrics

    out = {}
    with tempfile.TemporaryDirectory(prefix="psyrl-packing-") as tmp:
        for name, packing, budget in VARIANTS:
            args = ["--config", str(ROOT / "configs/tgrpo/tiny.toml")]
            for key, value in {
                "run.name": name,
                "optim.micro_batch_tokens": budget,
                "optim.logprob_micro_batch_tokens": budget,
                "run.output_dir": tmp,
                "run.steps": 3,
                "model.path": model_dir,
                "model.packing": packing,
                "data.valid_file": "",
                "log.samples_every": 0,
                "log.progress": False,
                "checkpoint.every": 1000,
            }.items():
                args += ["--set", f"{key}={json.dumps(value)}"]
            train_tgrpo.main(args)
            rows = read_metrics(Path(tmp) / name / "metrics.jsonl")[1:]
            out[name] = {
                k: statistics.median(r[k] for r in rows)
                for k in ("time/logprobs", "time/update", "time/step", "actor/padding_fraction")
            }
            print(f"demo step, {name}: {out[name]}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-model", help="the demo's SFT checkpoint (its hf/ directory)")
    a = parser.parse_args()
    results = {"attention": attention_paths()}
    if a.demo_model:
        results["demo_step"] = demo_step(a.demo_model)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()

"""What the checkpoint's checksums cost (issue 44): `save_checkpoint` timed in one process on the
CPU, for the tiny config's model and a Qwen2.5-0.5B-shaped one (random weights, one AdamW step so
that the optimiser's moments exist), with each checksum and with a no-op one (the same plumbing,
no hashing); then `verify_checksums`, what a resume reads.

    .venv/bin/python bench/checkpoint_hash.py --model tiny --repeats 5
    .venv/bin/python bench/checkpoint_hash.py --model 0.5b --repeats 3

`--hashes none,crc32,...`: which to time (`none`: the no-op); `--old DIR`: also time the
`save_checkpoint` of another psyrl tree (e.g. `git archive <commit> psyrl | tar -x -C DIR`), the
code before checksums. Results are in docs/measurements.md.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

SHAPES = {
    # configs/sft/tiny.toml's model
    "tiny": dict(tokenizer="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2),
    # Qwen2.5-0.5B-Instruct's config.json (psyrl/assets/models/qwen2.5-0.5b-instruct)
    "0.5b": dict(
        tokenizer="qwen2.5",
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
    ),
}


class Crc32:
    """zlib.crc32 behind hashlib's interface."""

    def __init__(self):
        self.value = 0

    def update(self, data) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


class Nothing:
    """The no-op checksum: every byte still passes through the hashing writer."""

    def update(self, data) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def hashers() -> dict:
    found = {"none": Nothing, "crc32": Crc32, "blake2b": hashlib.blake2b}
    try:
        import xxhash

        found["xxh3_64"] = xxhash.xxh3_64
    except ImportError:
        pass
    return found


def build(shape: str):
    import torch

    from psyrl.core.config import ModelConfig, OptimConfig
    from psyrl.runtime.model import Policy, load_model, load_tokenizer
    from psyrl.runtime.optim import build_optimizer

    cfg = ModelConfig(**SHAPES[shape])
    tokenizer = load_tokenizer(cfg)
    policy = Policy(load_model(cfg, tokenizer, seed=0))
    optimizer = build_optimizer(policy, OptimConfig(lr=1e-5))
    ids = torch.tensor([tokenizer("I felt proud of my sister, she won.")["input_ids"]])
    (-policy(ids, torch.ones_like(ids)).sum()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return policy, optimizer, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hashes", default="none,crc32,xxh3_64,blake2b")
    parser.add_argument("--old", type=Path, default=None, help="a psyrl tree without checksums")
    parser.add_argument("--work", type=Path, default=Path("/tmp/psyrl-checkpoint-hash"))
    args = parser.parse_args()
    # this checkout's psyrl (or the old tree's), not wherever the environment installed one
    sys.path.insert(0, str(args.old or Path(__file__).resolve().parents[1]))
    import psyrl.core.checkpoints as checkpoints
    import psyrl.runtime.checkpoint as runtime_checkpoint

    policy, optimizer, tokenizer = build(args.model)
    params = sum(p.numel() for p in policy.parameters())
    names = ["old"] if args.old else args.hashes.split(",")
    available = hashers()
    times: dict[str, list[float]] = {name: [] for name in names}
    verify: dict[str, list[float]] = {name: [] for name in names}
    size = 0
    for _ in range(args.repeats):
        for name in names:  # interleaved: a slow moment of the machine hits every variant
            if name != "old":  # read at call time by both modules
                checkpoints.new_checksum = runtime_checkpoint.new_checksum = available[name]
            shutil.rmtree(args.work, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            t0 = time.perf_counter()
            path = runtime_checkpoint.save_checkpoint(
                args.work, 1, policy, optimizer, tokenizer, {"trainer.json": "{}\n"}
            )
            times[name].append(time.perf_counter() - t0)
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            if name not in ("old", "none"):
                t0 = time.perf_counter()
                problem = checkpoints.verify_checksums(path)
                verify[name].append(time.perf_counter() - t0)
                assert problem is None, problem
    base = statistics.median(times["none"]) if "none" in times else None
    print(f"{args.model}: {params / 1e6:.1f}M parameters, checkpoint {size / 2**20:.1f} MiB")
    for name in names:
        median = statistics.median(times[name])
        extra = f" ({100 * (median / base - 1):+.1f} % against none)" if base else ""
        read = f"; verify {statistics.median(verify[name]):.3f} s" if verify[name] else ""
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        print(f"  {name:8s} save median {median:.3f} s{extra} [{runs}]{read}")
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()

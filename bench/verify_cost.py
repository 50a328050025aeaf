"""What `verify_before_load` costs: an HF export of the tiny config's model or of a
Qwen2.5-0.5B-shaped one (random weights, float32, psyrl's tiny tokenizer) written once, then checked
against its manifest 5 times in this process (its memo cleared each time; the files in the page
cache after the first), as every load of a psyrl export does.

    PYTHONPATH=. .venv/bin/python bench/verify_cost.py --model tiny --work /tmp/verify-tiny
    PYTHONPATH=. .venv/bin/python bench/verify_cost.py --model 0.5b --work /tmp/verify-05b

Results are in docs/measurements.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

SHAPES = {
    # configs/sft/tiny.toml's model
    "tiny": dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512),
    # Qwen2.5-0.5B-Instruct's layers (psyrl/assets/models/qwen2.5-0.5b-instruct), tiny vocabulary
    "0.5b": dict(
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--work", type=Path, default=Path("/tmp/psyrl-verify-cost"))
    args = parser.parse_args()
    from psyrl.core import checkpoints
    from psyrl.core.config import ModelConfig
    from psyrl.runtime.checkpoint import export_hf
    from psyrl.runtime.model import Policy, load_model, load_tokenizer

    cfg = ModelConfig(tokenizer="tiny", **SHAPES[args.model])
    tokenizer = load_tokenizer(cfg)
    if not (args.work / checkpoints.MANIFEST).is_file():
        export_hf(Policy(load_model(cfg, tokenizer)), tokenizer, args.work)
    size = sum(p.stat().st_size for p in args.work.rglob("*") if p.is_file()) / 2**20
    times = []
    for _ in range(5):
        checkpoints._VERIFIED.clear()  # read again, as a new process would
        began = time.perf_counter()
        checkpoints.verify_before_load(args.work)
        times.append(time.perf_counter() - began)
    best = min(times)
    print(
        f"{args.model}: {size:.1f} MiB verified in {best:.3f} s (best of 5; median "
        f"{statistics.median(times):.3f} s): {size / best:.0f} MiB/s"
    )


if __name__ == "__main__":
    main()

"""Worker for tests/test_evaluate.py, run under torchrun on 2 gloo ranks: an evaluation whose rank 0
cannot append its first round to predictions.jsonl (a full disk, planted). Writes
<out>/rank-R.json with the error that rank raised (null: none).

    torchrun --nproc_per_node 2 tests/workers/evaluate_write_failure.py MODEL_DIR OUT
"""

import json
import os
import sys
from pathlib import Path

from psyrl.core.generation_options import OPTION_KEYS, GenerationOptions
from psyrl.eval import rounds
from psyrl.recipes import evaluate


def full_disk(path, rows, ensure_ascii=True):
    raise OSError(28, "No space left on device", str(path))


def main(model: str, out: Path) -> None:
    rank = os.environ["RANK"]
    if rank == "0":
        rounds.append_rows = full_disk
    defaults = {name: key.default() for name, key in OPTION_KEYS.items()}
    gen = GenerationOptions(
        **{**defaults, "model": model, "max_new_tokens": 4, "batch": 2, "progress": False}
    )
    chosen = evaluate.Selection(
        benchmarks=("data/demo/test.jsonl",),
        benchmark_dir="data/benchmarks",
        prompt="cot",
        limit=1,  # one item per subdimension: several rounds of 2 x 2
        out=str(out / "eval"),
    )
    try:
        evaluate.main(gen, chosen)
        raised = None
    except Exception as e:  # what this rank would report
        raised = {"type": type(e).__name__, "message": str(e)}
    (out / f"rank-{rank}.json").write_text(json.dumps(raised))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

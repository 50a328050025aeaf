"""Worker for tests/rl/test_rollout.py, run under torchrun on 2 gloo ranks: rollout.filter_groups'
`keep_groups` over two sampling rounds in which kept groups change rank. Counts the completions
each rank receives through torch.distributed's object collectives. Writes <out>/rank-R.json with
the step it got and that count; rank 0 also writes one-process.json, the same rounds in one
process."""

import json
import sys
from pathlib import Path

import torch.distributed as tdist

from psyrl.rl.rollout import Drawn, keep_groups, rank_positions
from psyrl.rl.scoring import Sample
from psyrl.runtime.distributed import ONE_PROCESS, cleanup, init_distributed
from psyrl.runtime.sampler import Completion

PROMPTS, GLOBAL_BATCH, G = 4, 2, 2
# varied groups: round 0 positions 1 and 2, round 1 positions 0 and 3; on 2 ranks position 1 moves
# from rank 1 to rank 0 (new position 0) and position 2 from rank 0 to rank 1 (new position 1)
ROUNDS = [
    ([10, 11, 12, 13], [[0.0, 0.0], [0.0, 1.0], [0.2, 0.3], [1.0, 1.0]]),
    ([20, 21, 22, 23], [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.5, 0.0]]),
]


def drawn_round(r: int, positions: list[int]) -> Drawn:
    indices, f1s = ROUNDS[r]
    groups = [
        [Completion((p, i), f"r{r}p{p}.{i}", "stop", (-0.5,)) for i in range(G)] for p in positions
    ]
    samples = [
        Sample(p, i, f"id{p}", "t", 3, "stop", f1, 1.0, 0.0, {})
        for p, group in enumerate(f1s)
        for i, f1 in enumerate(group)
    ]
    return Drawn(indices, positions, groups, samples)


def completions_in(value) -> int:
    if isinstance(value, Completion):
        return 1
    if isinstance(value, (list, tuple)):
        return sum(completions_in(v) for v in value)
    if isinstance(value, dict):
        return sum(completions_in(v) for v in value.values())
    return 0


received = 0


def counting(collective, output_at: int):
    def wrapper(*args, **kwargs):
        global received
        result = collective(*args, **kwargs)
        received += completions_in(args[output_at])
        return result

    return wrapper


def described(step) -> dict:
    return {
        "indices": step.indices,
        "positions": step.positions,
        "groups": [[c.text for c in g] for g in step.groups],
        "samples": [[s.position, s.index, s.f1] for s in step.samples],
    }


def main(out: Path) -> None:
    dist = init_distributed("cpu")
    tdist.all_gather_object = counting(tdist.all_gather_object, 0)
    tdist.scatter_object_list = counting(tdist.scatter_object_list, 0)
    positions = rank_positions(PROMPTS, GLOBAL_BATCH, dist)
    drawn = [drawn_round(r, positions) for r in range(len(ROUNDS))]
    step, metrics = keep_groups(drawn, PROMPTS, GLOBAL_BATCH, G, dist)
    record = {**described(step), "metrics": metrics, "received": received}
    (out / f"rank-{dist.rank}.json").write_text(json.dumps(record))
    if dist.rank == 0:
        whole = [drawn_round(r, list(range(PROMPTS))) for r in range(len(ROUNDS))]
        one, _ = keep_groups(whole, PROMPTS, GLOBAL_BATCH, G, ONE_PROCESS)
        (out / "one-process.json").write_text(json.dumps(described(one)))
    cleanup(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

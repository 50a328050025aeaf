"""Resumable generation rounds, for evaluation (`psyrl.recipes.evaluate`) and the data builder
(`psyrl.dataset.generation_log`): the items still to generate go through the sampler in rounds,
each round's rows appended to a JSONL file on rank 0 before the next round starts, so that an
interrupted job resumes where it stopped (a crash loses at most the round in flight).

Under torchrun every rank generates its share of a round and rank 0 writes. A write that fails on
rank 0 stops every rank together; SIGTERM or SIGUSR1 on any rank stops every rank after the round in
flight, with every finished round on disk (Preempted).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from psyrl.core.config import RunConfig
from psyrl.core.errors import Preempted
from psyrl.runtime.distributed import Dist, agree, all_gather_lists
from psyrl.runtime.preemption import Preemption


def jsonl_text(rows, ensure_ascii: bool = True) -> str:
    """The rows as JSONL text, one JSON object a line."""
    return "".join(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows)


def append_rows(path: Path, rows: list[dict], ensure_ascii: bool = True) -> None:
    """Append `rows` to the JSONL file `path`, on disk when this returns (fsync)."""
    with path.open("a", encoding="utf-8") as sink:
        sink.write(jsonl_text(rows, ensure_ascii))
        sink.flush()
        os.fsync(sink.fileno())


def preempted(desc: str, stop: str, finished: int, total: int, unit: str, path: Path) -> Preempted:
    """What a preempted job says: how far it got, where that is, how to resume."""
    return Preempted(
        f"{desc}: preempted by {stop} after {finished} of {total} {unit}s, all in {path}; "
        "run the same command to resume"
    )


def generation_rounds(
    dist: Dist,
    pending: Sequence,
    per_rank: int,
    generate: Callable[[list], list[dict]],
    log: Path,
    total: int,
    desc: str,
    unit: str,
    progress: bool = True,
    ensure_ascii: bool = True,
) -> list[dict]:
    """Every rank's rows for `pending`, in the order appended to `log`, on every rank. Collective.

    `pending` goes in rounds of `per_rank` items per rank; `generate(mine)` turns this rank's share
    of a round into its rows, and is called on every rank in every round (the sampler is
    collective), with no item too. `total` counts the job's items, those already in `log` included
    (the progress bar, what a preemption says). A failed write on rank 0 raises its OSError there
    and an OSError naming `log` on the other ranks, so that none is left waiting alone."""
    per_round = per_rank * dist.world
    initial = total - len(pending)
    finished: list[dict] = []
    with (
        Preemption(RunConfig().preempt_signals) as preemption,
        tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            dynamic_ncols=True,
            disable=not (progress and dist.is_main and pending),
        ) as bar,
    ):
        for start in range(0, len(pending), per_round):
            # strided: each rank gets short and long
            mine = list(pending[start : start + per_round][dist.rank :: dist.world])
            rows = all_gather_lists(generate(mine), dist)
            failure = None
            if dist.is_main:  # on disk at once: a crash loses at most the round in flight
                try:
                    append_rows(log, rows, ensure_ascii)
                except OSError as e:
                    failure = e
            # a full disk on rank 0 stops every rank, none left waiting
            if not agree(failure is None, dist):
                raise failure or OSError(f"rank 0 could not write {log}")
            finished += rows
            bar.update(len(rows))
            # a scheduler's signal on any rank: stop here, with every finished round on disk
            if (stop := preemption.requested(dist)) and start + per_round < len(pending):
                raise preempted(desc, stop, initial + len(finished), total, unit, log)
    return finished

"""rollout.filter_groups (DAPO's dynamic sampling, issue 42 item 3): which groups are kept, in what
order, how a step is filled at the round limit, and how the kept groups are laid over the ranks.
Hand-computed cases; the run itself (cursor, seeds, resume) is in tests/test_train_tgrpo.py."""

import json
import subprocess
import sys

import pytest

from psyrl.rl import rollout
from psyrl.rl.rollout import Drawn, choose_groups, keep_groups, rank_positions, varied_groups
from psyrl.rl.scoring import Sample
from psyrl.runtime.distributed import ONE_PROCESS, Dist
from psyrl.runtime.sampler import Completion

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def sample(position: int, index: int, f1: float) -> Sample:
    return Sample(position, index, f"id{position}", "t", 3, "stop", f1, 1.0, 0.0, {})


def scored(f1s: list[list[float]]) -> list[Sample]:
    """A round's samples from each group's accuracies, in step order."""
    return [sample(p, i, f1) for p, group in enumerate(f1s) for i, f1 in enumerate(group)]


def test_a_group_goes_only_when_all_its_accuracies_are_equal():
    f1s = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.6], [0.0, 1.0, 0.0], [0.25] * 3]
    assert varied_groups(scored(f1s), 3) == [False, False, True, True, False]


def test_the_varied_groups_in_sampling_order_then_the_earliest_equal_ones_fill():
    varied = [[True, False, True, False], [False, True, True, True]]
    # round 0 gives 2, round 1 the next 2; the fourth varied group of round 1 is surplus
    assert choose_groups(varied, 4) == ([(0, 0), (0, 2), (1, 1), (1, 2)], 0)
    # the round limit reached with 1 varied group: the 3 earliest equal ones complete the step
    assert choose_groups([[False, False, True, False]], 4) == ([(0, 2), (0, 0), (0, 1), (0, 3)], 3)
    assert choose_groups([[False, False]], 2) == ([(0, 0), (0, 1)], 2)


def drawn_round(indices: list[int], f1s: list[list[float]], positions: list[int], tag: str):
    """A round on a rank holding `positions`: each completion's text names its round and place."""
    groups = [
        [Completion((p, i), f"{tag}{p}.{i}", "stop", (-0.5,)) for i in range(len(f1s[p]))]
        for p in positions
    ]
    return Drawn(indices, positions, groups, scored(f1s))


def test_the_kept_groups_are_renumbered_in_order_with_their_prompts_and_metrics():
    first = [[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.2, 0.3]]  # varied: positions 1 and 3
    second = [[0.5, 0.5], [1.0, 0.0], [0.0, 0.4], [1.0, 0.0]]  # varied: 1, 2 and 3
    rounds = [
        drawn_round([10, 11, 12, 13], first, [0, 1, 2, 3], "a"),
        drawn_round([20, 21, 22, 23], second, [0, 1, 2, 3], "b"),
    ]
    step, metrics = keep_groups(rounds, 4, 4, 2, ONE_PROCESS)
    assert step.indices == [11, 13, 21, 22]  # the training prompts, in the order kept
    assert step.positions == [0, 1, 2, 3]
    assert [[c.text for c in g] for g in step.groups] == [
        ["a1.0", "a1.1"], ["a3.0", "a3.1"], ["b1.0", "b1.1"], ["b2.0", "b2.1"]
    ]  # fmt: skip
    assert [(s.position, s.index, s.f1) for s in step.samples] == [
        (0, 0, 0.0), (0, 1, 1.0), (1, 0, 0.2), (1, 1, 0.3),
        (2, 0, 1.0), (2, 1, 0.0), (3, 0, 0.0), (3, 1, 0.4),
    ]  # fmt: skip
    assert metrics == {
        "rollout/filter_rounds": 2,
        "rollout/filter_dropped": 3,  # 2 + 1 groups of equal accuracies drawn
        "rollout/filter_surplus": 1,  # the fifth varied group (round 1, position 3)
        "rollout/filter_filled": 0,
    }


def test_on_two_ranks_each_rank_gets_the_kept_groups_of_its_positions(monkeypatch):
    """Round 0 of 4 prompts in mini-batches of 2: rank 0 samples positions 0 and 2, rank 1 1 and 3
    (rank_positions). Kept groups move to the rank that trains their new position."""
    f1s = [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.3, 0.1]]
    again = [[1.0, 0.0], [0.0, 0.0], [0.2, 0.2], [0.0, 0.5]]
    ranks = [Dist(rank=r, world=2) for r in (0, 1)]
    assert [rank_positions(4, 2, d) for d in ranks] == [[0, 2], [1, 3]]
    local = {
        r: [
            drawn_round([0, 1, 2, 3], f1s, rank_positions(4, 2, ranks[r]), "a"),
            drawn_round([4, 5, 6, 7], again, rank_positions(4, 2, ranks[r]), "b"),
        ]
        for r in (0, 1)
    }

    one, _ = keep_groups(
        [drawn_round([0, 1, 2, 3], f1s, [0, 1, 2, 3], "a"),
         drawn_round([4, 5, 6, 7], again, [0, 1, 2, 3], "b")],
        4, 2, 2, ONE_PROCESS,
    )  # fmt: skip
    sent = {}  # (sender, receiver) -> what the sender's keep_groups sends

    class Sent(Exception):
        pass

    def record(outgoing, dist):
        sent.update({(dist.rank, to): part for to, part in enumerate(outgoing)})
        raise Sent

    monkeypatch.setattr(rollout, "scatter_lists", record)
    for r in (0, 1):  # every rank's sends first, as the collective has them all
        with pytest.raises(Sent):
            keep_groups(local[r], 4, 2, 2, ranks[r])
    # what each rank receives: its share from every rank, in rank order
    deliver = lambda outgoing, dist: [x for r in (0, 1) for x in sent[r, dist.rank]]
    monkeypatch.setattr(rollout, "scatter_lists", deliver)
    # the completions of 2 kept groups per rank cross, and nothing of a dropped group
    assert sum(len(g) for part in sent.values() for _, g in part) == 4 * 2
    assert one.indices == [0, 3, 4, 7]
    for r in (0, 1):
        step, metrics = keep_groups(local[r], 4, 2, 2, ranks[r])
        assert step.indices == one.indices and step.samples == one.samples
        assert step.positions == rank_positions(4, 2, ranks[r])
        assert [g[0].text for g in step.groups] == [one.groups[p][0].text for p in step.positions]
        assert metrics["rollout/filter_dropped"] == 4
    assert [g[0].text for g in one.groups] == ["a0.0", "a3.0", "b0.0", "b3.0"]


@pytest.mark.slow
def test_on_two_gloo_ranks_a_rank_receives_only_the_kept_groups_it_trains(tmp_path):
    """Two rounds of 4 prompts, G = 2, on 2 ranks (tests/workers/keep_groups_exchange.py): the step
    equals one process's, laid over the ranks, and a rank receives the completions of its own 2
    kept groups (4), not every round's completions of every rank (16)."""
    command = [*TORCHRUN, "tests/workers/keep_groups_exchange.py", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one = json.loads((tmp_path / "one-process.json").read_text())
    assert one["indices"] == [11, 12, 20, 23]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert got["indices"] == one["indices"] and got["samples"] == one["samples"]
        assert got["positions"] == [rank, rank + 2]
        assert got["groups"] == [one["groups"][p] for p in got["positions"]]
        assert got["received"] == 2 * 2  # its 2 kept groups of 2 completions
    # the moved groups: round 0's position 1 (sampled on rank 1) now trains on rank 0, and back
    assert json.loads((tmp_path / "rank-0.json").read_text())["groups"][0] == ["r0p1.0", "r0p1.1"]
    assert json.loads((tmp_path / "rank-1.json").read_text())["groups"][0] == ["r0p2.0", "r0p2.1"]

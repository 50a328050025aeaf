"""Where does eq. 8's bonus land on the testbed? (issue 43, docs/results/testbed-tiny.md)

For each T-GRPO run directory: the means over its steps (metrics.jsonl) of the groups whose five
samples got one reward, the policy entropy, the format reward (and its lowest step) and the share of
samples eq. 8 paid as short and as long. Then, from samples/step-N.jsonl (every response of a logged
step with its reward components and advantage), per logged step:
- L-bar, the cache's mean length, from a right answer's `len` and `short` components: where both
  apply len / short = ratio^2 (eq. 13-14), so ratio = sqrt(len / short) and L-bar = L / ratio;
- the groups, those whose right answers got different bonuses, and those whose advantages differ
  from Basic R1's (the group z-score of 0.5 F1 + 0.5 format, eq. 11) by more than 1e-3;
- per level over the logged steps, the groups whose samples all got one final reward (no signal
  at the group scope), the right answers with a positive advantage, and the largest repetition
  penalty.
Then, of the run's held-out evaluation (eval/predictions.jsonl), the right answers' lengths per
level and the share eq. 8 would pay as short (< tau- L-bar) or long (> tau+ L-bar) at the mean
L-bar.

    python bench/testbed_bonus.py /tmp/tbfull/runs/testbed-tiny/bilateral-seed{0,1,2}
    python bench/testbed_bonus.py --example   (a hand case through psyrl's own reward and advantage)
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from psyrl.core.config import RewardConfig
from psyrl.eval.benchmarks import read_predictions
from psyrl.rl.rewards import final_rewards
from psyrl.rl.tgrpo import advantages


def _mean_length(rows: list[dict]) -> float | None:
    """L-bar of a step from its right answers' len and short components."""
    seen = [
        r["tokens"] / math.sqrt(r["len"] / r["short"])
        for r in rows
        if r["f1"] > 0 and r["len"] > 0 and r["short"] > 0
    ]
    return statistics.median(seen) if seen else None


def _basic_r1_advantages(group: list[dict]) -> list[float]:
    base = [0.5 * r["f1"] + 0.5 * r["fmt"] for r in group]
    mean, std = statistics.mean(base), statistics.stdev(base)
    return [(b - mean) / (std + 1e-6) for b in base]


def metric_means(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward/f1" in r]  # training steps, not validations

    def mean(key: str) -> float:
        return statistics.mean(r[key] for r in rows)

    print(
        f"{run}: {len(rows)} steps;"
        f" zero-variance groups {mean('rollout/zero_variance_groups'):.3f},"
        f" entropy {mean('actor/entropy'):.3f}, format {mean('reward/format'):.3f}"
        f" (lowest {min(r['reward/format'] for r in rows):.4f}),"
        f" paid short {mean('reward/br_short_fraction'):.3f},"
        f" long {mean('reward/br_long_fraction'):.3f}, grad norm {mean('actor/grad_norm'):.3f},"
        f" KL to the reference {mean('actor/kl'):.4f}"
    )


def steps(run: Path) -> list[float]:
    means, flat, right, rep = [], defaultdict(list), defaultdict(list), defaultdict(float)
    print(
        f"{run.name}: step | L-bar | groups | right answers with different bonuses"
        " | advantages != Basic R1's"
    )
    for path in sorted(run.glob("samples/step-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        groups = defaultdict(list)
        for r in rows:
            groups[r["id"]].append(r)
        mixed = sum(len({r["br"] for r in g if r["f1"] > 0}) > 1 for g in groups.values())
        differ = sum(
            any(abs(a - r["advantage"]) > 1e-3 for a, r in zip(_basic_r1_advantages(g), g))
            for g in groups.values()
        )
        mean = _mean_length(rows)
        means.append(mean)
        print(f"  {path.stem} | {mean:.1f} | {len(groups)} | {mixed} | {differ}")
        for key, g in groups.items():  # per level: the groups, and those without a signal
            level = key.split("/")[1].rsplit("-", 1)[-1]
            flat[level] += [len({r["final"] for r in g}) == 1]
            right[level] += [r["advantage"] > 0 for r in g if r["f1"] > 0]
            rep[level] = max([rep[level]] + [r["rep"] for r in g])
    print(
        "  logged groups with one final reward for all samples, per level: "
        + ", ".join(f"{k} {sum(v)} of {len(v)}" for k, v in sorted(flat.items()))
    )
    print(
        "  logged right answers with a positive advantage, and the largest repetition penalty: "
        + ", ".join(f"{k} {sum(v)} of {len(v)}, {rep[k]:.2f}" for k, v in sorted(right.items()))
    )
    return [m for m in means if m is not None]


def held_out(run: Path, mean_length: float, cfg: RewardConfig) -> None:
    rows, _ = read_predictions(run / "eval" / "predictions.jsonl")
    by_level = defaultdict(list)
    for r in rows:
        if r["f1"] > 0:
            by_level[r["benchmark"]].append(r["tokens"])
    short, long = cfg.tau_low * mean_length, cfg.tau_high * mean_length
    print(
        f"  held-out right answers, at L-bar {mean_length:.1f}"
        f" (short < {short:.1f}, long > {long:.1f}):"
    )
    for level, tokens in sorted(by_level.items()):
        paid_short = sum(t < short for t in tokens) / len(tokens)
        paid_long = sum(t > long for t in tokens) / len(tokens)
        print(
            f"    {level}: {len(tokens)} right, {min(tokens)}-{max(tokens)} tokens; "
            f"short {paid_short:.0%}, long {paid_long:.0%}"
        )


def example() -> None:
    """Three groups of five (k = 1, 2, 3: 24, 33, 42 tokens; three right, two wrong), L-bar 33.3:
    Basic R1's and BR's rewards and their advantages at the group and at the cache scope."""
    import torch

    f1 = torch.tensor([1.0, 1, 1, 0, 0] * 3, dtype=torch.float64)
    parts = {"f1": f1, "fmt": torch.ones(15, dtype=torch.float64), "rep": torch.zeros(15)}
    lengths = [24] * 5 + [33] * 5 + [42] * 5
    for variant in ("base", "bilateral"):
        cfg = dataclasses.replace(RewardConfig(), variant=variant)
        rewards, _ = final_rewards(parts, lengths, 33.3, 0.6, cfg)
        print(f"{variant}: rewards {[round(x, 2) for x in rewards.tolist()]}")
        for scope in ("group", "cache"):
            adv = advantages(rewards, scope, 5, pool=rewards)
            print(f"  {scope}: {[round(x, 2) for x in adv.tolist()]}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--example"]:
        example()
        raise SystemExit(0)
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for run in map(Path, sys.argv[1:]):
        metric_means(run)
        means = steps(run)
        held_out(run, statistics.mean(means), RewardConfig())

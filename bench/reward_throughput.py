"""Scoring throughput of the bilateral reward: 10,000 distinct ~300-word responses, one process.

    .venv/bin/python bench/reward_throughput.py [--n 10000] [--words 300] [--repeats 3]

Runs the two scoring phases a T-GRPO step runs (answer components, cache phase 1, final rewards,
cache phase 2) and prints responses/s (best of --repeats). Target: >= 5,000 responses/s, so that
scoring stays a negligible part of a training step. Results are written in docs/measurements.md.
"""

from __future__ import annotations

import platform
import random
import time
from pathlib import Path

import click
import torch

from psyrl.core.config import load_config
from psyrl.core.text import normalize, think_text
from psyrl.rl.rewards import answer_components, final_rewards
from psyrl.rl.trajectory_cache import TrajectoryCache

ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "she he they felt feel thinks believes wanted because after before the a an her his their "
    "friend mother teacher work school home angry sad happy proud anxious relieved guilty ashamed "
    "surprised lonely hopeful grateful jealous calm upset excited worried tired lost found gave "
    "took said told asked left stayed again never always maybe perhaps so but and or not very "
    "quite really, . ! ? ; don't it's well-being"
).split()


def make_responses(n: int, words: int, seed: int) -> tuple[list[str], list[str], list[int]]:
    """n distinct cot responses of about `words` words, their gold answers and token lengths."""
    rng = random.Random(seed)
    responses, golds, lengths = [], [], []
    for i in range(n):
        think_words = max(4, words - 4 + rng.randint(-20, 20))
        think = " ".join(rng.choice(WORDS) for _ in range(think_words))
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        responses.append(f"<think>{think} #{i}</think>\n<answer>{answer}</answer>")
        golds.append(" ".join(rng.choice(WORDS) for _ in range(3)))
        lengths.append(int(1.3 * (think_words + 4)))  # ~1.3 tokens per English word
    return responses, golds, lengths


@click.command()
@click.option("--n", default=10_000, show_default=True, help="Number of responses scored.")
@click.option("--words", default=300, show_default=True, help="Approximate words per response.")
@click.option(
    "--repeats", default=3, show_default=True, help="Timed repetitions; the best is reported."
)
@click.option(
    "--config",
    default=str(ROOT / "configs/tgrpo/tiny.toml"),
    show_default=True,
    help="Reward config.",
)
def main(n, words, repeats, config):
    cfg = load_config(config, ["reward.variant=bilateral"]).reward
    responses, golds, lengths = make_responses(n, words, seed=0)
    assert len(set(responses)) == n
    torch.set_num_threads(1)
    times = []
    for _ in range(repeats):
        cache = TrajectoryCache(size=4)
        start = time.perf_counter()
        components = answer_components(responses, golds, "cot", cfg)
        cache.push_answers(components["f1"], lengths)
        final, _ = final_rewards(components, lengths, *cache.answer_stats(), cfg)
        cache.push_rewards(final)
        times.append(time.perf_counter() - start)
    best = min(times)
    thinks = [think_text(r) for r in responses]
    start = time.perf_counter()
    for think in thinks:
        normalize(think)
    normalize_s = time.perf_counter() - start  # the repetition penalty's share, timed alone
    chars = sum(map(len, responses)) / n
    print(
        f"{platform.processor() or platform.machine()}, python {platform.python_version()}, torch "
        f"{torch.__version__}"
    )
    print(
        f"scored {n} responses of ~{words} words ({chars:.0f} chars) with the '{cfg.variant}' "
        "reward"
    )
    runs = ", ".join(f"{t:.3f}" for t in times)
    print(f"best of {repeats}: {best:.3f} s = {n / best:,.0f} responses/s (all runs: {runs} s)")
    print(
        f"per response: {best / n * 1e6:.0f} us, of which normalising the think text "
        f"{normalize_s / n * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()

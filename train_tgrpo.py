"""T-GRPO, the trajectory cache and the bilateral reward (paper §3.2, eq. 1-9): the entry script.

    python train_tgrpo.py --config configs/tgrpo/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node 4 train_tgrpo.py --config configs/tgrpo/qwen2.5-3b.toml   (FSDP2)

The same command as `psyrl train-tgrpo`. The loop it runs: `loop` below, `train` in
psyrl/recipes/tgrpo.py.
"""

from psyrl.cli.train import train_tgrpo


def loop():
    """The T-GRPO loop this script runs, read top to bottom (imported when the command runs, so
    that --help answers at once)."""
    from psyrl.recipes.tgrpo import train

    return train


if __name__ == "__main__":
    train_tgrpo(obj=loop)

"""SFT / knowledge injection (paper §4.1, appendix A.4, appendix B): the entry script.

    python train_sft.py --config configs/sft/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node N train_sft.py --config ... [--resume]          (FSDP2, SPEC §1)

The same command as `psyrl train-sft`. The loop it runs: `loop` below, `train` in
psyrl/recipes/sft.py.
"""

from psyrl.cli.train import train_sft


def loop():
    """The SFT loop this script runs, read top to bottom (imported when the command runs, so
    that --help answers at once)."""
    from psyrl.recipes.sft import train

    return train


if __name__ == "__main__":
    train_sft(obj=loop)

"""SFT / knowledge injection (paper §4.1, appendix A.4, appendix B): the entry script.

    python train_sft.py --config configs/sft/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node N train_sft.py --config ... [--resume]          (FSDP2, SPEC §1)

The same command as `psyrl train-sft`. The loop it runs, read top to bottom: `train` in
psyrl/recipes/sft.py.
"""

from psyrl.cli.train import train_sft
from psyrl.recipes.sft import train

if __name__ == "__main__":
    train_sft(obj=train)

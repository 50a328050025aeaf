"""SFT / knowledge injection (paper §4.1, appendix A.4, appendix B): the entry script.

    python train_sft.py --config configs/sft/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node N train_sft.py --config ... [--resume]          (FSDP2, SPEC §1)

The same command as `psyrl train-sft`. The program, read top to bottom: psyrl/recipes/sft.py.
"""

from psyrl.cli.commands import train_sft as main

if __name__ == "__main__":
    main()

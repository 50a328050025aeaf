"""SFT / knowledge injection (paper §4.1, appendix A.4, appendix B): the entry script.

    python train_sft.py --config configs/sft/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node N train_sft.py --config ... [--resume]          (FSDP2, SPEC §1)

The same command as `psyrl train-sft`. The loop: `train` in psyrl/recipes/sft.py.
"""

from psyrl.cli.errors import script_errors
from psyrl.cli.train import parse_trainer_args


def main(argv: list[str] | None = None) -> None:
    args = parse_trainer_args("train-sft", argv)  # --help and bad options answer before torch
    with script_errors("train-sft"):
        from psyrl.recipes.sft import train  # the loop, read top to bottom
        from psyrl.run.launch import launch  # the config, the process group, checks, the loop

        launch(train, args.config, args.overrides, args.overwrite, args.resume)


if __name__ == "__main__":
    main()

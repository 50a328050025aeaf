"""T-GRPO, the trajectory cache and the bilateral reward (paper §3.2, eq. 1-9): the entry script.

    python train_tgrpo.py --config configs/tgrpo/tiny.toml [--set table.key=value ...] [--resume]
    torchrun --nproc_per_node 4 train_tgrpo.py --config configs/tgrpo/qwen2.5-3b.toml   (FSDP2)

The same command as `psyrl train-tgrpo`. The loop: `train` in psyrl/recipes/tgrpo.py.
"""

from psyrl.cli.errors import script_errors
from psyrl.cli.train import parse_trainer_args


def main(argv: list[str] | None = None) -> None:
    args = parse_trainer_args("train-tgrpo", argv)  # --help and bad options answer before torch
    with script_errors("train-tgrpo"):
        from psyrl.recipes.tgrpo import train  # the loop, read top to bottom
        from psyrl.run.launch import launch  # the config, the process group, checks, the loop

        launch(train, args.config, args.overrides, args.overwrite, args.resume)


if __name__ == "__main__":
    main()

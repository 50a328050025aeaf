"""The recipes: what `train_sft.py`, `train_tgrpo.py` and `evaluate.py` (and `psyrl train-sft`,
`train-tgrpo`, `evaluate`) run, each read top to bottom: `sft.train`, `tgrpo.train` (the T-GRPO
loop, one call per phase) and `evaluate.main`. Their command lines live in `psyrl.cli`."""

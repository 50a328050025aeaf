"""The three programs at the top of the import graph, what `train_sft.py`, `train_tgrpo.py` and
`evaluate.py` (and `psyrl train-sft`, `train-tgrpo`, `evaluate`) run: `train_sft.train`,
`train_tgrpo.train` and `evaluate.main`, each read top to bottom. Their command lines live apart, in
`commands`, which imports no torch: --help answers at once."""

"""Evaluation on the five OOD benchmarks (paper §4.1 "Metrics", SPEC §7): the entry script.

    python evaluate.py --model runs/tiny-tgrpo/hf --limit 10 --out runs/eval/tiny
    torchrun --nproc_per_node N evaluate.py --model DIR ...        (items split across ranks)
    python evaluate.py compare RUN_A RUN_B ...                     (Table 2/3, deltas against RUN_A)
    python evaluate.py lengths RUN_A [RUN_B] --out fig6.png        (RQ5 / Figure 6)

The same command as `psyrl evaluate`. The program, read top to bottom: psyrl/recipes/evaluate.py.
"""

from psyrl.cli.commands import evaluate as main

if __name__ == "__main__":
    main()

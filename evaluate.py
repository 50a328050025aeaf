"""Evaluation on the five OOD benchmarks (paper §4.1 "Metrics", SPEC §7): the entry script.

    python evaluate.py --model runs/tiny-tgrpo/hf --limit 10 --out runs/eval/tiny
    torchrun --nproc_per_node N evaluate.py --model DIR ...        (items split across ranks)
    python evaluate.py compare RUN_A RUN_B ...                     (Table 2/3, deltas against RUN_A)
    python evaluate.py lengths RUN_A [RUN_B] --out fig6.png        (RQ5 / Figure 6)

The same command as `psyrl evaluate`. The evaluation it runs, read top to bottom: `main` in
psyrl/recipes/evaluate.py.
"""

from psyrl.cli.evaluate import evaluate

if __name__ == "__main__":
    evaluate()

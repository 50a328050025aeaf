"""`psyrl plot`: training curves of one or several runs, overlaid (the paper's Fig. 5 compares base
and BR this way). matplotlib is an optional extra (`pip install 'psyrl[plot]'`), imported only here,
only when plotting."""

from __future__ import annotations

import math
from pathlib import Path

from psyrl.core.runlog import read_metrics

# (metric, panel title): per-step curves first, then the validation scores (rows that carry them).
PANELS = [
    ("reward/final", "final reward (mean)"),
    ("reward/f1", "answer F1 (mean)"),
    ("reward/format", "format reward (mean)"),
    ("reward/repetition_penalty", "repetition penalty (mean)"),
    ("reward/br", "bilateral bonus BR (mean)"),
    ("valid/f1", "held-out F1 (validation)"),
    ("valid/reward", "held-out final reward (validation)"),
    ("response/length", "response length (tokens)"),
    ("actor/kl", "KL to the reference"),
]


def load_runs(run_dirs: list[str | Path]) -> list[tuple[str, list[dict]]]:
    """(label, metrics rows) per run directory; the label is the directory name, made unique if two
    clash."""
    runs, seen = [], {}
    for run_dir in map(Path, run_dirs):
        path = run_dir / "metrics.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: not found (is {run_dir} a train_sft.py / train_tgrpo.py run directory?)"
            )
        label = run_dir.resolve().name
        seen[label] = seen.get(label, 0) + 1
        runs.append((label if seen[label] == 1 else f"{label} ({seen[label]})", read_metrics(path)))
    return runs


def series(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start): per-step rewards are
    noisy."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_runs(run_dirs: list[str | Path], out: str | Path, smooth: int = 5) -> list[str]:
    """Write one PNG with a panel per metric that any run logged, every run overlaid; return the
    panel metrics."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    runs = load_runs(run_dirs)
    panels = [(m, t) for m, t in PANELS if any(series(rows, m)[0] for _, rows in runs)]
    if not panels:
        raise ValueError(
            "none of the runs logged a metric psyrl plots: " + ", ".join(m for m, _ in PANELS)
        )
    cols = min(4, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (metric, title) in zip(axes.flat, panels):
        for n, (label, rows) in enumerate(runs):
            steps, values = series(rows, metric)
            if not steps:
                continue
            color = colors[n % len(colors)]
            if metric.startswith("valid/"):
                ax.plot(steps, values, "o-", color=color, label=label)
            elif smooth > 1:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                ax.plot(steps, moving_average(values, smooth), color=color, label=label)
            else:
                ax.plot(steps, values, color=color, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles = {}
    for ax in axes.flat:  # one legend for the figure: every run, whichever panels it has
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                handles.setdefault(line.get_label(), line)
    fig.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8)
    if smooth > 1:
        fig.suptitle(f"thin: per step; thick: trailing mean of {smooth} steps", fontsize=9)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [m for m, _ in panels]

"""RQ5 / Figure 6 (paper §4.6): response lengths by question index on ToMbench's Unexpected Outcome
Test.

Index 1 = simple stories with simple questions, 2 = the same stories with harder questions, 3 = more
complex stories (`meta.source_index`, 240 items here; the paper had 300). Only samples with non-zero
F1 count ("valid samples"), as in the paper. Length = response tokens. matplotlib is imported only
to draw (the `plot` extra).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from psyrl.eval.benchmarks import EvalError

BENCHMARK, TASK, INDICES = "tombench", "Unexpected Outcome Test", (1, 2, 3)


def lengths_by_index(rows: Sequence[dict]) -> tuple[dict[int, list[int]], dict[int, int]]:
    """(response tokens of the non-zero-F1 samples per index, items evaluated per index) of one
    run's predictions."""
    lengths: dict[int, list[int]] = {i: [] for i in INDICES}
    items = dict.fromkeys(INDICES, 0)
    for r in rows:
        if r["benchmark"] == BENCHMARK and r["task"] == TASK and r.get("index") in INDICES:
            items[r["index"]] += 1
            if r["f1"] > 0:
                lengths[r["index"]].append(r["tokens"])
    if not sum(items.values()):
        raise EvalError(
            f"no {TASK} item of {BENCHMARK} in these predictions (evaluate with --benchmarks "
            "tombench)"
        )
    return lengths, items


def counts_markdown(labels: Sequence[str], groups: Sequence[tuple[dict, dict]]) -> str:
    """Valid (non-zero-F1) samples per index and run, of the items evaluated, with the median
    length."""
    header = (
        "| run | "
        + " | ".join(f"index {i}: valid / items (median tokens)" for i in INDICES)
        + " | total valid |"
    )
    lines = [header, "| --- |" + " ---: |" * (len(INDICES) + 1)]
    for label, (lengths, items) in zip(labels, groups):
        cells = [f"{len(lengths[i])} / {items[i]} ({_median(lengths[i])})" for i in INDICES]
        lines.append(
            f"| {label} | " + " | ".join(cells) + f" | {sum(len(v) for v in lengths.values())} |"
        )
    return "\n".join(lines)


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):g}" if values else "-"


def plot_lengths(
    labels: Sequence[str], groups: Sequence[tuple[dict, dict]], out: str | Path
) -> Path:
    """Figure 6: one box per index and run, side by side, each labelled with its count of valid
    samples."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EvalError("the length plot needs matplotlib: pip install 'psyrl[plot]'") from None
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(3 + 2 * len(INDICES), 4.5))
    for k, (label, (lengths, _)) in enumerate(zip(labels, groups)):
        positions = [i + (k - (len(labels) - 1) / 2) * width for i in INDICES]
        data = [lengths[i] or [float("nan")] for i in INDICES]
        box = ax.boxplot(
            data, positions=positions, widths=width * 0.9, patch_artist=True, showfliers=True
        )
        color = f"C{k}"
        for patch in box["boxes"]:
            patch.set_facecolor(color)
            patch.set_alpha(0.5)
        for i, x in zip(INDICES, positions):
            ax.annotate(
                f"n={len(lengths[i])}",
                (x, 1.0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=8,
                color=color,
            )
        ax.plot([], [], color=color, linewidth=8, alpha=0.5, label=label)
    ax.set_xticks(list(INDICES), [f"Index {i}" for i in INDICES])
    ax.set_ylabel("response length (tokens)")
    ax.set_title(f"{TASK} (ToMbench): non-zero-F1 samples", pad=18)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out

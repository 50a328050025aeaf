"""RQ5 / Figure 6 (paper §4.6): response lengths by question index on ToMbench's Unexpected Outcome
Test, or by benchmark file (the testbed's levels, issue 43: test-k1/2/3.jsonl).

Index 1 = simple stories with simple questions, 2 = the same stories with harder questions, 3 = more
complex stories (`meta.source_index`, 240 items here; the paper had 300). Only samples with non-zero
F1 count ("valid samples"), as in the paper. Length = response tokens. The separation between the
first and last group (how far length follows difficulty) is the difference of their median lengths,
with a percentile bootstrap interval. matplotlib is imported only to draw (the `plot` extra).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from psyrl.eval.benchmarks import EvalError

BENCHMARK, TASK, INDICES = "tombench", "Unexpected Outcome Test", (1, 2, 3)
Groups = tuple[dict, dict]  # (group -> valid samples' lengths, group -> items evaluated)


def _grouped(rows: Sequence[dict], group, groups: Sequence = ()) -> Groups:
    """(valid samples' response tokens per group, items evaluated per group); `group(row)` names a
    row's group or None to leave it out; `groups` come first, in order, even where empty."""
    lengths: dict = {g: [] for g in groups}
    items: dict = dict.fromkeys(groups, 0)
    for r in rows:
        g = group(r)
        if g is None:
            continue
        lengths.setdefault(g, [])
        items[g] = items.get(g, 0) + 1
        if r["f1"] > 0:
            lengths[g].append(r["tokens"])
    return lengths, items


def lengths_by_index(rows: Sequence[dict]) -> tuple[dict[int, list[int]], dict[int, int]]:
    """(response tokens of the non-zero-F1 samples per index, items evaluated per index) of one
    run's predictions."""

    def index(r: dict) -> int | None:
        wanted = r["benchmark"] == BENCHMARK and r["task"] == TASK
        return r.get("index") if wanted and r.get("index") in INDICES else None

    lengths, items = _grouped(rows, index, INDICES)
    if not sum(items.values()):
        raise EvalError(
            f"no {TASK} item of {BENCHMARK} in these predictions (evaluate with --benchmarks "
            "tombench)"
        )
    return lengths, items


def lengths_by_benchmark(rows: Sequence[dict]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """The same by benchmark (a file evaluated: the testbed's test-k1, test-k2, test-k3), in the
    order of the predictions."""
    lengths, items = _grouped(rows, lambda r: r["benchmark"])
    if not items:
        raise EvalError("no predictions to group")
    return lengths, items


def separation(
    lengths: dict, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """median(last group) - median(first group) of the valid samples' lengths, with the 2.5th and
    97.5th percentiles of the difference over resamples of each group's samples (the groups hold
    different items: an unpaired bootstrap); None where either group has no valid sample."""
    keys = list(lengths)
    if len(keys) < 2 or not lengths[keys[0]] or not lengths[keys[-1]]:
        return None
    first, last = (np.asarray(lengths[k], dtype=np.float64) for k in (keys[0], keys[-1]))
    rng = np.random.default_rng(seed)
    draws = [rng.choice(g, size=(resamples, g.size)) for g in (first, last)]
    differences = np.median(draws[1], axis=1) - np.median(draws[0], axis=1)
    low, high = np.quantile(differences, [0.025, 0.975])
    return float(np.median(last) - np.median(first)), float(low), float(high)


def _name(group) -> str:
    return f"index {group}" if isinstance(group, int) else str(group)


def counts_markdown(labels: Sequence[str], groups: Sequence[Groups]) -> str:
    """Valid (non-zero-F1) samples per group and run, of the items evaluated, with the median
    length, and the separation of the last group's median length from the first's [95 % CI]."""
    keys = list(groups[0][0])
    last_first = f"{_name(keys[-1])} − {_name(keys[0])} median tokens [95 % CI]"
    header = (
        "| run | "
        + " | ".join(f"{_name(k)}: valid / items (median tokens)" for k in keys)
        + f" | total valid | {last_first} |"
    )
    lines = [header, "| --- |" + " ---: |" * (len(keys) + 2)]
    for label, (lengths, items) in zip(labels, groups):
        cells = [f"{len(lengths[k])} / {items[k]} ({_median(lengths[k])})" for k in keys]
        apart = separation(lengths)
        spread = "-" if apart is None else f"{apart[0]:+g} [{apart[1]:+g}, {apart[2]:+g}]"
        total = sum(len(v) for v in lengths.values())
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {total} | {spread} |")
    return "\n".join(lines)


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):g}" if values else "-"


def plot_lengths(labels: Sequence[str], groups: Sequence[Groups], out: str | Path) -> Path:
    """Figure 6: one box per group (index or level) and run, side by side, each labelled with its
    count of valid samples."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EvalError("the length plot needs matplotlib: pip install 'psyrl[plot]'") from None
    keys = list(groups[0][0])
    at = range(1, len(keys) + 1)
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(3 + 2 * len(keys), 4.5))
    for k, (label, (lengths, _)) in enumerate(zip(labels, groups)):
        positions = [i + (k - (len(labels) - 1) / 2) * width for i in at]
        data = [lengths[g] or [float("nan")] for g in keys]
        box = ax.boxplot(
            data, positions=positions, widths=width * 0.9, patch_artist=True, showfliers=True
        )
        color = f"C{k}"
        for patch in box["boxes"]:
            patch.set_facecolor(color)
            patch.set_alpha(0.5)
        for g, x in zip(keys, positions):
            ax.annotate(
                f"n={len(lengths[g])}",
                (x, 1.0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=8,
                color=color,
            )
        ax.plot([], [], color=color, linewidth=8, alpha=0.5, label=label)
    ax.set_xticks(list(at), [_name(g) for g in keys])
    ax.set_ylabel("response length (tokens)")
    where = f"{TASK} (ToMbench)" if isinstance(keys[0], int) else "by benchmark"
    ax.set_title(f"{where}: non-zero-F1 samples", pad=18)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out

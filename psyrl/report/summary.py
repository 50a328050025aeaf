"""`psyrl summary`: where a T-GRPO run started and where it ended, as a Markdown table (what `make
demo` prints at its end). Per-step rewards are noisy, so the start and the end are means over a
window of steps."""

from __future__ import annotations

from pathlib import Path

import tomli

from psyrl.report.plot import load_runs, series

COLUMNS = [
    ("reward/final", "final reward"),
    ("reward/f1", "train F1"),
    ("response/length", "length"),
]


def window_means(rows: list[dict], metric: str, window: int) -> tuple[float, float] | None:
    """Mean of `metric` over the first and over the last `window` steps that logged it (steps >=
    1)."""
    _, values = series([r for r in rows if r["step"] >= 1], metric)
    if not values:
        return None
    w = min(window, len(values))
    return sum(values[:w]) / w, sum(values[-w:]) / w


def reward_variant(run_dir: Path) -> str:
    path = run_dir / "config.resolved.toml"
    try:
        return tomli.loads(path.read_text(encoding="utf-8")).get("reward", {}).get("variant", "?")
    except (OSError, tomli.TOMLDecodeError):
        return "?"


def summary_table(run_dirs: list[str | Path], window: int = 5) -> str:
    """One row per run: reward variant, steps, held-out F1 and held-out final reward at the first
    and the last validation (the same items each time), and the mean of each per-step training
    metric over the first and the last `window` steps (different prompts each step), each as `start
    → end (change)`."""
    head = ["run", "reward", "steps", "held-out F1", "held-out final reward"]
    head += [f"{label} (mean of {window} steps)" for _, label in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for run_dir, (label, rows) in zip(map(Path, run_dirs), load_runs(run_dirs)):
        steps, f1 = series(rows, "valid/f1")
        _, reward = series(rows, "valid/reward")
        cells = [
            label,
            reward_variant(run_dir),
            str(max((r["step"] for r in rows), default=0)),
            change(f1[0], f1[-1]) + f" (step {steps[0]} → {steps[-1]})" if f1 else "-",
            change(reward[0], reward[-1]) if reward else "-",
        ]
        for metric, _ in COLUMNS:
            means = window_means(rows, metric, window)
            cells.append(
                change(*means, digits=1 if metric == "response/length" else 3) if means else "-"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def change(start: float, end: float, digits: int = 3) -> str:
    return f"{start:.{digits}f} → {end:.{digits}f} ({end - start:+.{digits}f})"

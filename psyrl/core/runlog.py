"""Run logging: `metrics.jsonl` (one JSON object per step, flushed) and the fixed-format console
line."""

from __future__ import annotations

import json
import math
from pathlib import Path

from psyrl.core.atomic import write_text
from psyrl.core.records import read_jsonl


class MetricsFile:
    """Appends one JSON line per call and flushes it, so a crash loses nothing already logged."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, row: dict) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in row.items()
        }
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl; a line that is not a JSON object with an integer `step` names
    its line."""
    return [row for _, row in read_jsonl(path, _metrics_row)]


def _metrics_row(row) -> dict:
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        got = json.dumps(row)[:80]
        raise ValueError(f"expected a JSON object with an integer 'step', got {got!r}")
    return row


def step_line(row: dict, fields: list[tuple[str, str, str]]) -> str:
    """`step 12/315 | loss 2.3456 | ...` from (label, key, format spec) triples; missing keys are
    skipped."""
    parts = [f"step {row['step']}/{row['steps']}"]
    for label, key, spec in fields:
        if row.get(key) is not None:
            parts.append(f"{label} {row[key]:{spec}}")
    return " | ".join(parts)


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Keep the rows up to `last_step` (a resumed run redoes the steps after its checkpoint); atomic
    rewrite. A line that does not parse (the row a crash cut short) is dropped; returns how many
    were."""
    broken = []
    kept = [row for _, row in read_jsonl(path, bad=broken) if row["step"] <= last_step]
    write_text(path, "".join(json.dumps(row) + "\n" for row in kept))
    return len(broken)


def last_step(path: str | Path) -> int:
    """The highest step of a metrics.jsonl's readable rows; -1 when it has none."""
    return max((row["step"] for _, row in read_jsonl(path, bad=[])), default=-1)

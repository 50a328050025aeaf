"""The checkpoints a run leaves on disk, read without torch: which `checkpoints/step-N/` exist,
which are complete (their `manifest.json`: the size of every file, written last), which still hold a
training state to resume from, and appendix B's choice among them by validation F1. Writing and
loading them is `psyrl.runtime.checkpoint`; `psyrl select-checkpoint`, `psyrl report` and `psyrl
experiment` only read, so they never import torch.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

from psyrl.core.atomic import write_text

CHECKPOINT_GLOB = "step-*"
MANIFEST = "manifest.json"
STATE_PARTS = ("state", "rng")  # what `keep_state` prunes from older checkpoints


def _manifest(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def verify(directory: str | Path) -> str | None:
    """None if `directory` is a complete checkpoint, else what is wrong with it (missing manifest or
    file, wrong size)."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__})"
    for name, size in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} expected"
    return None


def write_manifest(directory: Path, manifest: dict | None = None) -> None:
    """Atomically (temporary file, then rename) write `manifest`, by default the sizes of every file
    now there."""
    if manifest is None:
        manifest = {"files": _manifest(directory), "resumable": (directory / "state").is_dir()}
    write_text(directory / MANIFEST, json_text(manifest))


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every `checkpoints/step-N`, by step (complete or not)."""
    found = []
    for d in Path(run_dir, "checkpoints").glob(CHECKPOINT_GLOB):
        suffix = d.name.split("-", 1)[1]
        if d.is_dir() and suffix.isdigit():
            found.append((int(suffix), d))
    return sorted(found)


def _resumable(directory: Path) -> bool:
    """Complete, and its manifest still promises a training state (pruning withdraws that promise
    first)."""
    if verify(directory) is not None:
        return False
    return json.loads((directory / MANIFEST).read_text(encoding="utf-8")).get("resumable", False)


def prune_states(checkpoints: Path, keep: int) -> None:
    """Drop `state/` and `rng/` from all but the `keep` newest resumable checkpoints (0: keep all);
    their HF exports and scores stay. The manifest is rewritten first, so a crash in between leaves
    a checkpoint that is complete but no longer offered for resume."""
    if keep <= 0:
        return
    resumable = [d for _, d in checkpoint_dirs(checkpoints.parent) if _resumable(d)]
    for d in resumable[:-keep]:
        # a failure here (full disk) costs only disk space: the checkpoint stays complete and
        # resumable
        try:
            manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
            manifest["files"] = {
                k: v for k, v in manifest["files"].items() if k.split("/")[0] not in STATE_PARTS
            }
            write_manifest(d, {**manifest, "resumable": False})
        except (OSError, ValueError, KeyError):
            continue
        for part in STATE_PARTS:
            shutil.rmtree(d / part, ignore_errors=True)


def find_resumable(run_dir: str | Path, warn: Callable[[str], None]) -> Path | None:
    """The newest complete checkpoint holding a training state; incomplete ones are reported through
    `warn` and skipped (the previous one is used)."""
    for _, d in reversed(checkpoint_dirs(run_dir)):
        problem = verify(d)
        if problem:
            warn(f"warning: skipping {d}: incomplete checkpoint ({problem})")
        elif _resumable(d):
            return d
    return None


def json_text(obj) -> str:
    """Stable, readable JSON for the files of a checkpoint."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def checkpoint_scores(
    run_dir: str | Path, metric: str = "valid/f1"
) -> list[tuple[int, float, Path]]:
    """(step, score, directory) of every complete checkpoint with a validation.json, by step."""
    found = []
    for step, d in checkpoint_dirs(run_dir):
        scores = d / "validation.json"
        if scores.is_file() and verify(d) is None:
            found.append((step, json.loads(scores.read_text())[metric], d))
    return found


def select_checkpoint(
    run_dir: str | Path, rule: str = "median", metric: str = "valid/f1"
) -> tuple[int, float, Path]:
    """Appendix B: GRPO starts from "the SFT checkpoint that achieves the median F1". `median` takes
    the lower median of the scores (a real checkpoint; the earlier step on ties); `best` the
    highest; `last` the latest."""
    scores = checkpoint_scores(run_dir, metric)
    if not scores:
        raise FileNotFoundError(
            f"{run_dir}: no checkpoints/step-N/validation.json (set checkpoint.every > 0)"
        )
    if rule == "last":
        return scores[-1]
    if rule == "best":
        return max(scores, key=lambda s: (s[1], -s[0]))
    if rule != "median":
        raise ValueError(f"unknown rule {rule!r}; expected median, best or last")
    by_score = sorted(scores, key=lambda s: (s[1], s[0]))
    target = statistics.median_low([s[1] for s in by_score])
    return next(s for s in by_score if s[1] == target)

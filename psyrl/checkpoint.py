"""What a run leaves on disk: Hugging Face exports written atomically, and the appendix-B checkpoint choice.

Every directory is written under a temporary name and renamed into place, so a crash mid-save never
leaves a half-written export that is later loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

CHECKPOINT_GLOB = "step-*"


def _temporary(final: Path) -> Path:
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place. The previous version is renamed to `<name>.old` first and deleted
    last: at every instant one complete version exists under `final` or `<name>.old` (`tidy` restores it)."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def tidy(directory: str | Path) -> None:
    """After a crash: delete unfinished `.<name>.tmp-<pid>` directories and files; put back a `<name>.old`
    whose replacement never arrived."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for path in sorted(directory.rglob(".*.tmp-*")):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    for old in sorted(directory.rglob("*.old")):
        final = old.with_name(old.name[: -len(".old")])
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.rename(final)


def _save_hf(model, tokenizer, directory: Path) -> None:
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))


def export_hf(model, tokenizer, out_dir: str | Path) -> Path:
    """config.json, safetensors weights, generation config and tokenizer files: loadable as they are by
    `transformers.AutoModelForCausalLM.from_pretrained` (and by vLLM)."""
    out = Path(out_dir)
    tmp = _temporary(out)
    _save_hf(model, tokenizer, tmp)
    _replace_dir(tmp, out)
    return out


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, files: dict[str, str]) -> Path:
    """`checkpoints/step-N/`: `hf/` (an HF export) plus the given text files (resolved config, validation
    scores, ...), assembled in one temporary directory and moved into place in one rename."""
    final = Path(run_dir) / "checkpoints" / f"step-{step}"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(final)
    _save_hf(model, tokenizer, tmp / "hf")
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    _replace_dir(tmp, final)
    return final


def json_text(obj) -> str:
    """Stable, readable JSON for the files of a checkpoint."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def checkpoint_scores(run_dir: str | Path, metric: str = "valid/f1") -> list[tuple[int, float, Path]]:
    """(step, score, directory) of every checkpoint with a validation.json, by step."""
    found = []
    for d in Path(run_dir, "checkpoints").glob(CHECKPOINT_GLOB):
        scores = d / "validation.json"
        if d.is_dir() and scores.is_file():
            found.append((int(d.name.split("-", 1)[1]), json.loads(scores.read_text())[metric], d))
    return sorted(found)


def select_checkpoint(run_dir: str | Path, rule: str = "median", metric: str = "valid/f1") -> tuple[int, float, Path]:
    """Appendix B: GRPO starts from "the SFT checkpoint that achieves the median F1". `median` takes the lower
    median of the scores (a real checkpoint; the earlier step on ties); `best` the highest; `last` the latest."""
    scores = checkpoint_scores(run_dir, metric)
    if not scores:
        raise FileNotFoundError(f"{run_dir}: no checkpoints/step-N/validation.json (set checkpoint.every > 0)")
    if rule == "last":
        return scores[-1]
    if rule == "best":
        return max(scores, key=lambda s: (s[1], -s[0]))
    if rule != "median":
        raise ValueError(f"unknown rule {rule!r}; expected median, best or last")
    by_score = sorted(scores, key=lambda s: (s[1], s[0]))
    target = statistics.median_low([s[1] for s in by_score])
    return next(s for s in by_score if s[1] == target)

"""hf/README.md, the model card of a run's export: where the model comes from, the data it saw,
its last held-out scores, and the resolved config."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import psyrl
from psyrl.core.config import Config


def psyrl_commit() -> str:
    """The git commit of the psyrl checkout this runs from, or why there is none."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(psyrl.__file__).parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def model_card(cfg: Config, trainer: str, resolved: str, data: dict, rows: list[dict]) -> str:
    """hf/README.md: where the model comes from (base model, trainer, psyrl version and commit), the
    data it saw (paths and sha256), its last held-out scores, and the resolved config."""
    base = cfg.model.path or f"none: a tiny model built from [model] (seed {cfg.run.seed})"
    valid = [r for r in rows if any(k.startswith("valid/") for k in r)]
    files = [("train", cfg.data.train_file, data.get("sha256", ""), data.get("examples", ""))]
    # data.valid_file ("validation", keys valid/...), then each data.valid_files set (its stem)
    held_out = [("validation", cfg.data.valid_file)] if cfg.data.valid_file else []
    held_out += [(f"validation ({Path(f).stem})", f) for f in cfg.data.valid_files]
    for split, path in held_out:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        files.append((split, path, digest, cfg.data.valid_items or "all"))
    lines = [
        "---",
        f"base_model: {json.dumps(cfg.model.path) if cfg.model.path else 'null'}",
        "library_name: transformers",
        f"tags: [psyrl, {trainer}]",
        "---",
        "",
        f"# {cfg.run.name}",
        "",
        f"Trained with psyrl {psyrl.__version__} (commit {psyrl_commit()}): `{trainer}`, "
        f"{cfg.run.steps} steps{'' if trainer == 'sft' else f', reward {cfg.reward.variant}'}; "
        f"weights in {cfg.checkpoint.export_dtype}. Base model: {base}.",
        "",
        "## Data",
        "",
        "| split | file | sha256 | items used |",
        "| --- | --- | --- | ---: |",
        *[f"| {split} | `{path}` | `{digest}` | {n} |" for split, path, digest, n in files],
        "",
    ]
    if valid:
        last = valid[-1]
        lines += [
            f"## Held-out scores (validation at step {last['step']})",
            "",
            "| metric | value |",
            "| --- | ---: |",
            *[
                f"| {k} | {v:.4f} |"
                for k, v in last.items()
                if k.startswith("valid/") and isinstance(v, float)
            ],
            "",
        ]
    lines += [
        "## Configuration (config.resolved.toml)",
        "",
        "```toml",
        resolved.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)

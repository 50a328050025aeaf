"""Reading a run directory for `psyrl report`: its metrics rows, resolved config, the held-out
scores of every checkpoint (`checkpoints/step-N/validation.json`), every evaluate.py output inside
it (`<run>/<dir>/results.json`), its T-GRPO sample files (`samples/step-N.jsonl`) and the records of
the sampled prompts, read back from data.train_file. `psyrl.report.page` writes the page from these.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import psyrl
from psyrl.core.checkpoints import checkpoint_dirs
from psyrl.core.config import Config, ConfigError, load_config
from psyrl.core.records import BenchmarkRecord, load_records, read_jsonl


@dataclasses.dataclass
class RunData:
    """What the page shows of one run directory."""

    label: str
    dir: Path
    rows: list[dict]
    """metrics.jsonl."""
    config_text: str | None
    """config.resolved.toml as written; None when the file is missing."""
    config: Config | None
    """The same, loaded (None when missing or written by a psyrl with other keys)."""
    validation: list[tuple[int, dict]]
    """(step, validation.json) of every checkpoint that has one."""
    evaluations: list[tuple[str, dict, dict]]
    """(folder name, settings, results) of every evaluate.py output in the run directory."""
    sample_steps: list[tuple[int, Path]]
    """(step, samples/step-N.jsonl), by step."""


def read_run(label: str, run_dir: Path, rows: list[dict]) -> RunData:
    config_path = run_dir / "config.resolved.toml"
    text, config = None, None
    if config_path.is_file():
        text = config_path.read_text(encoding="utf-8")
        try:
            config = load_config(config_path)
        except ConfigError:
            config = None  # shown as text, without the cross-run diff
    return RunData(
        label,
        run_dir,
        rows,
        text,
        config,
        read_validation(run_dir),
        read_evaluations(run_dir),
        sample_files(run_dir),
    )


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


def read_validation(run_dir: Path) -> list[tuple[int, dict]]:
    return [
        (step, read_json(d / "validation.json"))
        for step, d in checkpoint_dirs(run_dir)
        if (d / "validation.json").is_file()
    ]


def read_evaluations(run_dir: Path) -> list[tuple[str, dict, dict]]:
    found = []
    for path in sorted(run_dir.glob("*/results.json")):
        saved = read_json(path)
        if not isinstance(saved.get("results"), dict) or not isinstance(
            saved.get("settings"), dict
        ):
            raise ValueError(f"{path}: not an evaluate.py results.json (no results or settings)")
        found.append((path.parent.name, saved["settings"], saved["results"]))
    return found


def sample_files(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in (run_dir / "samples").glob("step-*.jsonl"):
        suffix = path.stem.split("-", 1)[1]
        if suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


SAMPLE_KEYS = ("id", "sample", "response", "tokens", "finish_reason", "advantage")


def sample_row(row) -> dict:
    """A line of samples/step-N.jsonl (`psyrl.run.samples.write_samples`); the JS relies on these
    keys."""
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    missing = [k for k in SAMPLE_KEYS if k not in row]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (not a psyrl samples file?)")
    return row


def read_samples(path: Path) -> list[dict]:
    return [row for _, row in read_jsonl(path, sample_row)]


def spaced(items: list, count: int) -> list:
    """At most `count` of `items`, evenly spaced, the first and the last included (0: all)."""
    if count <= 0 or len(items) <= count:
        return items
    if count == 1:
        return items[-1:]
    picks = sorted({round(i * (len(items) - 1) / (count - 1)) for i in range(count)})
    return [items[i] for i in picks]


def find_data_file(run_dir: Path, path: str) -> Path | None:
    """data.train_file as the trainer saw it: a relative path was relative to wherever it ran, so
    try here, this psyrl checkout, then each folder above the run directory (`runs/<name>`)."""
    given = Path(path)
    if given.is_absolute():
        return given if given.is_file() else None
    checkout = Path(psyrl.__file__).resolve().parents[1]
    for base in [Path.cwd(), checkout, *run_dir.resolve().parents]:
        if (base / given).is_file():
            return base / given
    return None


def trained_data_digest(run_dir: Path) -> str | None:
    """The sha256 of the training data that the newest checkpoint's trainer.json recorded."""
    for _, d in reversed(checkpoint_dirs(run_dir)):
        if (d / "trainer.json").is_file():
            return read_json(d / "trainer.json").get("data", {}).get("sha256")
    return None


def prompt_records(run: RunData, ids: set[str]) -> tuple[dict[str, dict], str]:
    """{id: story, question, gold answer (and options)} of the sampled prompts, from the run's
    data.train_file, and a note for the page when it is missing or is not the file trained on."""
    if run.config is None:
        return {}, "the run's config.resolved.toml is missing or unreadable: stories unknown"
    name = run.config.data.train_file
    path = find_data_file(run.dir, name)
    if path is None:
        return {}, f"training data {name} not found from here: stories and gold answers left out"
    note = ""
    digest = trained_data_digest(run.dir)
    if digest and digest != hashlib.sha256(path.read_bytes()).hexdigest():
        note = (
            f"{path} changed since the run (its sha256 differs from the checkpoints' "
            "trainer.json): the stories shown may not be the ones trained on"
        )
    prompts = {}
    for r in load_records(path):
        if r.id not in ids:
            continue
        if isinstance(r, BenchmarkRecord):
            prompts[r.id] = {
                "story": r.context,
                "question": r.question,
                "answer": r.answer,
                "options": list(r.options),
            }
        else:
            prompts[r.id] = {"story": r.stimuli, "question": r.question, "answer": r.answer}
    return prompts, note or f"stories and gold answers from {path}"

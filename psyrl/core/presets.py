"""The presets (issue 30): the run configs, experiment files and OOD benchmarks that ship inside the
package (psyrl/assets/), found by name so that `pip install psyrl` runs them from any directory.

    resolve_config("tgrpo/qwen2.5-3b")      configs/tgrpo/qwen2.5-3b.toml of the package
    resolve_config("configs/sft/tiny.toml") a file of that path if there is one, else sft/tiny
    resolve_config("tiny", kind="sft")      a bare name: the kind's preset (train-sft: sft/tiny)
    resolve_experiment("table2-tiny")       experiments/table2-tiny.toml of the package

An existing file always wins over a preset of the same name. The paths inside a preset
(data.train_file, model.path) stay relative to the working directory, as in any config.
"""

from __future__ import annotations

import shutil
from importlib.resources import files
from pathlib import Path

import tomli

from psyrl.core.errors import PsyrlError

KINDS = ("sft", "tgrpo")  # the folders of assets/configs, one per trainer


class PresetError(PsyrlError, ValueError):
    """A --config or experiment that is neither a file nor a preset, or a bare name of both
    kinds."""


def assets_dir() -> Path:
    """psyrl/assets of the installed package (a wheel installs it as files, so a path suffices)."""
    return Path(str(files("psyrl") / "assets"))


def benchmarks_dir() -> Path:
    """The shipped OOD benchmarks, `<name>/*.jsonl`, with their README (sources and licences)."""
    return assets_dir() / "benchmarks"


def config_presets() -> dict[str, Path]:
    """`kind/name` -> file of every shipped run config, sorted by name."""
    root = assets_dir() / "configs"
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(root.glob("*/*.toml"))}


def experiment_presets() -> dict[str, Path]:
    """`name` -> file of every shipped experiment file, sorted by name."""
    return {p.stem: p for p in sorted((assets_dir() / "experiments").glob("*.toml"))}


def first_comment(path: Path) -> str:
    """A preset's summary: the text of its first `#` line ("" when it has none)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def _name(value: str, folder: str) -> str:
    # experiment files name configs as `configs/sft/tiny.toml`: the checkout's path of the preset
    return value.removeprefix(f"{folder}/").removesuffix(".toml")


def resolve_config(value: str | Path, kind: str | None = None) -> Path:
    """The run config `--config VALUE` names: an existing file, else the preset `kind/name`
    (optionally with `configs/` before it and `.toml` after it), else for a bare name the preset of
    `kind` (train-sft: sft, train-tgrpo: tgrpo) or the one kind that has it. PresetError otherwise,
    listing the presets."""
    if Path(value).is_file():
        return Path(value)
    presets = config_presets()
    name = _name(str(value), "configs")
    if name in presets:
        return presets[name]
    if "/" not in name:
        kinds = [k for k in ((kind,) if kind else KINDS) if f"{k}/{name}" in presets]
        if len(kinds) == 1:
            return presets[f"{kinds[0]}/{name}"]
        if len(kinds) > 1:
            choices = " or ".join(f"{k}/{name}" for k in kinds)
            raise PresetError(f"--config {value}: a preset of both trainers; name one: {choices}")
    if Path(value).exists():  # a directory: the config loader says what is wrong with it
        return Path(value)
    raise PresetError(
        f"--config {value}: neither a file nor a preset (presets: {', '.join(presets)}; "
        "`psyrl config list` describes them)"
    )


def resolve_experiment(value: str | Path) -> Path:
    """The experiment file `psyrl experiment VALUE` names: an existing file, else the preset `name`
    (optionally `experiments/name.toml`); PresetError otherwise, listing the presets."""
    if Path(value).exists():  # a directory too: the experiment loader says it cannot read it
        return Path(value)
    presets = experiment_presets()
    name = _name(str(value), "experiments")
    if name in presets:
        return presets[name]
    raise PresetError(
        f"{value}: neither an experiment file nor a preset (presets: {', '.join(presets)})"
    )


def is_preset(path: Path) -> bool:
    """Whether `path` is one of the package's own files (read-only where psyrl is installed)."""
    return path.resolve().is_relative_to(assets_dir().resolve())


def preset_writing(run_dir: str) -> str | None:
    """The trainer command of the preset whose run writes `runs/<name>/` when `run_dir` is
    `runs/<name>/...` (a model.path a user has not trained yet), else None."""
    parts = Path(run_dir).parts
    if len(parts) < 2 or parts[0] != "runs":
        return None
    for name, path in config_presets().items():
        run = tomli.loads(path.read_text(encoding="utf-8")).get("run", {})
        if run.get("name") == parts[1] and run.get("output_dir", "runs") == "runs":
            return f"psyrl train-{name.split('/')[0]} --config {name}"
    return None


def copy_benchmarks(out: Path, overwrite: bool = False) -> list[Path]:
    """Copy the shipped benchmarks (README.md, `<name>/*.jsonl`) into `out`, to read or edit; an
    existing file is an error unless `overwrite`, before anything is written. Returns the copies."""
    source = benchmarks_dir()
    shipped = [source / "README.md", *sorted(source.glob("*/*.jsonl"))]
    targets = [out / f.relative_to(source) for f in shipped]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not overwrite:
        raise PresetError(f"{', '.join(existing)}: already there (--overwrite replaces them)")
    for f, target in zip(shipped, targets):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    return targets

"""psyrl.core.presets: the run configs, experiment files and benchmarks shipped inside the package
(issue 30), found by name from any directory; a file of the same path always wins."""

import filecmp
import fnmatch
import os
from pathlib import Path

import pytest
import tomli
from click.testing import CliRunner

from psyrl.cli.evaluate import evaluate
from psyrl.cli.main import main
from psyrl.core.config import dump_config, load_config
from psyrl.core.presets import (
    PresetError,
    assets_dir,
    benchmarks_dir,
    config_presets,
    copy_benchmarks,
    experiment_presets,
    first_comment,
    preset_writing,
    resolve_config,
    resolve_experiment,
)
from psyrl.core.records import DataError, load_stimuliqa
from psyrl.eval.benchmarks import EvalError, resolve_sources
from psyrl.experiment.read import load_experiment

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "psyrl" / "assets"


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    """A working directory without configs/, experiments/ or data/: a `pip install psyrl` user's."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_presets_are_the_shipped_files():
    assert set(config_presets()) == {
        *(f"sft/{n}" for n in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tiny")),
        "sft/tiny-self-train",
        *(f"tgrpo/{n}" for n in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tiny")),
    }
    assert "table2-tiny" in experiment_presets() and len(experiment_presets()) == 25
    assert assets_dir() == Path(os.path.realpath(ASSETS))  # this checkout is the package


@pytest.mark.parametrize("name", sorted(config_presets()))
def test_every_config_preset_loads_by_name_from_an_empty_directory(name, empty_cwd):
    path = resolve_config(name)
    assert path == config_presets()[name] and path.is_file()
    load_config(path)
    assert first_comment(path)  # `psyrl config list` has a line to show


@pytest.mark.parametrize("name", sorted(experiment_presets()))
def test_every_experiment_preset_loads_from_an_empty_directory(name, empty_cwd):
    # its `config = "configs/..."` are checked as the trainer resolves them: presets here
    experiment = load_experiment(resolve_experiment(name))
    # the package may be read-only: results go under the working directory, not beside the file
    assert experiment.results_dir == Path("experiments") / name
    assert first_comment(experiment.path)


@pytest.mark.parametrize(
    "value,kind,name",
    [
        ("tgrpo/qwen2.5-3b", None, "tgrpo/qwen2.5-3b"),
        ("sft/tiny", "tgrpo", "sft/tiny"),  # an explicit kind wins over the command's
        ("sft/tiny.toml", None, "sft/tiny"),
        ("configs/sft/tiny.toml", None, "sft/tiny"),  # experiment files' spelling
        ("configs/tgrpo/tiny", None, "tgrpo/tiny"),
        ("tiny", "sft", "sft/tiny"),  # a bare name: the command's kind
        ("tiny", "tgrpo", "tgrpo/tiny"),
        ("tiny.toml", "tgrpo", "tgrpo/tiny"),
        ("tiny-self-train", None, "sft/tiny-self-train"),  # one kind has it
    ],
)
def test_preset_names_resolve(value, kind, name, empty_cwd):
    assert resolve_config(value, kind) == config_presets()[name]


def test_a_file_of_the_same_path_wins_over_the_preset(empty_cwd):
    for value in ("configs/sft/tiny.toml", "tiny", "tgrpo/qwen2.5-3b"):
        mine = empty_cwd / value
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.write_text('[run]\nname = "mine"\n')
        assert resolve_config(value, "sft") == Path(value)
        assert load_config(resolve_config(value, "sft")).run.name == "mine"
    (empty_cwd / "experiments").mkdir()
    (empty_cwd / "experiments" / "table2-tiny.toml").write_text("")
    assert resolve_experiment("experiments/table2-tiny.toml") == Path(
        "experiments/table2-tiny.toml"
    )
    assert resolve_experiment("table2-tiny") == experiment_presets()["table2-tiny"]


def test_a_bare_name_of_both_kinds_without_a_kind_names_both(empty_cwd):
    with pytest.raises(PresetError, match="name one: sft/tiny or tgrpo/tiny"):
        resolve_config("tiny")


def test_an_unknown_name_is_neither_a_file_nor_a_preset_and_the_presets_are_listed(empty_cwd):
    with pytest.raises(PresetError) as e:
        resolve_config("qwen2.5-7b", "tgrpo")
    assert "--config qwen2.5-7b: neither a file nor a preset" in str(e.value)
    for name in config_presets():
        assert name in str(e.value)
    with pytest.raises(PresetError, match="tiny-self-train: neither"):
        resolve_config("tiny-self-train", "tgrpo")  # an SFT preset is no T-GRPO config
    with pytest.raises(PresetError, match="table9-tiny: neither an experiment file nor a preset"):
        resolve_experiment("table9-tiny")


def test_the_checkout_paths_are_the_package_folders():
    for link, folder in (
        ("configs", "configs"),
        ("experiments", "experiments"),
        ("data/benchmarks", "benchmarks"),
    ):
        assert (ROOT / link).is_symlink(), link
        assert os.path.realpath(ROOT / link) == os.path.realpath(ASSETS / folder)
    assert benchmarks_dir() == Path(os.path.realpath(ROOT / "data" / "benchmarks"))


def test_the_wheel_ships_every_preset_and_benchmark_file():
    # pyproject's package-data globs, matched as setuptools does (relative to psyrl/)
    with open(ROOT / "pyproject.toml", "rb") as f:
        patterns = tomli.load(f)["tool"]["setuptools"]["package-data"]["psyrl"]
    shipped = [
        p.relative_to(ROOT / "psyrl").as_posix()
        for folder in ("configs", "experiments", "benchmarks")
        for p in (ASSETS / folder).rglob("*")
        if p.is_file()
        and not p.relative_to(ASSETS / folder).parts[0].startswith(".")
        # experiments/<name>/ holds results a checkout's `psyrl experiment` wrote: not shipped
        and not (folder == "experiments" and p.parent != ASSETS / folder)
    ]
    assert "assets/benchmarks/README.md" in shipped  # the licences' attribution goes with the data
    missing = [p for p in shipped if not any(fnmatch.fnmatch(p, pat) for pat in patterns)]
    assert not missing


def test_config_show_prints_a_preset_from_an_empty_directory(empty_cwd):
    result = CliRunner().invoke(main, ["config", "show", "--config", "tgrpo/qwen2.5-3b"])
    assert result.exit_code == 0, result.output
    assert result.output == dump_config(load_config(config_presets()["tgrpo/qwen2.5-3b"]))
    assert 'name = "qwen2.5-3b-tgrpo"' in result.output
    unknown = CliRunner().invoke(main, ["config", "show", "--config", "nope"])
    assert unknown.exit_code == 1 and "neither a file nor a preset" in unknown.output


def test_config_list_names_every_preset_with_its_first_comment_line():
    result = CliRunner().invoke(main, ["config", "list"])
    assert result.exit_code == 0, result.output
    for name, path in {**config_presets(), **experiment_presets()}.items():
        assert f"  {name} " in result.output and first_comment(path) in result.output


def test_plan_takes_a_preset_and_its_kind_from_it(empty_cwd):
    result = CliRunner().invoke(main, ["plan", "--config", "sft/qwen2.5-0.5b", "--gpus", "4"])
    assert result.exit_code in (0, 3), result.output
    assert "(sft); architecture from" in result.output


def test_experiment_dry_run_of_a_preset_from_an_empty_directory(empty_cwd):
    result = CliRunner().invoke(main, ["experiment", "table2-tiny", "--dry-run"])
    assert result.exit_code == 0, result.output
    # the trainers get the file's own spelling, which they resolve to the preset the same way
    assert "train-sft --config configs/sft/tiny.toml" in result.output
    assert "train-tgrpo --config configs/tgrpo/tiny.toml" in result.output
    assert not any(empty_cwd.iterdir())  # a dry run writes nothing
    unknown = CliRunner().invoke(main, ["experiment", "table9-tiny", "--dry-run"])
    assert unknown.exit_code == 1 and "table2-tiny" in unknown.output


def test_an_experiment_file_of_the_user_keeps_its_results_beside_it(tmp_path):
    copy = tmp_path / "mine.toml"
    copy.write_text(experiment_presets()["table2-tiny"].read_text())
    assert load_experiment(copy).results_dir == tmp_path / "mine"


def test_a_missing_demo_file_names_the_command_that_writes_it(empty_cwd):
    with pytest.raises(DataError, match=r"psyrl demo-data --out data/demo`"):
        load_stimuliqa("data/demo/train.jsonl")  # the tiny presets' data.train_file
    with pytest.raises(DataError) as other:
        load_stimuliqa("data/stimuliqa/train.jsonl")
    assert "demo-data" not in str(other.value)


def test_a_missing_model_under_runs_names_the_preset_that_trains_it(empty_cwd):
    assert preset_writing("runs/tiny-sft/checkpoints/step-200/hf") == (
        "psyrl train-sft --config sft/tiny"
    )
    assert preset_writing("runs/tiny-tgrpo/hf") == "psyrl train-tgrpo --config tgrpo/tiny"
    assert preset_writing("runs/someone-else/hf") is None
    assert preset_writing("models/Qwen2.5-3B-Instruct") is None
    from psyrl.core.config import ModelConfig
    from psyrl.runtime.model import load_tokenizer  # transformers: only this test needs it

    # tgrpo/tiny's model.path: the tiny SFT run's checkpoint, not trained yet here
    path = load_config(resolve_config("tiny", "tgrpo")).model.path
    with pytest.raises(FileNotFoundError, match="written by `psyrl train-sft --config sft/tiny`"):
        load_tokenizer(ModelConfig(path=path))


def test_the_benchmarks_default_to_the_package_and_copy_out(empty_cwd):
    default = next(p for p in evaluate.params if p.name == "benchmark_dir").default
    assert Path(default) == benchmarks_dir()
    assert [s.name for s in resolve_sources(["bbh"], default)] == ["bbh"]
    written = copy_benchmarks(Path("copy"))
    assert Path("copy/README.md") in written and len(written) == 7
    for path in written:
        assert filecmp.cmp(path, benchmarks_dir() / path.relative_to("copy"), shallow=False)
    with pytest.raises(PresetError, match="already there"):
        copy_benchmarks(Path("copy"))
    assert copy_benchmarks(Path("copy"), overwrite=True) == written
    result = CliRunner().invoke(main, ["data", "benchmarks", "--out", "cli"])
    assert result.exit_code == 0 and "wrote 7 files" in result.output, result.output
    with pytest.raises(EvalError, match="psyrl data benchmarks --out DIR"):
        resolve_sources(["tombench"], "nowhere")

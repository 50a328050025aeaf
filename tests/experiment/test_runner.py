"""psyrl.experiment.runner: `psyrl experiment FILE --dry-run` on every shipped experiment file, the
CLI's bad options, and what a unit still has to run given what is on disk (skip, evaluate only,
--overwrite, --resume) -- on fake run directories, nothing trained."""

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.experiment import experiment_command
from psyrl.core.checkpoints import write_manifest
from psyrl.experiment.read import load_experiment
from psyrl.experiment.runner import resolve, restart_flag, steps, substitute
from psyrl.experiment.spec import plan, unit_dir

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "experiments").glob("*.toml"))
HEADER = re.compile(r"^# (\S+)(?: \(seed (\d+)\))?: (.+)$")


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    """Config paths in experiment files are relative to the repository root."""
    monkeypatch.chdir(REPO)


def invoke(*args: str):
    return CliRunner().invoke(experiment_command, [str(a) for a in args])


def set_values(argv: list[str]) -> list[str]:
    """The values of every `--set` in argv, in order."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


# ---------------------------------------------------------------- --dry-run


def has(line: str, fragment: str) -> bool:
    """`fragment` in the printed command line, as whole words."""
    return re.search(r"(^|\s)" + re.escape(fragment) + r"(\s|$)", line) is not None


def printed_model(experiment, unit) -> str:
    """How a dry run prints the unit's model reference when nothing has run yet: a run's hf/, the
    select-checkpoint command for `run@rule`, or the path."""
    name, _, rule = unit.run.model.partition("@")
    target = experiment.runs.get(name)
    if target is None:
        return shlex.quote(unit.run.model)
    directory = unit_dir(experiment, target, unit.seed if target.seeds else None)
    return (
        f"$(psyrl select-checkpoint {directory} --rule {rule})" if rule else str(directory / "hf")
    )


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_dry_run_of_shipped_experiments(tmp_path, path):
    # the printed lines are checked as text here; the test of the X@median quoting shlex-splits
    result = invoke(path, "--dry-run", "--output-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    experiment = load_experiment(path, str(tmp_path))
    units = plan(experiment)
    root = tmp_path / experiment.name
    lines = result.output.splitlines()
    # one header per unit, in plan order, then one line per step; nothing has run yet; a join
    # (a table row) runs nothing and has no header, an opt-in run not opted into is left out
    cursor = 0
    for unit in (u for u in units if u.run.kind != "join"):
        match = HEADER.match(lines[cursor])
        assert match, lines[cursor]
        assert (match[1], None if match[2] is None else int(match[2])) == unit.key
        if unit.run.opt_in:
            assert match[3] == f"left out (runs with --opt-in {unit.run.opt_in})"
            cursor += 1
            continue
        whats = {
            "sft": ["train", "evaluate"],
            "tgrpo": ["train", "evaluate"],
            "evaluate": ["evaluate"],
            "psyrl": ["psyrl"],
        }[unit.run.kind]
        if unit.run.kind in ("sft", "tgrpo") and not unit.run.evaluate:
            whats = ["train"]
        assert match[3] == ", ".join(whats)
        commands = dict(zip(whats, lines[cursor + 1 : cursor + 1 + len(whats)]))
        cursor += 1 + len(whats)
        seeded = unit.seed is not None
        ranks = unit.run.nproc or (1 if unit.run.kind == "psyrl" else experiment.nproc)
        if ranks > 1:
            launcher = (
                f"--standalone --nproc_per_node {ranks} "
                f"{shlex.join(experiment.torchrun_args)} -m psyrl".replace("  ", " ")
            )
        else:
            launcher = f"{sys.executable} -m psyrl"
        if "train" in commands:
            line = commands["train"]
            if ranks > 1:
                assert line.split()[0].endswith("torchrun")
            assert launcher in line
            assert has(line, f"train-{unit.run.kind} --config {unit.run.config}")
            assert has(line, f"--set run.output_dir={root} --set run.name={unit.dir.name}")
            assert has(line, f"--set run.seed={unit.seed}") == seeded
            if unit.run.model:
                assert f"model.path={printed_model(experiment, unit)}" in line
            else:
                assert "model.path=" not in line
            for override in unit.run.overrides:
                value = substitute(experiment, unit, override, dry=True)
                assert has(line, f"--set {shlex.quote(value)}"), (value, line)
            assert "--resume" not in line and "--overwrite" not in line
        if "evaluate" in commands:
            line = commands["evaluate"]
            benchmarks = unit.run.benchmarks or experiment.eval_benchmarks
            assert launcher in line
            assert has(line, f"evaluate --benchmarks {','.join(benchmarks)}")
            assert has(line, f"--seed {unit.seed}") == seeded
            assert shlex.join(experiment.eval_args) in line
            if unit.run.kind == "evaluate":
                assert line.endswith(f"--out {unit.dir}")
                if unit.run.model:
                    model = printed_model(experiment, unit)
                    assert f"--model {model}" in line or f'--model "{model}"' in line
            else:
                assert line.endswith(f"--model {unit.dir / 'hf'} --out {unit.dir / 'eval'}")
        if "psyrl" in commands:
            args = [substitute(experiment, unit, a, dry=True) for a in unit.run.args]
            if ranks == 1:
                assert commands["psyrl"] == shlex.join([sys.executable, "-m", "psyrl", *args])
            else:
                assert launcher in commands["psyrl"] and commands["psyrl"].endswith(
                    shlex.join(args)
                )
    assert cursor == len(lines)


def test_dry_run_of_unfinished_rule_reference(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text(
        '[evaluate]\nbenchmarks = ["data/demo/test.jsonl"]\n'
        '[runs.sft]\nkind = "sft"\nconfig = "configs/sft/tiny.toml"\nseeds = [0, 1]\n'
        '[runs.tg]\nkind = "tgrpo"\nconfig = "configs/tgrpo/tiny.toml"\n'
        'model = "sft@median"\nseeds = [0, 1]\n'
        '[runs.ev]\nkind = "evaluate"\nmodel = "sft@best"\nseeds = [1]\n'
    )
    result = invoke(path, "--dry-run", "--output-dir", tmp_path / "out")
    assert result.exit_code == 0, result.output
    root = tmp_path / "out" / "e"
    # each seed of tg reads its own seed of sft, chosen when sft has finished
    for seed in (0, 1):
        assert (
            f"model.path=$(psyrl select-checkpoint {root / f'sft-seed{seed}'} --rule median)"
            in result.output
        )
    evaluate = next(line for line in result.output.splitlines() if f"{root / 'ev-seed1'}" in line)
    argv = shlex.split(evaluate)
    assert (
        argv[argv.index("--model") + 1]
        == f"$(psyrl select-checkpoint {root / 'sft-seed1'} --rule best)"
    )
    assert "--seed" in argv and argv[argv.index("--seed") + 1] == "1"


def test_dry_run_trainer_command_with_rule_is_valid_shell(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text(
        '[evaluate]\nbenchmarks = ["data/demo/test.jsonl"]\n'
        '[runs.sft]\nkind = "sft"\nconfig = "configs/sft/tiny.toml"\n'
        '[runs.tg]\nkind = "tgrpo"\nconfig = "configs/tgrpo/tiny.toml"\n'
        'model = "sft@median"\n'
    )
    result = invoke(path, "--dry-run", "--output-dir", tmp_path / "out")
    train = next(line for line in result.output.splitlines() if "train-tgrpo" in line)
    argv = shlex.split(train)  # ValueError: No closing quotation
    assert (
        "model.path=$(psyrl select-checkpoint "
        f"{tmp_path / 'out' / 'e' / 'sft'} --rule median)" in set_values(argv)
    )


def test_dry_run_options(tmp_path):
    tiny = REPO / "experiments" / "table2-tiny.toml"
    result = invoke(
        tiny,
        "--dry-run",
        "--output-dir",
        tmp_path,
        "--seeds",
        "0",
        "--nproc",
        "1",
        "--limit",
        "5",
        "--set",
        "run.steps=1",
        "--only",
        "bilateral",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # --only bilateral pulls in what it reads: instruct; --seeds 0: one seed
    assert [line for line in lines if line.startswith("# ")] == [
        "# instruct: train",
        "# bilateral (seed 0): train, evaluate",
    ]
    commands = [shlex.split(line) for line in lines if not line.startswith("# ")]
    assert all(c[:3] == [sys.executable, "-m", "psyrl"] for c in commands)  # --nproc 1
    instruct, bilateral, evaluate = commands
    # --set comes after the file's own overrides, on every trainer run
    assert set_values(instruct)[-3:] == ["run.steps=200", "checkpoint.every=200", "run.steps=1"]
    assert set_values(bilateral)[-1] == "run.steps=1"
    assert "run.seed=0" in set_values(bilateral)
    assert evaluate[evaluate.index("--limit") + 1] == "5"
    assert "--limit" not in bilateral


BAD_OPTIONS = [
    (["--only", "nosuch"], "--only", "no run 'nosuch'"),
    (["--seeds", "x"], "--seeds", "'x': expected S[,S...], distinct integers >= 0"),
    (["--seeds", "0,x"], "--seeds", "expected S[,S...]"),
    (["--nproc", "0"], "--nproc", "must be >= 1"),
    (["--limit", "0"], "--limit", "must be >= 1"),
    (["--set", "run.steps"], "--set", "'run.steps' is not TABLE.KEY=VALUE"),
    (["--set", "steps=1"], "--set", "'steps=1' is not TABLE.KEY=VALUE"),
    (["--nproc", "two"], "--nproc", "'two' is not a valid integer"),
]


@pytest.mark.parametrize(
    "options,option,fragment", BAD_OPTIONS, ids=[" ".join(o[0]) for o in BAD_OPTIONS]
)
def test_bad_option_is_a_one_line_error(tmp_path, options, option, fragment):
    tiny = REPO / "experiments" / "table2-tiny.toml"
    result = invoke(tiny, "--dry-run", "--output-dir", tmp_path, *options)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and option in errors[0] and fragment in errors[0], result.output
    assert not any(line.startswith("# ") for line in result.output.splitlines())  # ran nothing


def test_negative_seed_option_is_an_error(tmp_path):
    tiny = REPO / "experiments" / "table2-tiny.toml"
    result = invoke(tiny, "--dry-run", "--output-dir", tmp_path, "--seeds", "-1")
    assert result.exit_code == 2, result.output[:200]


def test_bad_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[runs.a]\nkind = "dpo"\n')
    result = invoke(path, "--dry-run")
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert (
        result.output.strip() == f"Error: {path}:2: run 'a': kind must be one of sft, tgrpo, "
        "evaluate, psyrl, join, got 'dpo'"
    )


# ---------------------------------------------------------------- what is left to run

SMALL = """[evaluate]
benchmarks = ["data/demo/test.jsonl"]
args = ["--no-progress"]

[runs.sft]
kind = "sft"
config = "configs/sft/tiny.toml"
seeds = [0]

[runs.quiet]
kind = "sft"
config = "configs/sft/tiny.toml"
evaluate = false

[runs.tg]
kind = "tgrpo"
config = "configs/tgrpo/tiny.toml"
model = "sft@median"
seeds = [0]

[runs.ev]
kind = "evaluate"
model = "sft"
args = ["--prompt", "cot"]
seeds = [0]

[runs.report]
kind = "psyrl"
args = ["summary", "{run:tg}", "{eval:tg}", "{eval:ev}", "--out", "{dir}/summary.md"]
creates = "summary.md"
seeds = [0]
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    experiment = load_experiment(path, str(tmp_path / "runs"))
    return experiment, {u.key: u for u in plan(experiment)}


def touch(path: Path, text: str = "{}") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def checkpoint(
    run_dir: Path, step: int, f1: float | None = None, resumable: bool = True, complete: bool = True
) -> Path:
    """A fake checkpoints/step-N: a manifest (file sizes, resumable), its files and an export with
    a manifest of its own."""
    directory = run_dir / "checkpoints" / f"step-{step}"
    touch(directory / "state" / "x.distcp", "abc")
    touch(directory / "hf" / "config.json", "{}")
    write_manifest(directory / "hf")
    if f1 is not None:
        touch(directory / "validation.json", json.dumps({"valid/f1": f1}))
    files = {
        str(p.relative_to(directory)): p.stat().st_size
        for p in directory.rglob("*")
        if p.is_file() and p != directory / "manifest.json"
    }
    files["state/x.distcp"] += 0 if complete else 1  # a wrong size: incomplete
    touch(directory / "manifest.json", json.dumps({"files": files, "resumable": resumable}))
    return directory


def left(experiment, unit, evaluate: tuple[str, ...] = (), dry: bool = False):
    """runner.steps: what the unit still has to run, with `evaluate` added to its evaluations."""
    return steps(experiment, unit, (), evaluate, dry=dry)


def whats(todo) -> list[str]:
    return [what for what, _ in todo]


def test_trainer_finished_and_evaluated_is_done(small):
    experiment, units = small
    unit = units[("sft", 0)]
    touch(unit.dir / "hf" / "config.json")
    touch(unit.dir / "eval" / "results.json")
    assert left(experiment, unit) == []


def test_trainer_finished_not_evaluated_runs_only_the_evaluation(small):
    experiment, units = small
    unit = units[("sft", 0)]
    touch(unit.dir / "hf" / "config.json")
    todo = left(experiment, unit, evaluate=("--limit", "7"))
    assert whats(todo) == ["evaluate"]
    argv = todo[0][1]
    assert argv[:4] == [sys.executable, "-m", "psyrl", "evaluate"]
    assert argv[argv.index("--model") + 1] == str(unit.dir / "hf")
    assert argv[argv.index("--out") + 1] == str(unit.dir / "eval")
    assert argv[argv.index("--seed") + 1] == "0"
    assert argv[argv.index("--limit") + 1] == "7"
    assert "--no-progress" in argv


def test_trainer_without_evaluation_is_done_with_its_hf(small):
    experiment, units = small
    unit = units[("quiet", None)]
    assert whats(left(experiment, unit)) == ["train"]
    touch(unit.dir / "hf" / "config.json")
    assert left(experiment, unit) == []


def test_fresh_trainer_has_no_restart_flag(small):
    experiment, units = small
    unit = units[("sft", 0)]
    assert restart_flag(unit.dir) == []
    todo = left(experiment, unit)
    assert whats(todo) == ["train", "evaluate"]
    assert "--resume" not in todo[0][1] and "--overwrite" not in todo[0][1]


def test_trainer_cut_off_resumes_with_auto_and_is_never_overwritten(small):
    # --resume auto decides: start over a run of this config with no checkpoint directory, skip a
    # damaged checkpoint, refuse when none passes; deleting a run is never the runner's decision
    experiment, units = small
    unit = units[("sft", 0)]
    touch(unit.dir / "metrics.jsonl", '{"step": 1}\n')
    assert restart_flag(unit.dir) == ["--resume", "auto"]
    assert left(experiment, unit)[0][1][-2:] == ["--resume", "auto"]
    checkpoint(unit.dir, 2, complete=False)
    checkpoint(unit.dir, 1, resumable=False)
    assert restart_flag(unit.dir) == ["--resume", "auto"]
    assert "--overwrite" not in left(experiment, unit)[0][1]


def test_trainer_with_a_checkpoint_resumes(small):
    experiment, units = small
    unit = units[("sft", 0)]
    touch(unit.dir / "metrics.jsonl", '{"step": 1}\n')
    checkpoint(unit.dir, 4)
    checkpoint(unit.dir, 6, complete=False)  # cut off while writing: the step-4 one is used
    assert restart_flag(unit.dir) == ["--resume", "auto"]
    argv = left(experiment, unit)[0][1]
    assert argv[-2:] == ["--resume", "auto"] and "--overwrite" not in argv


def test_evaluate_unit(small):
    experiment, units = small
    unit = units[("ev", 0)]
    todo = left(experiment, unit)
    assert whats(todo) == ["evaluate"]
    argv = todo[0][1]
    # a plain run name is that run's final hf/ (same seed); the run's args, then --out
    assert argv[argv.index("--model") + 1] == str(units[("sft", 0)].dir / "hf")
    assert argv[-4:] == ["--prompt", "cot", "--out", str(unit.dir)]
    touch(unit.dir / "results.json")
    assert left(experiment, unit) == []


def test_psyrl_unit_placeholders_and_creates(small):
    experiment, units = small
    unit = units[("report", 0)]
    tg, ev = units[("tg", 0)], units[("ev", 0)]
    todo = left(experiment, unit)
    assert todo == [
        (
            "psyrl",
            [
                sys.executable,
                "-m",
                "psyrl",
                "summary",
                str(tg.dir),
                str(tg.dir / "eval"),
                str(ev.dir),
                "--out",
                f"{unit.dir}/summary.md",
            ],
        )
    ]
    touch(unit.dir / "summary.md", "done")
    assert left(experiment, unit) == []


def test_finished_rule_reference_resolves_to_the_selected_checkpoint(small):
    experiment, units = small
    sft = units[("sft", 0)].dir
    touch(sft / "hf" / "config.json")
    # valid F1 by step: 2 -> 0.3, 4 -> 0.5, 6 -> 0.4, 8 -> 0.9 but damaged: nothing is chosen
    # while it is there; without it the median (lower) of [0.3, 0.4, 0.5] = 0.4 -> step 6; best
    # 0.5 -> step 4; last -> step 6
    for step, f1 in ((2, 0.3), (4, 0.5), (6, 0.4)):
        checkpoint(sft, step, f1)
    damaged = checkpoint(sft, 8, 0.9, complete=False)
    with pytest.raises(SystemExit, match="step-8: damaged checkpoint"):
        resolve(experiment, "sft@best", 0, dry=False)
    shutil.rmtree(damaged)
    chosen = sft / "checkpoints"
    assert resolve(experiment, "sft@median", 0, dry=False) == str(chosen / "step-6" / "hf")
    assert resolve(experiment, "sft@best", 0, dry=True) == str(chosen / "step-4" / "hf")
    assert resolve(experiment, "sft@last", 0, dry=False) == str(chosen / "step-6" / "hf")
    assert resolve(experiment, "sft", 0, dry=False) == str(sft / "hf")
    assert resolve(experiment, "models/x", 0, dry=False) == "models/x"
    argv = left(experiment, units[("tg", 0)], dry=True)[0][1]
    assert f"model.path={chosen / 'step-6' / 'hf'}" in set_values(argv)


def test_rule_reference_without_checkpoints_is_a_clean_exit(small):
    experiment, units = small
    touch(units[("sft", 0)].dir / "hf" / "config.json")
    with pytest.raises(SystemExit, match="run 'sft': .*no checkpoints/step-N/validation.json"):
        resolve(experiment, "sft@median", 0, dry=False)


def test_a_finished_run_of_other_settings_is_refused(tmp_path):
    # a 1-step check's run must not stand in a full table: the settings each unit ran with are
    # kept in experiment.json and a different invocation is refused before anything runs
    path = tmp_path / "e.toml"
    path.write_text(
        '[runs.data]\nkind = "psyrl"\nargs = ["demo-data", "--out", "{dir}"]\n'
        'creates = "train.jsonl"\n'
    )
    root = tmp_path / "runs" / "e"
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_text("{}\n")
    (root / "experiment.json").write_text(
        json.dumps({"_settings": {"data": {"set": ["run.steps=1"], "eval": []}}})
    )
    result = invoke(path, "--output-dir", tmp_path / "runs")
    assert result.exit_code == 1, result.output
    assert "ran with --set ['run.steps=1']" in result.output
    assert "another --output-dir" in result.output
    again = invoke(path, "--output-dir", tmp_path / "runs", "--set", "run.steps=1")
    assert again.exit_code == 0 and "done, skipped" in again.output, again.output


def test_a_psyrl_run_that_writes_no_creates_file_stops_the_experiment(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text(
        '[runs.data]\nkind = "psyrl"\nargs = ["demo-data", "--out", "{dir}"]\n'
        'creates = "nothing.jsonl"\n'
    )
    result = invoke(path, "--output-dir", tmp_path / "runs")
    assert result.exit_code == 1
    assert "exited 0 but wrote no" in result.output and "nothing.jsonl" in result.output

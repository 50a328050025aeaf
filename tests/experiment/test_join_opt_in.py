"""A join (a table row made of one evaluation per benchmark: the paper's dataset-specific
Psy-Interpreter-SFT models) and opt-in runs (ToMbench's self-training, behind --opt-in): their
errors, their plan, what the runner does with them, their table rows; and `psyrl self-label
--benchmark`, which makes one SFT set per benchmark."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_tables import row, write_evaluation

from psyrl.cli.evaluate import self_label_command
from psyrl.cli.experiment import experiment_command
from psyrl.experiment.read import load_experiment
from psyrl.experiment.runner import collect, run_experiment
from psyrl.experiment.spec import ExperimentError, plan, select
from psyrl.experiment.tables import ALL, build_table

REPO = Path(__file__).resolve().parents[2]
WORD = "train-on-evaluation-only-tombench"
FILE = f"""[evaluate]
benchmarks = ["x", "y"]

[runs.before]
kind = "evaluate"
label = "Before"
model = "models/m"

[runs.tune-x]
kind = "sft"
config = "configs/sft/tiny.toml"
model = "models/m"
evaluate = false

[runs.after-x]
kind = "evaluate"
model = "tune-x"
benchmarks = ["x"]

[runs.tune-y]
kind = "sft"
opt_in = "{WORD}"
config = "configs/sft/tiny.toml"
model = "models/m"
evaluate = false

[runs.after-y]
kind = "evaluate"
opt_in = "{WORD}"
model = "tune-y"
benchmarks = ["y"]

[runs.after]
kind = "join"
label = "After, one model per benchmark"
runs = ["after-x", "after-y"]

[[tables]]
columns = "benchmarks"
rows = ["before", "after"]
compare = [["after", "before"]]
"""


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "j.toml"
    path.write_text(FILE)
    return load_experiment(path, str(tmp_path / "runs"))


def invoke(*args):
    return CliRunner().invoke(experiment_command, [str(a) for a in args])


# ---------------------------------------------------------------- errors

EVALUATE = '[evaluate]\nbenchmarks = ["x"]\n'
PARTS = (
    '[runs.p]\nkind = "evaluate"\nmodel = "m"\nbenchmarks = ["x"]\n'
    '[runs.q]\nkind = "evaluate"\nmodel = "m"\nbenchmarks = ["y"]\n'
)
CASES = [
    (
        "no-runs",
        EVALUATE + PARTS + '[runs.j]  # <-\nkind = "join"\n',
        "run 'j': a join needs runs = [distinct evaluate runs], got []",
    ),
    (
        "repeated-run",
        EVALUATE + PARTS + '[runs.j]\nkind = "join"\nruns = ["p", "p"]  # <-\n',
        "a join needs runs = [distinct evaluate runs], got ['p', 'p']",
    ),
    (
        "unknown-run",
        EVALUATE + PARTS + '[runs.j]\nkind = "join"\nruns = ["p", "z"]  # <-\n',
        "run 'j': no run named 'z'",
    ),
    (
        "part-without-benchmarks",
        EVALUATE
        + PARTS
        + '[runs.r]\nkind = "evaluate"\nmodel = "m"\n'
        + '[runs.j]\nkind = "join"\nruns = ["p", "r"]  # <-\n',
        "run 'j': 'r' is not an evaluate run with benchmarks of its own",
    ),
    (
        "part-a-trainer",
        EVALUATE
        + PARTS
        + '[runs.t]\nkind = "sft"\nconfig = "configs/sft/tiny.toml"\n'
        + '[runs.j]\nkind = "join"\nruns = ["t"]  # <-\n',
        "'t' is not an evaluate run with benchmarks of its own",
    ),
    (
        "shared-benchmark",
        EVALUATE
        + PARTS
        + '[runs.r]\nkind = "evaluate"\nmodel = "m"\nbenchmarks = ["y"]\n'
        + '[runs.j]\nkind = "join"\nruns = ["p", "q", "r"]  # <-\n',
        "run 'j': 'r' and 'q' both evaluate y",
    ),
    (
        "other-seeds",
        EVALUATE
        + PARTS
        + '[runs.r]\nkind = "evaluate"\nmodel = "m"\nbenchmarks = ["z"]\nseeds = [0]\n'
        + '[runs.j]\nkind = "join"\nruns = ["p", "r"]  # <-\n',
        "run 'j': its runs must have the same seeds",
    ),
    (
        "join-key-of-a-run",
        EVALUATE + PARTS + '[runs.j]\nkind = "join"\nruns = ["p"]\nmodel = "p"  # <-\n',
        "run 'j': unknown key 'model' for kind 'join' (valid: kind, label, runs)",
    ),
    (
        "join-as-a-model",
        EVALUATE
        + PARTS
        + '[runs.j]\nkind = "join"\nruns = ["p", "q"]\n'
        + '[runs.e]\nkind = "evaluate"\nmodel = "j"  # <-\n',
        "run 'j' is a join (a table row): it has no model or directory",
    ),
    (
        "bad-word",
        EVALUATE + '[runs.p]\nkind = "evaluate"\nmodel = "m"\nopt_in = "Use ToMbench"  # <-\n',
        "run 'p': opt_in must be a word of lowercase letters, digits and '-'",
    ),
    (
        "word-not-a-string",
        EVALUATE + '[runs.p]\nkind = "evaluate"\nmodel = "m"\nopt_in = true  # <-\n',
        "opt_in must be a str, got True",
    ),
    (
        "reads-an-opt-in-run",
        EVALUATE
        + '[runs.t]\nkind = "sft"\nconfig = "configs/sft/tiny.toml"\nopt_in = "w"\n'
        + '[runs.e]\nkind = "evaluate"\nmodel = "t"  # <-\n',
        "run 'e' reads 't', which runs only with --opt-in w: give it opt_in = 'w' too",
    ),
    (
        "reads-another-word",
        EVALUATE
        + '[runs.t]\nkind = "sft"\nconfig = "configs/sft/tiny.toml"\nopt_in = "w"\n'
        + '[runs.e]\nkind = "evaluate"\nopt_in = "v"\nmodel = "t@median"  # <-\n',
        "which runs only with --opt-in w",
    ),
]


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("text,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_errors_name_file_line_and_key(tmp_path, text, fragment):
    path = tmp_path / "e.toml"
    path.write_text(text)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{marked_line(text)}: "), message
    assert fragment in message, message


# ---------------------------------------------------------------- plan and runner


def test_a_join_waits_for_its_runs_and_only_pulls_them_in(experiment):
    units = plan(experiment)
    by_key = {u.key: u for u in units}
    assert by_key[("after", None)].needs == [("after-x", None), ("after-y", None)]
    keys = [u.key for u in select(units, ("after",))]
    assert keys == [
        ("tune-x", None),
        ("after-x", None),
        ("tune-y", None),
        ("after-y", None),
        ("after", None),
    ]
    assert experiment.runs["tune-y"].opt_in == WORD and experiment.runs["after"].parts == (
        "after-x",
        "after-y",
    )


def test_dry_run_leaves_opt_in_runs_out_and_runs_nothing_for_a_join(experiment, tmp_path):
    result = invoke(experiment.path, "--dry-run", "--output-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    headers = [line for line in result.output.splitlines() if line.startswith("# ")]
    assert headers == [
        "# before: evaluate",
        "# tune-x: train",
        "# after-x: evaluate",
        f"# tune-y: left out (runs with --opt-in {WORD})",
        f"# after-y: left out (runs with --opt-in {WORD})",
    ]
    opted = invoke(
        experiment.path, "--dry-run", "--output-dir", tmp_path / "runs", "--opt-in", WORD
    )
    assert opted.exit_code == 0, opted.output
    assert "# tune-y: train" in opted.output and "# after-y: evaluate" in opted.output
    assert re.search(r"train-sft .*run\.name=tune-y", opted.output)


def test_opt_in_errors(experiment, tmp_path):
    # a word no run carries: a usage error naming the words there are
    result = invoke(experiment.path, "--dry-run", "--opt-in", "tombench")
    assert result.exit_code == 2
    assert f"'tombench': no run of {experiment.path} has opt_in = 'tombench' ({WORD})" in (
        result.output
    )
    # naming an opt-in run without its word stops before anything runs
    with pytest.raises(SystemExit, match=f"run 'tune-y' runs only with --opt-in {WORD}"):
        run_experiment(experiment, only=("tune-y",), dry_run=True)
    assert not (tmp_path / "runs").exists()


def test_join_row_takes_each_column_from_its_own_evaluation(experiment):
    units = {u.key: u for u in plan(experiment)}
    write_evaluation(
        units[("before", None)].eval_dir,
        [row("x", 1, "", 0.0, None), row("y", 2, "", 0.0, None)],
    )
    # after-x scored x; after-y, an opt-in run, has not run: the row's y cell is empty
    write_evaluation(units[("after-x", None)].eval_dir, [row("x", 1, "", 1.0, None)])
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    after = next(r for r in table["rows"] if r["run"] == "after")
    assert after["cells"]["x"]["psyrl"]["mean"] == 100.0
    assert after["cells"]["y"]["psyrl"] is None
    assert after["cells"][ALL]["psyrl"]["items"] == 1
    assert after["evaluates"] == (
        "one model per benchmark: x: the final export (hf/) of SFT run tune-x; "
        f"y: the final export (hf/) of SFT run tune-y (runs with --opt-in {WORD})"
    )
    # the comparison pairs the items both rows have
    assert table["compare"][0]["cells"][ALL]["psyrl"]["mean"] == 100.0
    # then y's evaluation too
    write_evaluation(units[("after-y", None)].eval_dir, [row("y", 2, "", 0.5, None)])
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    after = next(r for r in table["rows"] if r["run"] == "after")
    assert after["cells"][ALL]["psyrl"]["mean"] == 75.0  # (100 + 50) / 2
    # the join is a row, not a run: the runs table leaves it out; an opt-in run says so
    _, runs = collect(experiment)
    assert [r["run"] for r in runs] == ["before", "tune-x", "after-x", "tune-y", "after-y"]
    status = {r["run"]: r["status"] for r in runs}
    assert status["tune-y"] == f"opt-in (--opt-in {WORD})" and status["after-y"] == "done"


# ---------------------------------------------------------------- psyrl self-label --benchmark


def test_self_label_one_benchmark(tmp_path):
    """An evaluation of two benchmarks labels only the one named (the paper's one SFT set per
    benchmark); a benchmark without predictions is an error."""
    sources = {
        "simpletom": REPO / "psyrl/assets/benchmarks/simpletom/test.jsonl",
        "socialiqa": REPO / "psyrl/assets/benchmarks/socialiqa/dev.jsonl",
    }
    out = tmp_path / "eval"
    out.mkdir()
    rows = []
    for name, path in sources.items():
        for line in path.read_text().splitlines()[:3]:
            record = json.loads(line)
            answer = record["options"][record["answer_index"]]
            prediction = row(name, 0, record["task"], 1.0, True)
            prediction.update(
                id=record["id"],
                response=f"<think>the cue</think><answer>{answer}</answer>",
                extracted=answer,
            )
            rows.append(prediction)
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "results.json").write_text("{}")
    settings = {
        "split": "all",
        "prompt": "cot",
        "options": "paper",
        "sources": [{"name": n, "path": str(p), "schema": "benchmark"} for n, p in sources.items()],
    }
    (out / "eval.json").write_text(json.dumps(settings))
    labelled = tmp_path / "s.jsonl"
    result = CliRunner().invoke(
        self_label_command,
        [str(out), "--any-split", "--benchmark", "socialiqa", "--out", str(labelled)],
    )
    assert result.exit_code == 0, result.output
    assert "kept 3 of 3 predictions" in result.output
    kept = [json.loads(line) for line in labelled.read_text().splitlines()]
    assert [r["id"] for r in kept] == [f"self/{r['id']}" for r in rows[3:]]
    missing = CliRunner().invoke(
        self_label_command,
        [str(out), "--any-split", "--benchmark", "cosmosqa", "--out", str(labelled)],
    )
    assert missing.exit_code != 0 and "has no prediction of cosmosqa" in missing.output

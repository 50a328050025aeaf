"""psyrl.experiment.read and .spec: every error of an experiment file is one ExperimentError naming
the file and the line; the plan's order, seed pairing, --only selection and --seeds."""

import re
from pathlib import Path

import pytest

from psyrl.experiment.read import load_experiment
from psyrl.experiment.spec import (
    ExperimentError,
    plan,
    select,
    unit_dir,
    with_seeds,
)

REPO = Path(__file__).resolve().parents[2]
EVALUATE = '[evaluate]\nbenchmarks = ["data/demo/test.jsonl"]\n'
SFT = 'kind = "sft"\nconfig = "configs/sft/tiny.toml"\n'


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    """Config paths in experiment files are relative to the repository root."""
    monkeypatch.chdir(REPO)


def write(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def marked_line(text: str) -> int:
    """The 1-based line carrying the `# <-` marker: where the error must point."""
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert len(lines) == 1, "exactly one `# <-` marker per case"
    return lines[0]


# ---------------------------------------------------------------- errors: file:line: message

# (id, file text with `# <-` on the line the error must name, a fragment of the message)
CASES = [
    (
        "api-with-model",
        EVALUATE + '[runs.a]\nkind = "evaluate"\nmodel = "m"  # <-\n'
        'args = ["--engine", "openai"]\n',
        "leave model out",
    ),
    (
        "api-on-ranks",
        EVALUATE + '[runs.a]\nkind = "evaluate"\nnproc = 4  # <-\nargs = ["--engine", "openai"]\n',
        "1 with --engine openai",
    ),
    (
        "negative-run-nproc",
        EVALUATE + "[runs.a]\n" + SFT + "nproc = -1  # <-\n",
        "nproc must be >= 1",
    ),
    ("invalid-toml", EVALUATE + '[runs.a]\nkind = = "sft"  # <-\n', "invalid TOML"),
    (
        "unknown-table",
        EVALUATE + "[run.a]  # <-\n" + SFT,
        "unknown table [run] (valid: experiment, evaluate, runs, tables)",
    ),
    (
        "experiment-not-a-table",
        "experiment = 3  # <-\n" + EVALUATE + "[runs.a]\n" + SFT,
        "[experiment] must be a table",
    ),
    (
        "unknown-key-experiment",
        '[experiment]\ndescription = "x"\nnprocs = 2  # <-\n' + EVALUATE + "[runs.a]\n" + SFT,
        "unknown key 'nprocs' in [experiment]",
    ),
    (
        "unknown-key-evaluate",
        '[evaluate]\nbenchmarks = ["b.jsonl"]\nbenchmark = "b.jsonl"  # <-\n[runs.a]\n' + SFT,
        "unknown key 'benchmark' in [evaluate]",
    ),
    (
        "unknown-key-run",
        EVALUATE + "[runs.a]\n" + SFT + "steps = 3  # <-\n",
        "run 'a': unknown key 'steps' for kind 'sft'",
    ),
    (
        "key-of-another-kind",
        EVALUATE + "[runs.a]\n" + SFT + 'args = ["--x"]  # <-\n',
        "run 'a': unknown key 'args' for kind 'sft'",
    ),
    (
        "unknown-key-table",
        EVALUATE + "[runs.a]\n" + SFT + '[[tables]]\nrows = ["a"]\nmetrc = "f1"  # <-\n',
        "tables: unknown key 'metrc'",
    ),
    (
        "bad-kind",
        EVALUATE + '[runs.a]\nkind = "dpo"  # <-\n',
        "run 'a': kind must be one of sft, tgrpo, evaluate, psyrl, join, got 'dpo'",
    ),
    (
        "no-kind",
        EVALUATE + '[runs.a]  # <-\nconfig = "configs/sft/tiny.toml"\n',
        "run 'a': kind must be one of sft, tgrpo, evaluate, psyrl, join, got None",
    ),
    ("inline-table-run", EVALUATE + '[runs]\na = { kind = "dpo" }  # <-\n', "kind must be one of"),
    (
        "bad-run-name",
        EVALUATE + '[runs."a b"]  # <-\n' + SFT,
        "run name 'a b': letters, digits, '-', '_' and '.' only",
    ),
    (
        "sft-without-config",
        EVALUATE + '[runs.a]  # <-\nkind = "sft"\n',
        "run 'a': a sft run needs config",
    ),
    (
        "tgrpo-without-config",
        EVALUATE + '[runs.a]  # <-\nkind = "tgrpo"\nmodel = "m"\n',
        "run 'a': a tgrpo run needs config",
    ),
    (
        "missing-config-file",
        EVALUATE + '[runs.a]\nkind = "sft"\nconfig = "configs/sft/nosuch.toml"  # <-\n',
        "run 'a': no config file configs/sft/nosuch.toml",
    ),
    (
        "config-not-a-string",
        EVALUATE + '[runs.a]\nkind = "sft"\nconfig = 3  # <-\n',
        "config must be a str, got 3",
    ),
    (
        "evaluate-without-model",
        EVALUATE + '[runs.e]  # <-\nkind = "evaluate"\n',
        "run 'e': an evaluate run needs model",
    ),
    (
        "bad-rule",
        EVALUATE + "[runs.a]\n" + SFT + "[runs.b]\n" + SFT + 'model = "a@mean"  # <-\n',
        "run 'b': 'a@mean': after '@' comes one of median, best, last",
    ),
    (
        "unknown-run-in-model",
        EVALUATE + "[runs.a]\n" + SFT + 'model = "nosuch@median"  # <-\n',
        "'nosuch@median': no run named 'nosuch' (runs: a)",
    ),
    (
        "unknown-run-in-args",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + '[runs.p]\nkind = "psyrl"\ncreates = "x"\nargs = ["{model:nosuch@best}"]  # <-\n',
        "no run named 'nosuch' (runs: a, p)",
    ),
    (
        "unknown-run-in-set",
        EVALUATE + "[runs.a]\n" + SFT + 'set = ["model.path={model:nosuch@last}"]  # <-\n',
        "no run named 'nosuch'",
    ),
    (
        "self-reference-model",
        EVALUATE + "[runs.a]\n" + SFT + 'model = "a@median"  # <-\n',
        "run 'a' starts from itself",
    ),
    (
        "self-reference-args",
        EVALUATE + '[runs.p]\nkind = "psyrl"\ncreates = "x"\nargs = ["{run:p}"]  # <-\n',
        "run 'p' starts from itself",
    ),
    (
        "seeds-repeated",
        EVALUATE + "[runs.a]\n" + SFT + "seeds = [0, 1, 0]  # <-\n",
        "run 'a': seeds must be distinct integers >= 0, got [0, 1, 0]",
    ),
    (
        "seeds-negative",
        EVALUATE + "[runs.a]\n" + SFT + "seeds = [-1]  # <-\n",
        "seeds must be distinct integers >= 0, got [-1]",
    ),
    (
        "seeds-bool",
        EVALUATE + "[runs.a]\n" + SFT + "seeds = [true]  # <-\n",
        "seeds must be distinct integers >= 0, got [True]",
    ),
    (
        "seeds-float",
        EVALUATE + "[runs.a]\n" + SFT + "seeds = [1.0]  # <-\n",
        "seeds must be distinct integers >= 0",
    ),
    (
        "seeds-not-a-list",
        EVALUATE + "[runs.a]\n" + SFT + "seeds = 3  # <-\n",
        "seeds must be distinct integers >= 0, got 3",
    ),
    (
        "unseeded-reads-seeded",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + "seeds = [0, 1]\n"
        + '[runs.e]\nkind = "evaluate"\nmodel = "a"  # <-\n',
        "run 'e' has no seeds but reads 'a', which has seeds [0, 1]: give it seeds too",
    ),
    (
        "seeds-not-a-subset",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + "seeds = [0, 1]\n"
        + '[runs.e]\nkind = "evaluate"\nseeds = [0, 5, 7]\nmodel = "a@best"  # <-\n',
        "run 'e': seeds [5, 7] are not seeds of 'a' ([0, 1])",
    ),
    (
        "evaluate-not-a-bool",
        EVALUATE + "[runs.a]\n" + SFT + 'evaluate = "no"  # <-\n',
        "evaluate must be a bool, got 'no'",
    ),
    (
        "no-benchmarks",
        "[runs.a]  # <-\n" + SFT,
        "run 'a' is evaluated, but no benchmarks are named",
    ),
    (
        "psyrl-without-creates",
        EVALUATE + '[runs.p]  # <-\nkind = "psyrl"\nargs = ["summary"]\n',
        "run 'p': a psyrl run needs creates",
    ),
    (
        "set-without-dot",
        EVALUATE + "[runs.a]\n" + SFT + 'set = ["steps=3"]  # <-\n',
        "run 'a': 'steps=3' is not TABLE.KEY=VALUE",
    ),
    (
        "set-without-equals",
        EVALUATE + "[runs.a]\n" + SFT + 'set = ["run.steps"]  # <-\n',
        "run 'a': 'run.steps' is not TABLE.KEY=VALUE",
    ),
    (
        "set-not-strings",
        EVALUATE + "[runs.a]\n" + SFT + 'set = ["run.steps=3", 4]  # <-\n',
        "set must be a list of strings",
    ),
    (
        "nproc-zero",
        "[experiment]\nnproc = 0  # <-\n" + EVALUATE + "[runs.a]\n" + SFT,
        "nproc must be >= 1, got 0",
    ),
    (
        "nproc-string",
        '[experiment]\nnproc = "2"  # <-\n' + EVALUATE + "[runs.a]\n" + SFT,
        "nproc must be an integer, got '2'",
    ),
    (
        "nproc-bool",
        "[experiment]\nnproc = true  # <-\n" + EVALUATE + "[runs.a]\n" + SFT,
        "nproc must be an integer, got True",
    ),
    (
        "bootstrap-too-few",
        "[experiment]\nbootstrap = 99  # <-\n" + EVALUATE + "[runs.a]\n" + SFT,
        "bootstrap must be >= 100 resamples, got 99",
    ),
    (
        "torchrun-args-not-strings",
        "[experiment]\ntorchrun_args = [1]  # <-\n" + EVALUATE + "[runs.a]\n" + SFT,
        "torchrun_args must be a list of strings",
    ),
    (
        "table-row-not-a-run",
        EVALUATE + "[runs.a]\n" + SFT + '[[tables]]  # <-\nrows = ["a", "nosuch"]\n',
        "tables: no run named 'nosuch' (runs: a)",
    ),
    (
        "table-delta-not-a-run",
        EVALUATE + "[runs.a]\n" + SFT + '[[tables]]  # <-\nrows = ["a"]\ndeltas = ["nosuch"]\n',
        "tables: no run named 'nosuch'",
    ),
    (
        "table-compare-not-a-run",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + '[[tables]]  # <-\nrows = ["a"]\ncompare = [["a", "nosuch"]]\n',
        "tables: no run named 'nosuch'",
    ),
    (
        "table-row-not-evaluated",
        EVALUATE + "[runs.a]\n" + SFT + "evaluate = false\n" + '[[tables]]  # <-\nrows = ["a"]\n',
        "tables: run 'a' has no evaluation to put in a table",
    ),
    (
        "table-row-psyrl",
        EVALUATE + '[runs.p]\nkind = "psyrl"\ncreates = "x"\n' + '[[tables]]  # <-\nrows = ["p"]\n',
        "tables: run 'p' has no evaluation to put in a table",
    ),
    (
        "second-table-points-at-its-header",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + '[[tables]]\nrows = ["a"]\n\n[[tables]]  # <-\nrows = ["b"]\n',
        "no run named 'b'",
    ),
    (
        "table-without-rows",
        EVALUATE + "[runs.a]\n" + SFT + '[[tables]]  # <-\ntitle = "t"\n',
        "a table needs rows = [run names]",
    ),
    (
        "compare-not-pairs",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + "[runs.b]\n"
        + SFT
        + '[[tables]]\nrows = ["a", "b"]\ncompare = [["a", "b", "a"]]  # <-\n',
        "compare must be a list of [row, row] pairs",
    ),
    (
        "compare-flat",
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + "[runs.b]\n"
        + SFT
        + '[[tables]]\nrows = ["a", "b"]\ncompare = ["a", "b"]  # <-\n',
        "compare must be a list of [row, row] pairs",
    ),
    (
        "bad-columns",
        EVALUATE + "[runs.a]\n" + SFT + '[[tables]]\nrows = ["a"]\ncolumns = "items"  # <-\n',
        "columns must be one of 'tasks', 'benchmarks', 'index', got 'items'",
    ),
    (
        "bad-metric",
        EVALUATE + "[runs.a]\n" + SFT + '[[tables]]\nrows = ["a"]\nmetric = "bleu"  # <-\n',
        "metric must be one of 'f1', 'accuracy', 'valid', 'tokens', got 'bleu'",
    ),
    (
        "tables-not-an-array",
        EVALUATE + "[runs.a]\n" + SFT + '[tables]  # <-\nrows = ["a"]\n',
        "tables must be an array of tables: [[tables]]",
    ),
]


@pytest.mark.parametrize("text,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_names_file_and_line(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{marked_line(text)}: "), message
    assert fragment in message
    assert "\n" not in message  # one line: one problem
    # no chained traceback from tomli or a KeyError under it
    assert caught.value.__suppress_context__ or caught.value.__context__ is None


def test_invalid_toml_names_line_and_column(tmp_path):
    path = write(tmp_path, '[runs.a]\nkind = "sft"\nconfig = "x\n')
    with pytest.raises(ExperimentError, match=re.escape(f"{path}:3: invalid TOML: ")):
        load_experiment(path)


def test_a_cycle_names_the_cycle(tmp_path):
    # a reads b, b reads a: no order exists
    path = write(
        tmp_path,
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + 'model = "b"\n'
        + "[runs.b]\n"
        + SFT
        + 'model = "a@median"\n',
    )
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert message.endswith("the runs read each other in a cycle: a -> b -> a")


def test_a_longer_cycle_through_placeholders(tmp_path):
    # c's args read a's directory, a starts from b, b from c
    path = write(
        tmp_path,
        EVALUATE
        + "[runs.a]\n"
        + SFT
        + 'model = "b"\n'
        + "[runs.b]\n"
        + SFT
        + 'set = ["model.path={model:c}"]\n'
        + '[runs.c]\nkind = "psyrl"\ncreates = "x"\nargs = ["{run:a}"]\n',
    )
    with pytest.raises(ExperimentError, match="cycle: a -> b -> c -> a$"):
        load_experiment(path)


def test_no_runs_and_unreadable_file(tmp_path):
    path = write(tmp_path, EVALUATE)
    with pytest.raises(ExperimentError, match=re.escape(f"{path}: no runs: add at least one")):
        load_experiment(path)
    missing = tmp_path / "missing.toml"
    with pytest.raises(
        ExperimentError, match=re.escape(f"{missing}: cannot read the experiment file")
    ):
        load_experiment(missing)


def test_unknown_run_in_a_run_placeholder(tmp_path):
    text = EVALUATE + '[runs.p]\nkind = "psyrl"\ncreates = "x"\nargs = ["{run:nosuch}"]  # <-\n'
    path = write(tmp_path, text)
    with pytest.raises(ExperimentError, match=re.escape(f"{path}:{marked_line(text)}: ")):
        load_experiment(path)


# ---------------------------------------------------------------- what a good file gives

GOOD = """[experiment]
description = "d"
nproc = 2
bootstrap = 500
torchrun_args = ["--max-restarts", "0"]

[evaluate]
benchmarks = ["data/demo/test.jsonl"]
args = ["--no-progress"]

[runs.tg]                      # listed first, runs after what it reads
kind = "tgrpo"
config = "configs/tgrpo/tiny.toml"
model = "sft@median"
seeds = [1, 0]

[runs.instruct]
kind = "sft"
config = "configs/sft/tiny.toml"
evaluate = false

[runs.naive]
kind = "evaluate"
model = "instruct"
seeds = [0, 1]
benchmarks = ["other.jsonl"]

[runs.sft]
kind = "sft"
config = "configs/sft/tiny.toml"
model = "instruct"
seeds = [0, 1, 2]

[runs.report]
kind = "psyrl"
args = ["summary", "{run:tg}", "--out", "{dir}/summary.md"]
creates = "summary.md"
seeds = [0]

[runs.lone]
kind = "evaluate"
model = "models/some-model"

[[tables]]
rows = ["naive", "sft", "tg"]
"""


def test_good_file_fields(tmp_path):
    path = write(tmp_path, GOOD, "good.toml")
    experiment = load_experiment(path)
    assert (experiment.name, experiment.description) == ("good", "d")
    assert (experiment.nproc, experiment.resamples) == (2, 500)
    assert experiment.torchrun_args == ("--max-restarts", "0")
    assert experiment.eval_benchmarks == ("data/demo/test.jsonl",)
    assert experiment.eval_args == ("--no-progress",)
    assert experiment.output_dir == Path("runs/experiments")
    assert experiment.run_root == Path("runs/experiments/good")
    assert experiment.results_dir == tmp_path / "good"
    assert list(experiment.runs) == ["tg", "instruct", "naive", "sft", "report", "lone"]
    tg = experiment.runs["tg"]
    assert (tg.kind, tg.model, tg.seeds, tg.evaluate) == ("tgrpo", "sft@median", (1, 0), True)
    assert experiment.runs["instruct"].evaluate is False
    assert experiment.runs["naive"].benchmarks == ("other.jsonl",)
    table = experiment.tables[0]
    assert (table.title, table.rows, table.columns, table.metric) == (
        "table 1",
        ("naive", "sft", "tg"),
        "tasks",
        "f1",
    )
    # --output-dir replaces the file's output_dir
    assert load_experiment(path, str(tmp_path / "o")).run_root == tmp_path / "o" / "good"


def test_defaults(tmp_path):
    experiment = load_experiment(write(tmp_path, EVALUATE + "[runs.a]\n" + SFT))
    assert (experiment.nproc, experiment.resamples, experiment.torchrun_args) == (1, 2000, ())
    assert experiment.output_dir == Path("runs/experiments")
    assert experiment.tables == ()


def test_plan_order_and_seed_pairing(tmp_path):
    experiment = load_experiment(write(tmp_path, GOOD, "good.toml"), str(tmp_path / "out"))
    units = plan(experiment)
    # dependency order, ties in file order: tg (first in the file) needs sft, which needs
    # instruct; then naive, sft's other seed 2, report and lone in file order
    assert [u.key for u in units] == [
        ("instruct", None),
        ("sft", 1),
        ("tg", 1),
        ("sft", 0),
        ("tg", 0),
        ("naive", 0),
        ("naive", 1),
        ("sft", 2),
        ("report", 0),
        ("lone", None),
    ]
    by_key = {u.key: u for u in units}
    # a seeded reference pairs seeds: tg seed k reads sft seed k; an unseeded target is shared
    assert by_key[("tg", 1)].needs == [("sft", 1)]
    assert by_key[("tg", 0)].needs == [("sft", 0)]
    assert by_key[("sft", 2)].needs == [("instruct", None)]
    assert by_key[("naive", 0)].needs == [("instruct", None)]
    assert by_key[("naive", 1)].needs == [("instruct", None)]
    assert by_key[("report", 0)].needs == [("tg", 0)]  # through the {run:tg} placeholder
    assert by_key[("lone", None)].needs == []  # a path, not a run
    # directories, titles, evaluation directories
    root = tmp_path / "out" / "good"
    assert by_key[("instruct", None)].dir == root / "instruct"
    assert by_key[("tg", 1)].dir == root / "tg-seed1"
    assert by_key[("tg", 1)].title == "tg (seed 1)"
    assert by_key[("instruct", None)].title == "instruct"
    assert by_key[("tg", 1)].eval_dir == root / "tg-seed1" / "eval"
    assert by_key[("naive", 0)].eval_dir == root / "naive-seed0"  # an evaluation is its own
    assert unit_dir(experiment, experiment.runs["sft"], 2) == root / "sft-seed2"


def test_select_pulls_in_what_a_run_reads_transitively(tmp_path):
    units = plan(load_experiment(write(tmp_path, GOOD, "good.toml")))
    keys = lambda chosen: [u.key for u in chosen]
    # report (seed 0) reads tg seed 0, which reads sft seed 0, which reads instruct
    assert keys(select(units, ("report",))) == [
        ("instruct", None),
        ("sft", 0),
        ("tg", 0),
        ("report", 0),
    ]
    assert keys(select(units, ("tg",))) == [
        ("instruct", None),
        ("sft", 1),
        ("tg", 1),
        ("sft", 0),
        ("tg", 0),
    ]
    assert keys(select(units, ("instruct",))) == [("instruct", None)]
    assert keys(select(units, ("lone", "naive"))) == [
        ("instruct", None),
        ("naive", 0),
        ("naive", 1),
        ("lone", None),
    ]
    assert select(units, ()) == units


def test_with_seeds(tmp_path):
    experiment = load_experiment(write(tmp_path, GOOD, "good.toml"))
    assert with_seeds(experiment, None) is experiment
    one = with_seeds(experiment, (0,))
    assert {name: run.seeds for name, run in one.runs.items()} == {
        "tg": (0,),
        "instruct": (),
        "naive": (0,),
        "sft": (0,),
        "report": (0,),
        "lone": (),
    }
    assert [u.key for u in plan(one)] == [
        ("instruct", None),
        ("sft", 0),
        ("tg", 0),
        ("naive", 0),
        ("report", 0),
        ("lone", None),
    ]
    # the original is unchanged
    assert experiment.runs["sft"].seeds == (0, 1, 2)
    five = with_seeds(experiment, (5, 6))
    assert {u.key for u in plan(five) if u.run.name == "tg"} == {("tg", 5), ("tg", 6)}
    assert [u.needs for u in plan(five) if u.key == ("tg", 6)] == [[("sft", 6)]]


def test_shipped_experiment_files_load():
    files = sorted((REPO / "experiments").glob("*.toml"))
    assert files
    for path in files:
        assert plan(load_experiment(path))

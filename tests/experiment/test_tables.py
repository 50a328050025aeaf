"""psyrl.experiment.tables: cells, delta rows and paired comparisons from hand-written
predictions.jsonl files (2 seeds x 4 items), checked against means computed by hand; a missing run;
accuracy from `correct`; the markdown; results.md/.json through `--tables-only`."""

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.experiment import experiment_command
from psyrl.core.checkpoints import write_manifest
from psyrl.experiment.read import load_experiment
from psyrl.experiment.runner import collect
from psyrl.experiment.spec import plan
from psyrl.experiment.tables import ALL, build_table, table_markdown

REPO = Path(__file__).resolve().parents[2]
X, Y = "x.jsonl", "y.jsonl"  # two benchmarks

FILE = """[experiment]
bootstrap = 400

[evaluate]
benchmarks = ["x.jsonl"]

[runs.a]
kind = "evaluate"
label = "A"
model = "models/a"
seeds = [0, 1]

[runs.b]
kind = "evaluate"
label = "B"
model = "models/b"
seeds = [0, 1]

[runs.c]                       # one run, no seeds
kind = "evaluate"
model = "models/c"

[runs.d]                       # never finished
kind = "evaluate"
model = "models/d"
seeds = [0, 1]

[[tables]]
title = "F1 by task"
benchmark = "x.jsonl"
note = "a note"
rows = ["a", "b", "c", "d"]
deltas = ["b"]
compare = [["a", "b"], ["d", "b"]]

[[tables]]
title = "accuracy by task"
benchmark = "x.jsonl"
metric = "accuracy"
rows = ["a", "b", "c"]

[[tables]]
title = "F1 by benchmark"
columns = "benchmarks"
rows = ["a", "b"]
"""

# item id -> (task, f1, correct) on benchmark x; items 1, 2 (task T1) are multiple choice,
# items 3, 4 (task T2) free text (correct None)
PREDICTIONS = {
    ("a", 0): {
        1: ("T1", 1.0, True),
        2: ("T1", 0.0, False),
        3: ("T2", 0.5, None),
        4: ("T2", 0.5, None),
    },
    ("a", 1): {
        1: ("T1", 1.0, True),
        2: ("T1", 1.0, True),
        3: ("T2", 0.0, None),
        4: ("T2", 0.5, None),
    },
    ("b", 0): {
        1: ("T1", 0.5, False),
        2: ("T1", 0.0, False),
        3: ("T2", 0.5, None),
        4: ("T2", 0.0, None),
    },
    ("b", 1): {
        1: ("T1", 0.5, True),
        2: ("T1", 0.5, False),
        3: ("T2", 0.0, None),
        4: ("T2", 0.0, None),
    },
    ("c", None): {
        1: ("T1", 0.0, False),
        2: ("T1", 0.0, True),
        3: ("T2", 1.0, None),
        4: ("T2", 1.0, None),
    },
}
# and one item of benchmark y per seed of a (left out of the tables of benchmark x)
EXTRA_Y = {("a", 0): (7, "T3", 1.0), ("a", 1): (7, "T3", 1.0)}


def row(benchmark: str, item: int, task: str, f1: float, correct) -> dict:
    """A predictions.jsonl row as evaluate.py writes it (psyrl.eval.benchmarks.score_response)."""
    return {
        "id": str(item),
        "benchmark": benchmark,
        "task": task,
        "index": None,
        "response": "r",
        "extracted": "e",
        "f1": f1,
        "format": 1.0,
        "tokens": 5,
        "finish": "stop",
        "mean_logprob": -1.0,
        "option_f1": None,
        "choice": None,
        "correct": correct,
    }


def write_evaluation(directory: Path, rows: list[dict], finished: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "predictions.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
    )
    if finished:
        (directory / "results.json").write_text("{}")


@pytest.fixture
def experiment(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "tbl.toml"
    path.write_text(FILE)
    experiment = load_experiment(path, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}
    for key, items in PREDICTIONS.items():
        rows = [row(X, i, task, f1, correct) for i, (task, f1, correct) in items.items()]
        if key in EXTRA_Y:
            rows.append(row(Y, *EXTRA_Y[key], None))
        write_evaluation(units[key].eval_dir, rows)
    # d seed 0 is still running: predictions without results.json do not count
    write_evaluation(units[("d", 0)].eval_dir, [row(X, 1, "T1", 1.0, True)], finished=False)
    return experiment


def cells_of(table: dict, run: str) -> dict:
    """psyrl's estimates of a row, by column (the tables here give no paper values)."""
    cells = next(r for r in table["rows"] if r["run"] == run)["cells"]
    assert all(c["paper"] is None and c["difference"] is None for c in cells.values())
    return {column: cell["psyrl"] for column, cell in cells.items()}


def test_f1_cells_by_task(experiment):
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    assert table["columns"] == ["T1", "T2", ALL]  # first seen, then all items
    assert (table["title"], table["metric"], table["note"]) == ("F1 by task", "f1", "a note")
    mean = {
        run: {c: (cell and cell["mean"]) for c, cell in cells_of(table, run).items()}
        for run in "abcd"
    }
    # F1 x 100; a cell is the mean over seeds of the mean over the column's items
    # a: T1 seed 0 (100 + 0) / 2 = 50, seed 1 (100 + 100) / 2 = 100 -> 75
    #    T2 seed 0 (50 + 50) / 2 = 50, seed 1 (0 + 50) / 2 = 25     -> 37.5
    #    all seed 0 (100 + 0 + 50 + 50) / 4 = 50, seed 1 (100 + 100 + 0 + 50) / 4 = 62.5 -> 56.25
    #    (y's item 7 is another benchmark: left out, else seed 0 would be 300 / 5 = 60)
    assert mean["a"] == pytest.approx({"T1": 75.0, "T2": 37.5, ALL: 56.25}, abs=1e-12)
    # b: T1 seed 0 (50 + 0) / 2 = 25, seed 1 (50 + 50) / 2 = 50 -> 37.5
    #    T2 seed 0 (50 + 0) / 2 = 25, seed 1 0                  -> 12.5
    #    all seed 0 100 / 4 = 25, seed 1 100 / 4 = 25           -> 25
    assert mean["b"] == pytest.approx({"T1": 37.5, "T2": 12.5, ALL: 25.0}, abs=1e-12)
    # c: one run: T1 (0 + 0) / 2 = 0, T2 (100 + 100) / 2 = 100, all 200 / 4 = 50
    assert mean["c"] == pytest.approx({"T1": 0.0, "T2": 100.0, ALL: 50.0}, abs=1e-12)
    # d never finished an evaluation: no cells
    assert mean["d"] == {"T1": None, "T2": None, ALL: None}
    # equal scores give a zero-width interval: c's T1 and T2
    assert cells_of(table, "c")["T1"] == {
        "mean": 0.0,
        "low": 0.0,
        "high": 0.0,
        "seeds": 1,
        "items": 2,
    }
    assert cells_of(table, "c")["T2"] == {
        "mean": 100.0,
        "low": 100.0,
        "high": 100.0,
        "seeds": 1,
        "items": 2,
    }
    # counts, and intervals that hold the mean inside [0, 100]
    assert cells_of(table, "a")[ALL]["seeds"] == 2 and cells_of(table, "a")[ALL]["items"] == 4
    for run in "abc":
        for cell in cells_of(table, run).values():
            assert 0 <= cell["low"] <= cell["mean"] <= cell["high"] <= 100
    assert [(r["run"], r["label"], r["seeds"]) for r in table["rows"]] == [
        ("a", "A", [0, 1]),
        ("b", "B", [0, 1]),
        ("c", "c", []),
        ("d", "d", []),
    ]


def test_delta_rows_and_comparisons(experiment):
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    # Δ vs b, paired by seed and item: on the same items the mean difference is the difference
    # of the means: a - b: T1 75 - 37.5 = 37.5, T2 37.5 - 12.5 = 25, all 56.25 - 25 = 31.25.
    # c (one run) pairs with each of b's seeds: T1 0 - 37.5, T2 100 - 12.5 = 87.5, all 50 - 25.
    # b itself and d (not run) have no delta row.
    deltas = table["deltas"]["b"]
    assert [(r["run"], r["label"]) for r in deltas] == [("a", "A"), ("c", "c")]
    mean = [{c: cell["psyrl"]["mean"] for c, cell in r["cells"].items()} for r in deltas]
    assert mean[0] == pytest.approx({"T1": 37.5, "T2": 25.0, ALL: 31.25}, abs=1e-12)
    assert mean[1] == pytest.approx({"T1": -37.5, "T2": 87.5, ALL: 25.0}, abs=1e-12)
    assert deltas[0]["cells"][ALL]["psyrl"]["seeds"] == 2
    assert deltas[1]["cells"][ALL]["psyrl"]["seeds"] == 2
    # compare a - b: the same numbers; d - b: d has not run, no estimates
    a_b, d_b = table["compare"]
    assert (a_b["a"], a_b["b"], a_b["label"]) == ("a", "b", "A − B")
    assert {c: cell["psyrl"]["mean"] for c, cell in a_b["cells"].items()} == pytest.approx(mean[0])
    assert a_b["cells"] == deltas[0]["cells"]  # the same bootstrap: the same interval
    assert d_b["label"] == "d − B"
    assert all(cell["psyrl"] is None for cell in d_b["cells"].values())


def test_accuracy_uses_correct_and_skips_free_text(experiment):
    table = build_table(experiment, experiment.tables[1], plan(experiment))
    # items 3 and 4 have correct = None: no T2 column; all items = T1's items
    assert table["columns"] == ["T1", ALL]
    # a: seed 0 [True, False] -> 50 %, seed 1 [True, True] -> 100 % -> 75
    # b: seed 0 [False, False] -> 0, seed 1 [True, False] -> 50     -> 25
    # c: [False, True] -> 50
    for run, expected in (("a", 75.0), ("b", 25.0), ("c", 50.0)):
        cells = cells_of(table, run)
        assert cells["T1"]["mean"] == pytest.approx(expected, abs=1e-12)
        assert cells[ALL] == cells["T1"]
        assert cells[ALL]["items"] == 2


def test_benchmark_columns(experiment):
    table = build_table(experiment, experiment.tables[2], plan(experiment))
    assert table["columns"] == [X, Y, ALL]
    cells = cells_of(table, "a")
    # a: x as before 56.25; y: item 7 = 100 on both seeds -> 100 with [100, 100];
    # all: seed 0 (200 + 100) / 5 = 60, seed 1 (250 + 100) / 5 = 70 -> 65
    assert cells[X]["mean"] == pytest.approx(56.25, abs=1e-12)
    assert (cells[Y]["mean"], cells[Y]["low"], cells[Y]["high"]) == (100.0, 100.0, 100.0)
    assert cells[ALL]["mean"] == pytest.approx(65.0, abs=1e-12)
    # b has no y items: no cell
    assert cells_of(table, "b")[Y] is None


def test_table_markdown(experiment):
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    text = table_markdown(table)
    lines = text.splitlines()
    assert lines[:5] == [
        "## F1 by task",
        "",
        "a note",
        "",
        "F1 ×100: mean over seeds [95 % bootstrap interval over seeds and items]. The file gives "
        "no paper values for this table.",
    ]
    assert "| run | T1 | T2 | all items |" in lines
    assert "| --- | ---: | ---: | ---: |" in lines
    cell = lambda c: f"{c['mean']:.1f} [{c['low']:.1f}, {c['high']:.1f}]"
    a = cells_of(table, "a")
    assert (
        f"| A (2 seeds) | 75.0 [{a['T1']['low']:.1f}, {a['T1']['high']:.1f}] | "
        f"{cell(a['T2'])} | 56.2 [{a[ALL]['low']:.1f}, {a[ALL]['high']:.1f}] |" in lines
    )
    c_all = cell(cells_of(table, "c")[ALL])
    assert f"| c (1 run) | 0.0 [0.0, 0.0] | 100.0 [100.0, 100.0] | {c_all} |" in lines
    assert "| d (not run yet) | – | – | – |" in lines
    assert "Δ vs B (paired by seed and item):" in lines
    delta_a = table["deltas"]["b"][0]["cells"]
    assert any(
        line.startswith(f"| A | +37.5 [{delta_a['T1']['psyrl']['low']:+.1f}, ") for line in lines
    )
    assert any(line.startswith("| c | -37.5 [") for line in lines)
    assert "| A − B | T1 | T2 | all items |" in lines
    assert "| d − B | – | – | – |" in lines


def test_markdown_of_a_single_seed_and_of_accuracy(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "one.toml"
    path.write_text(
        '[evaluate]\nbenchmarks = ["x.jsonl"]\n[runs.e]\nkind = "evaluate"\n'
        'model = "m"\nseeds = [0, 1]\n[[tables]]\nrows = ["e"]\n'
        'metric = "accuracy"\n'
    )
    experiment = load_experiment(path, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}
    # only seed 1 finished: [True, True, False] -> 66.7 %
    write_evaluation(
        units[("e", 1)].eval_dir,
        [row(X, 1, "T", 1.0, True), row(X, 2, "T", 1.0, True), row(X, 3, "T", 0.0, False)],
    )
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    text = table_markdown(table)
    assert text.startswith("## table 1\n\naccuracy %: mean over seeds")
    assert "| e (seed 1) | 66.7 [" in text


def test_tables_only_writes_results(experiment):
    result = CliRunner().invoke(
        experiment_command,
        [str(experiment.path), "--tables-only", "--output-dir", str(experiment.output_dir)],
    )
    assert result.exit_code == 0, result.output
    out = experiment.results_dir
    assert out == experiment.path.parent / "tbl"
    saved = json.loads((out / "results.json").read_text())
    assert [t["title"] for t in saved["tables"]] == [
        "F1 by task",
        "accuracy by task",
        "F1 by benchmark",
    ]
    status = {(r["run"], r["seed"]): r["status"] for r in saved["runs"]}
    assert status == {
        ("a", 0): "done",
        ("a", 1): "done",
        ("b", 0): "done",
        ("b", 1): "done",
        ("c", None): "done",
        ("d", 0): "not finished",
        ("d", 1): "not finished",
    }
    markdown = (out / "results.md").read_text()
    assert markdown.startswith("# tbl\n")
    assert "5 of 7 runs done" in markdown
    assert "| d (not run yet) | – | – | – |" in markdown
    assert "## F1 by task" in result.output
    # collect() gives the same tables as the file
    tables, runs = collect(experiment)
    assert tables == saved["tables"] and len(runs) == 7


def test_delta_of_a_partly_finished_run_pairs_by_seed(experiment):
    # d: only seed 1 finished, items 1..4 all F1 1.0 (100); its delta against b (seeds 0 and 1)
    # must pair seed 1 with b's seed 1 only: all items 100 - 25 = 75 on 1 seed. paired() pairs
    # d's seed 1 with b's seeds 0 and 1, here the same 75 (b's seeds tie on all items) but on
    # 2 seeds; in T1: 100 - 50 = 50 paired by seed, vs 100 - (25 + 50) / 2 = 62.5 as computed.
    units = {u.key: u for u in plan(experiment)}
    write_evaluation(
        units[("d", 1)].eval_dir,
        [row(X, i, "T1" if i < 3 else "T2", 1.0, True) for i in (1, 2, 3, 4)],
    )
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    d = next(r for r in table["deltas"]["b"] if r["run"] == "d")["cells"]
    assert d[ALL]["psyrl"]["seeds"] == 1
    assert d["T1"]["psyrl"]["mean"] == pytest.approx(50.0)


def test_tasks_of_several_benchmarks_are_named_with_their_benchmark(experiment):
    # a "tasks" table without `benchmark` over predictions of x and y: T1 and T2 are x's, T3 is
    # y's; with two benchmarks present, a column names its benchmark too (a task of the same name
    # in both would otherwise merge); a's seeds: T3 (y/7) scores 100 on both
    spec = dataclasses.replace(experiment.tables[0], benchmark="", deltas=(), compare=())
    table = build_table(experiment, spec, plan(experiment))
    assert table["columns"] == [f"{X} / T1", f"{X} / T2", f"{Y} / T3", ALL]
    assert cells_of(table, "a")[f"{Y} / T3"]["mean"] == 100.0
    assert cells_of(table, "b")[f"{Y} / T3"] is None


# two evaluations of fixed models, Basic R1 and BR: the rows of the Figure 6 tables below
TWO_RUNS = """[runs.base]
kind = "evaluate"
label = "Basic R1"
model = "models/base"

[runs.bilateral]
kind = "evaluate"
label = "BR"
model = "models/br"
"""
VALID_FILE = (
    """[experiment]
bootstrap = 400

[evaluate]
benchmarks = ["tombench"]

"""
    + TWO_RUNS
    + """
[[tables]]
title = "valid samples"
columns = "index"
metric = "valid"
rows = ["base", "bilateral"]
compare = [["bilateral", "base"]]

[tables.paper]
table = "§4.6"
columns = ["index 1", "index 2", "index 3"]

[tables.paper.differences]
bilateral = { minus = "base", row = "1, 0 and 1 more", values = [1, 0, 1] }
"""
)
UOT = "Unexpected Outcome Test"


def uot(item: int, index, f1: float, task: str = UOT) -> dict:
    return {**row("tombench", item, task, f1, None), "index": index}


def test_valid_samples_by_question_index(tmp_path, monkeypatch):
    """Figure 6's counts: responses with non-zero F1 on the Unexpected Outcome Test by question
    index, as counts with their intervals; other tasks and items without an index left out."""
    monkeypatch.chdir(REPO)
    path = tmp_path / "valid.toml"
    path.write_text(VALID_FILE)
    experiment = load_experiment(path, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}
    # base: index 1 F1 (0.5, 0) -> 1 valid of 2; index 2 (0, 0) -> 0; index 3 (0.2) -> 1
    # BR: index 1 (0.5, 0.3) -> 2; index 2 (0, 0.1) -> 1; index 3 (0) -> 0
    extra = [uot(9, 1, 1.0, "Ambiguous Story Task"), uot(10, None, 1.0)]
    write_evaluation(
        units[("base", None)].eval_dir,
        [uot(1, 1, 0.5), uot(2, 1, 0.0), uot(3, 2, 0.0), uot(4, 2, 0.0), uot(5, 3, 0.2), *extra],
    )
    write_evaluation(
        units[("bilateral", None)].eval_dir,
        [uot(1, 1, 0.5), uot(2, 1, 0.3), uot(3, 2, 0.0), uot(4, 2, 0.1), uot(5, 3, 0.0), *extra],
    )
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    assert table["columns"] == ["index 1", "index 2", "index 3", ALL]
    base = next(r for r in table["rows"] if r["run"] == "base")["cells"]
    assert {c: cell["psyrl"]["mean"] for c, cell in base.items()} == pytest.approx(
        {"index 1": 1.0, "index 2": 0.0, "index 3": 1.0, ALL: 2.0}
    )
    # a count's interval: index 1's two items are both valid or both not in a quarter of the
    # resamples each: [0, 2]
    assert (base["index 1"]["psyrl"]["low"], base["index 1"]["psyrl"]["high"]) == (0.0, 2.0)
    # BR - Basic R1: +1 [0, 2] (paper +1: inside), +1 [0, 2] (paper 0: inside), -1 [-1, -1]
    # (paper +1: outside)
    cells = table["compare"][0]["cells"]
    assert [cells[c]["psyrl"]["mean"] for c in table["columns"]] == pytest.approx([1, 1, -1, 1])
    assert [cells[c]["inside"] for c in table["columns"]] == [True, True, False, None]
    text = table_markdown(table)
    assert text.splitlines()[2].startswith("valid samples (non-zero F1). A cell: psyrl's mean")
    assert "(the paper's value (§4.6) · psyrl" not in text and "value (§4.6) · psyrl" in text
    assert "| BR − Basic R1 | +1.0 [+0.0, +2.0] · paper +1 · +0.0 (inside) |" in text


def test_a_rule_row_states_the_checkpoint_it_chose(tmp_path, monkeypatch):
    """`sft@median` rows say which checkpoint appendix B's rule chose for each seed."""
    from test_runner import checkpoint

    monkeypatch.chdir(REPO)
    path = tmp_path / "rule.toml"
    path.write_text(
        '[evaluate]\nbenchmarks = ["x.jsonl"]\n'
        '[runs.sft]\nkind = "sft"\nconfig = "configs/sft/tiny.toml"\nseeds = [0, 1]\n'
        "evaluate = false\n"
        '[runs.sft-median]\nkind = "evaluate"\nlabel = "SFT"\nmodel = "sft@median"\n'
        "seeds = [0, 1]\n"
        '[runs.base]\nkind = "tgrpo"\nconfig = "configs/tgrpo/tiny.toml"\nmodel = "sft@median"\n'
        "seeds = [0, 1]\n"
        '[[tables]]\nrows = ["sft-median", "base"]\n'
    )
    experiment = load_experiment(path, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}
    # seed 0: F1 0.1, 0.3, 0.2 at steps 1-3: the median 0.2 is step 3; seed 1: 0.5, 0.4: the
    # lower median 0.4, step 2
    for step, f1 in ((1, 0.1), (2, 0.3), (3, 0.2)):
        checkpoint(units[("sft", 0)].dir, step, f1)
    for step, f1 in ((1, 0.5), (2, 0.4)):
        checkpoint(units[("sft", 1)].dir, step, f1)
    for seed in (0, 1):
        write_evaluation(units[("sft-median", seed)].eval_dir, [row(X, 1, "T", 0.5, None)])
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    sft, base = table["rows"]
    assert sft["evaluates"] == "the median-F1 checkpoint (appendix B) of SFT run sft"
    assert sft["checkpoints"] == [
        {"seed": 0, "step": 3, "valid_f1": 0.2},
        {"seed": 1, "step": 2, "valid_f1": 0.4},
    ]
    assert (base["evaluates"], base["checkpoints"]) == ("this run's final export (hf/)", [])
    assert (
        "- SFT: the median-F1 checkpoint (appendix B) of SFT run sft (seed 0: step 3, valid F1 "
        "0.2000; seed 1: step 2, valid F1 0.4000)"
    ) in table_markdown(table).splitlines()
    # a validation.json edited after its checksum: seed 1 chooses nothing, and the table says so
    step = units[("sft", 1)].dir / "checkpoints" / "step-1"
    (step / "manifest.json").unlink()
    write_manifest(step)  # with checksums, as a trainer writes it
    (step / "validation.json").write_text((step / "validation.json").read_text().replace("5", "9"))
    sft = build_table(experiment, experiment.tables[0], plan(experiment))["rows"][0]
    assert sft["checkpoints"][0] == {"seed": 0, "step": 3, "valid_f1": 0.2}
    assert (
        sft["checkpoints"][1]["seed"] == 1 and "validation.json" in sft["checkpoints"][1]["damaged"]
    )
    assert "seed 1: none, " in table_markdown(
        build_table(experiment, experiment.tables[0], plan(experiment))
    )


TOKENS_FILE = (
    """[experiment]
bootstrap = 400

[evaluate]
benchmarks = ["k1.jsonl", "k3.jsonl"]

"""
    + TWO_RUNS
    + """
[[tables]]
title = "response length by level"
columns = "benchmarks"
metric = "tokens"
rows = ["base", "bilateral"]
compare = [["bilateral", "base"]]
"""
)


def test_response_length_by_level_pairs_every_response(tmp_path, monkeypatch):
    """The testbed's Figure 6 table: mean response tokens of every response (right or wrong, so
    two rows pair on the same items) per benchmark file, and BR - Basic R1 per item."""
    monkeypatch.chdir(REPO)
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS_FILE)
    experiment = load_experiment(path, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}

    def rows(lengths: dict[str, list[int]]) -> list[dict]:
        return [
            {**row(bench, i, "-", 1.0 if i % 2 else 0.0, None), "tokens": n}
            for bench, ns in lengths.items()
            for i, n in enumerate(ns)
        ]

    # base: k1 (20, 30) -> 25, k3 (40, 50) -> 45, all 35; BR: k1 (10, 10) -> 10, k3 (50, 70) -> 60
    write_evaluation(units[("base", None)].eval_dir, rows({"k1": [20, 30], "k3": [40, 50]}))
    write_evaluation(units[("bilateral", None)].eval_dir, rows({"k1": [10, 10], "k3": [50, 70]}))
    table = build_table(experiment, experiment.tables[0], plan(experiment))
    assert table["columns"] == ["k1", "k3", ALL]
    base = next(r for r in table["rows"] if r["run"] == "base")["cells"]
    assert {c: cell["psyrl"]["mean"] for c, cell in base.items()} == pytest.approx(
        {"k1": 25.0, "k3": 45.0, ALL: 35.0}
    )
    # the interval of two items: both short, both long, or one of each -> [20, 30]
    assert (base["k1"]["psyrl"]["low"], base["k1"]["psyrl"]["high"]) == (20.0, 30.0)
    # BR - Basic R1 per item: k1 (-10, -20) -> -15; k3 (+10, +20) -> +15; all 0
    cells = table["compare"][0]["cells"]
    assert [cells[c]["psyrl"]["mean"] for c in table["columns"]] == pytest.approx([-15, 15, 0])
    text = table_markdown(table)
    assert text.splitlines()[2].startswith("response length (tokens, every response): mean over")
    assert "| BR − Basic R1 | -15.0 [-20.0, -10.0] | +15.0 [+10.0, +20.0] |" in text

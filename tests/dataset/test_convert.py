"""`psyrl data convert`: every source kind into both targets, loaded back with psyrl's own loaders
and compared field by field; chat JSONL; each error path with the file and row it names; psyrl's
demo data converted back to itself byte for byte. Parquet and datasets fixtures are written by the
real pyarrow and datasets libraries."""

import csv
import json
import sys

import click
import pytest
from click.testing import CliRunner

from psyrl.cli.data import convert_command
from psyrl.core.records import (
    BenchmarkRecord,
    DataError,
    StimuliRecord,
    load_benchmark,
    load_stimuliqa,
)
from psyrl.dataset.convert import ConvertError, convert, parse_map, read_source

DATA_EXTRA = "parquet and datasets sources need the data extra: pip install -e '.[data]'"
DATASETS = "datasets' own save_to_disk writes this fixture: pip install -e '.[dev]' (or datasets)"
ROWS = [
    {
        "uid": "s1",
        "story": "I missed the bus.",
        "prompt": "How did I feel?",
        "gold": "annoyed",
        "choices": ["calm", "annoyed"],
        "label": 1,
    },
    {
        "uid": "s2",
        "story": "My friend called.",
        "prompt": "What did I feel?",
        "gold": "glad",
        "choices": ["glad", "sad", "bored"],
        "label": 0,
    },
]
STIMULIQA_MAP = "id=uid,stimuli=story,question=prompt,answer=gold"
BENCHMARK_MAP = "id=uid,stimuli=story,question=prompt,options=choices,answer_index=label"
# the first data row's number: CSV has a header line; parquet and datasets count rows
FIRST_ROW = {"jsonl": 1, "csv": 2, "parquet": 1, "datasets": 1}


def write_jsonl_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv_rows(path, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "choices": json.dumps(r["choices"])} for r in rows)
    return path


def write_source(kind, tmp_path, rows=ROWS):
    """The rows as a source of `kind`, written by the library that defines the format."""
    if kind == "jsonl":
        return write_jsonl_rows(tmp_path / "src.jsonl", rows)
    if kind == "csv":
        return write_csv_rows(tmp_path / "src.csv", rows)
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow", reason=DATA_EXTRA)
        pq = pytest.importorskip("pyarrow.parquet", reason=DATA_EXTRA)
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src.parquet")
        return tmp_path / "src.parquet"
    datasets = pytest.importorskip("datasets", reason=DATASETS)
    # two shards: the rows must come back in the order of state.json's file list
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "src", num_shards=2)
    return tmp_path / "src"


def invoke(*args):
    return CliRunner().invoke(convert_command, [str(a) for a in args])


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "datasets"])
def test_each_source_to_stimuliqa(kind, tmp_path):
    source = write_source(kind, tmp_path)
    out = tmp_path / "out" / "train.jsonl"
    result = invoke(source, "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 2 stimuliqa records from 2 rows of {source} ({kind})" in result.output
    assert load_stimuliqa(out) == [
        StimuliRecord("s1", "I missed the bus.", "How did I feel?", "annoyed"),
        StimuliRecord("s2", "My friend called.", "What did I feel?", "glad"),
    ]


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_reason_column_is_carried_through(kind, tmp_path):
    # e.g. a generator's Reason: lines kept beside its pairs; SFT thinks with it under
    # data.think_from = "reason"
    why = ["The bus made me late.", None if kind == "jsonl" else "Calls mean care."]
    source = write_source(kind, tmp_path, [{**r, "why": w} for r, w in zip(ROWS, why)])
    out = tmp_path / "train.jsonl"
    result = invoke(
        source, "--to", "stimuliqa", "--map", f"{STIMULIQA_MAP},reason=why", "--out", out
    )
    assert result.exit_code == 0, result.output
    assert [r.reason for r in load_stimuliqa(out)] == why
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["reason"] == "The bus made me late."
    assert ("reason" in lines[1]) == (kind == "csv")  # a null cell: no reason, no key


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "datasets"])
def test_each_source_to_benchmark(kind, tmp_path):
    source = write_source(kind, tmp_path)
    out = tmp_path / "toy.jsonl"  # no --benchmark: the name is the file's
    result = invoke(source, "--to", "benchmark", "--map", BENCHMARK_MAP, "--out", out)
    assert result.exit_code == 0, result.output
    first, name = FIRST_ROW[kind], source.name
    assert load_benchmark(out) == [
        BenchmarkRecord(
            "s1",
            "toy",
            "",
            "I missed the bus.",
            "How did I feel?",
            ("calm", "annoyed"),
            1,
            "annoyed",
            {"source_file": name, "source_row": first},
        ),
        BenchmarkRecord(
            "s2",
            "toy",
            "",
            "My friend called.",
            "What did I feel?",
            ("glad", "sad", "bored"),
            0,
            "glad",
            {"source_file": name, "source_row": first + 1},
        ),
    ]


def test_datasets_rows_equal_load_from_disk(tmp_path):
    # the pyarrow-only reader against the reference: datasets' own load_from_disk
    datasets = pytest.importorskip("datasets", reason=DATASETS)
    source = write_source("datasets", tmp_path)
    assert read_source(source).rows == list(enumerate(datasets.load_from_disk(source).to_list(), 1))


def test_struct_column_and_letter_answers(tmp_path):
    # the layout of HF multiple-choice sets: choices {text, label}, answerKey a letter
    datasets = pytest.importorskip("datasets", reason=DATASETS)
    rows = [
        {
            "q": "Which?",
            "ctx": "A story.",
            "topic": "t1",
            "answerKey": "B",
            "choices": {"text": ["no", "yes"], "label": ["A", "B"]},
        }
    ]
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "mc")
    out = tmp_path / "mc.jsonl"
    convert(
        tmp_path / "mc",
        "benchmark",
        parse_map(
            ["question=q,stimuli=ctx,task=topic,options=choices.text,answer_index=answerKey"],
            "benchmark",
        ),
        out,
        benchmark="hf",
    )
    assert load_benchmark(out) == [
        BenchmarkRecord(
            "hf/1",
            "hf",
            "t1",
            "A story.",
            "Which?",
            ("no", "yes"),
            1,
            "yes",
            {"source_file": "mc", "source_row": 1},
        )
    ]


def test_csv_options_from_several_columns(tmp_path):
    # CosmosQA's layout: answer0..answer3; a 2-option row leaves the last cells empty
    source = tmp_path / "cosmos.csv"
    source.write_text(
        "context,question,answer0,answer1,answer2,label\n"
        "Ctx one.,Q one?,a,b,c,2\n"
        "Ctx two.,Q two?,yes,no,,0\n",
        encoding="utf-8",
    )
    out = tmp_path / "cosmos.jsonl"
    result = invoke(
        source,
        "--to",
        "benchmark",
        "--out",
        out,
        "--map",
        "stimuli=context,question=question,answer_index=label",
        "--map",
        "options=answer0+answer1+answer2",
    )
    assert result.exit_code == 0, result.output
    records = load_benchmark(out)
    assert [(r.id, r.options, r.answer_index, r.answer) for r in records] == [
        ("cosmos/2", ("a", "b", "c"), 2, "c"),
        ("cosmos/3", ("yes", "no"), 0, "yes"),
    ]


def test_multiple_choice_to_stimuliqa_takes_the_chosen_option(tmp_path):
    source = write_source("jsonl", tmp_path)
    out = tmp_path / "train.jsonl"
    convert(
        source,
        "stimuliqa",
        parse_map(
            ["stimuli=story,question=prompt,options=choices,answer_index=label"], "stimuliqa"
        ),
        out,
    )
    assert [(r.id, r.answer) for r in load_stimuliqa(out)] == [
        ("src/1", "annoyed"),
        ("src/2", "glad"),
    ]


CHATS = [
    {
        "id": "c1",
        "messages": [
            {"role": "user", "content": "I lost my keys.\nThen the rain began.\n\nHow did I feel?"},
            {"role": "assistant", "content": "frustrated"},
        ],
    },
    {
        "id": "c2",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "My exam went well.\n \nWhat did I feel? "},
            {"role": "assistant", "content": " relieved"},
        ],
    },
]


def test_chat_jsonl(tmp_path):
    source = write_jsonl_rows(tmp_path / "chats.jsonl", CHATS)
    out = tmp_path / "train.jsonl"
    result = invoke(
        source,
        "--to",
        "stimuliqa",
        "--out",
        out,
        "--map",
        "id=id,stimuli=user_context,question=user_question,answer=assistant",
    )
    assert result.exit_code == 0, result.output
    assert "(chat)" in result.output
    assert load_stimuliqa(out) == [
        StimuliRecord(
            "c1", "I lost my keys.\nThen the rain began.", "How did I feel?", "frustrated"
        ),
        StimuliRecord("c2", "My exam went well.", "What did I feel?", "relieved"),
    ]
    # the columns: the turns, the split user turn, the line's other keys
    assert read_source(source).columns == (
        "system",
        "user",
        "assistant",
        "user_context",
        "user_question",
        "id",
    )


def test_chat_errors_name_the_line(tmp_path):
    source = write_jsonl_rows(
        tmp_path / "chats.jsonl",
        [
            CHATS[0],
            {"id": "c2", "messages": CHATS[0]["messages"] * 2},
            {
                "id": "c3",
                "messages": [
                    {"role": "user", "content": "No blank line here?"},
                    {"role": "assistant", "content": "fine"},
                ],
            },
        ],
    )
    out = tmp_path / "train.jsonl"
    result = invoke(
        source,
        "--to",
        "stimuliqa",
        "--out",
        out,
        "--map",
        "id=id,stimuli=user_context,question=user_question,answer=assistant",
    )
    assert result.exit_code == 1 and not out.exists()
    assert (
        f"{source}:2: column 'messages': expected one exchange (an optional system turn, one "
        "user turn, one assistant turn), got roles user, assistant, user, assistant"
        in result.output
    )
    # the malformed line stops the read; fixed, the next problem is line 3's empty story
    write_jsonl_rows(source, [CHATS[0], CHATS[1], json.loads(source.read_text().splitlines()[2])])
    result = invoke(
        source,
        "--to",
        "stimuliqa",
        "--out",
        out,
        "--map",
        "id=id,stimuli=user_context,question=user_question,answer=assistant",
    )
    assert result.exit_code == 1 and not out.exists()
    assert f"{source}:3: column 'user_context' (stimuli): must not be empty" in result.output


@pytest.mark.parametrize("name", ["train.jsonl", "test.jsonl"])
def test_demo_stimuliqa_round_trip(name, tmp_path):
    out = tmp_path / name
    result = invoke(
        f"data/demo/{name}",
        "--to",
        "stimuliqa",
        "--out",
        out,
        "--map",
        "id=id,stimuli=stimuli,question=question,answer=answer,variable=variable,"
        "dimension=dimension,subdimension=subdimension,reasoning=reasoning",
    )
    assert result.exit_code == 0, result.output
    assert load_stimuliqa(out) == load_stimuliqa(f"data/demo/{name}")
    assert out.read_bytes() == open(f"data/demo/{name}", "rb").read()


def test_demo_benchmark_round_trip(tmp_path):
    out = tmp_path / "mc.jsonl"
    result = invoke(
        "data/demo/mc.jsonl",
        "--to",
        "benchmark",
        "--out",
        out,
        "--benchmark",
        "demo",
        "--map",
        "id=id,stimuli=context,question=question,options=options,"
        "answer_index=answer_index,answer=answer,task=task,meta=meta",
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == open("data/demo/mc.jsonl", "rb").read()


def test_help_in_a_data_group_explains_the_map():
    # psyrl/cli/__init__.py registers the command under its `data` group; a stand-in group here
    group = click.Group("data", commands=[convert_command])
    result = CliRunner().invoke(group, ["convert", "--help"])
    assert result.exit_code == 0
    assert "Usage: data convert [OPTIONS] SOURCE" in result.output
    assert "--map options=answer0+answer1+answer2+answer3" in result.output
    assert "--map stimuli=user_context,question=user_question,answer=assistant" in result.output


# ---------------------------------------------------------------- errors: one message each
def assert_nothing_written(tmp_path, out):
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_unknown_column_lists_the_source_columns(tmp_path):
    source, out = write_source("csv", tmp_path), tmp_path / "out.jsonl"
    result = invoke(
        source,
        "--to",
        "stimuliqa",
        "--out",
        out,
        "--map",
        "stimuli=storyy,question=prompt,answer=gold",
    )
    assert result.exit_code == 1
    assert (
        f"--map stimuli=storyy: {source} has no column 'storyy'; its columns: uid, story, "
        "prompt, gold, choices, label"
    ) in result.output
    assert_nothing_written(tmp_path, out)


@pytest.mark.parametrize(
    ("target", "mapping", "message"),
    [
        (
            "stimuliqa",
            "question=prompt",
            "--map lacks stimuli, answer (--to stimuliqa needs "
            "question, stimuli, and answer or options + answer_index)",
        ),
        (
            "benchmark",
            "question=prompt,answer=gold",
            "--map lacks options (--to benchmark needs "
            "question, options, and answer or answer_index); --to benchmark writes multiple-choice "
            "items: for an open-answer evaluation set convert --to stimuliqa",
        ),
        ("stimuliqa", "question", "--map: 'question' is not KEY=COLUMN (e.g. question=prompt)"),
        ("stimuliqa", "question=", "--map: 'question=' is not KEY=COLUMN"),
        (
            "stimuliqa",
            "colour=c",
            "--map: unknown key 'colour' for --to stimuliqa (keys: id, "
            "stimuli, question, answer, options, answer_index, variable, dimension, subdimension, "
            "reasoning, reason)",
        ),
        ("benchmark", "reasoning=r", "--map: unknown key 'reasoning' for --to benchmark"),
        ("stimuliqa", "question=a,question=b", "--map: question is given twice ('a', 'b')"),
        ("stimuliqa", "question=a+b", "--map: only options joins columns with +, not question"),
        (
            "stimuliqa",
            "stimuli=s,question=q,answer=a,answer_index=i",
            "--to stimuliqa takes the answer from answer=COLUMN or from options=COLUMN,"
            "answer_index=COLUMN, not both",
        ),
    ],
)
def test_bad_map(target, mapping, message, tmp_path):
    source, out = write_source("jsonl", tmp_path), tmp_path / "out.jsonl"
    result = invoke(source, "--to", target, "--map", mapping, "--out", out)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())  # click wraps long usage messages
    assert_nothing_written(tmp_path, out)


def test_existing_out_needs_overwrite(tmp_path):
    source, out = write_source("jsonl", tmp_path), tmp_path / "out.jsonl"
    out.write_text("keep\n")
    result = invoke(source, "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out)
    assert result.exit_code == 1
    assert f"--out {out}: exists (pass --overwrite to replace it)" in result.output
    assert out.read_text() == "keep\n"
    result = invoke(
        source, "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out, "--overwrite"
    )
    assert result.exit_code == 0 and len(load_stimuliqa(out)) == 2


def test_missing_source(tmp_path):
    out = tmp_path / "out.jsonl"
    result = invoke(
        tmp_path / "nope.csv", "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out
    )
    assert result.exit_code == 1
    assert f"{tmp_path / 'nope.csv'}: no such file or directory" in result.output
    assert_nothing_written(tmp_path, out)


def test_unknown_suffix_asks_for_from(tmp_path):
    source = tmp_path / "data.txt"
    source.write_text("x\n")
    with pytest.raises(
        ConvertError,
        match=r"data.txt: cannot tell the format from the suffix "
        r"'.txt'; pass --from \(datasets, parquet, csv, jsonl, chat\)",
    ):
        read_source(source)


def test_csv_row_errors_name_line_and_column(tmp_path):
    source = tmp_path / "bad.csv"
    # row 1 spans lines 2-3 (a quoted newline): the next row starts on line 4
    source.write_text(
        "uid,story,prompt,gold,choices,label\n"
        's1,"A story\nover two lines.",Q?,calm,"[""calm"", ""sad""]",0\n'
        's2,Story.,,sad,"[""calm"", ""sad""]",x7\n'
        "s3,Story.,Q?,sad,not json,1\n"
        's1,Story.,Q?,sad,"[""calm"", ""sad""]",1\n',
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"
    result = invoke(source, "--to", "benchmark", "--map", BENCHMARK_MAP, "--out", out)
    assert result.exit_code == 1
    assert f"{source}: 3 bad row(s)" in result.output
    assert (
        f"{source}:4: column 'label' (answer_index): expected a 0-based option number or an "
        'option letter (A, B, ...), got "x7"'
    ) in result.output
    assert (
        f"{source}:5: column 'choices' (options): expected a list of strings (in a text "
        'cell: a JSON list such as ["yes", "no"]), got "not json"'
    ) in result.output
    assert (
        f"{source}:6: column 'uid' (id): duplicate id 's1' (first at {source}:2)" in result.output
    )
    assert_nothing_written(tmp_path, out)
    # the empty question of line 4, once its index is fixed, as the validator words it
    source.write_text(
        source.read_text().replace(",x7\n", ",1\n").replace("not json", '"[""a"", ""b""]"')
    )
    result = invoke(source, "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out)
    assert f"{source}:4: column 'prompt' (question): must not be empty" in result.output


def test_jsonl_type_errors(tmp_path):
    source = write_jsonl_rows(
        tmp_path / "src.jsonl",
        [
            ROWS[0],
            {**ROWS[1], "prompt": ["a"]},
            {**ROWS[1], "uid": "s3", "label": 5},
            {**ROWS[1], "uid": "s4", "gold": "sad", "label": 0},
            {**ROWS[0], "uid": "s5"},
        ],
    )
    out = tmp_path / "out.jsonl"
    result = invoke(
        source, "--to", "benchmark", "--out", out, "--map", BENCHMARK_MAP + ",answer=gold"
    )
    assert result.exit_code == 1
    assert f"{source}: 3 bad row(s)" in result.output
    assert (
        f"{source}:2: column 'prompt' (question): expected a string, got [\"a\"]" in result.output
    )
    # the validator's words, said of the columns: both answer columns must agree
    assert (
        f"{source}:3: column 'label' (answer_index): 5 is out of range for 3 options"
        in result.output
    )
    assert f"{source}:4: column 'gold' (answer): 'sad' != options[0] = 'glad'" in result.output
    assert_nothing_written(tmp_path, out)


def test_answer_not_among_options(tmp_path):
    source = write_jsonl_rows(tmp_path / "src.jsonl", [ROWS[0], {**ROWS[1], "gold": "angry"}])
    out = tmp_path / "out.jsonl"
    result = invoke(
        source,
        "--to",
        "benchmark",
        "--out",
        out,
        "--map",
        "stimuli=story,question=prompt,options=choices,answer=gold",
    )
    assert result.exit_code == 1
    assert (
        f"{source}:2: column 'gold' (answer): 'angry' is not one of the options in column "
        '\'choices\' (options): ["glad", "sad", "bored"]'
    ) in result.output
    assert_nothing_written(tmp_path, out)


def test_parquet_null_names_the_row(tmp_path):
    source = write_source("parquet", tmp_path, [ROWS[0], {**ROWS[1], "gold": None}])
    out = tmp_path / "out.jsonl"
    result = invoke(source, "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out)
    assert result.exit_code == 1
    assert f"{source}: row 2: column 'gold' (answer): expected a string, got null" in result.output
    assert_nothing_written(tmp_path, out)


def test_datasets_dict_asks_for_a_split(tmp_path):
    datasets = pytest.importorskip("datasets", reason=DATASETS)
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})
    splits.save_to_disk(tmp_path / "dd")
    with pytest.raises(DataError, match=r"a DatasetDict \(splits: train\); give one split's"):
        read_source(tmp_path / "dd")
    assert read_source(tmp_path / "dd" / "train").kind == "datasets"


def test_missing_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    source = tmp_path / "src.parquet"
    source.write_bytes(b"PAR1")
    for name in ("pyarrow", "pyarrow.ipc", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)  # `import pyarrow` now fails
    out = tmp_path / "out.jsonl"
    result = invoke(source, "--to", "stimuliqa", "--map", STIMULIQA_MAP, "--out", out)
    assert result.exit_code == 1
    assert (
        "reading parquet or a datasets directory needs pyarrow: pip install -e '.[data]' "
        "(or: pip install 'pyarrow>=15')"
    ) in result.output
    assert_nothing_written(tmp_path, out)

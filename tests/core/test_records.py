"""Records, validation with file:line errors, the §4.1 split rule and the resumable order."""

import json
from pathlib import Path

import pytest

from psyrl.core.records import (
    BenchmarkRecord,
    Cursor,
    DataError,
    StimuliRecord,
    load_benchmark,
    load_stimuliqa,
    next_indices,
    read_jsonl,
    sft_target,
    split_by_variable,
    write_jsonl,
)

GOOD = {
    "id": "a/1",
    "stimuli": "My dog ran away.",
    "question": "How did I feel?",
    "answer": "sad",
    "variable": "B_sad",
    "dimension": "emotional reactions",
    "subdimension": "specific emotions",
    "reasoning": "Losing a pet hurts.",
}
MC = {
    "id": "m/1",
    "benchmark": "socialiqa",
    "task": "",
    "context": "Kai smiled.",
    "question": "Why?",
    "options": ["happy", "sad", "bored"],
    "answer_index": 0,
    "answer": "happy",
}


def write_lines(path: Path, lines) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def test_load_good_files(tmp_path):
    records = load_stimuliqa(
        write_lines(tmp_path / "s.jsonl", [GOOD, {**GOOD, "id": "a/2", "reasoning": None}])
    )
    assert records[0] == StimuliRecord(**GOOD) and records[1].reasoning is None
    (mc,) = load_benchmark(write_lines(tmp_path / "b.jsonl", [MC]))
    assert mc.options == ("happy", "sad", "bored") and mc.meta == {}


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", "invalid JSON"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "answer"}), "missing key 'answer'"),
        (json.dumps({**GOOD, "answer": 3}), "key 'answer': expected a string, got 3"),
        (json.dumps({**GOOD, "answer": "  "}), "key 'answer': must not be empty"),
        (json.dumps({**GOOD, "reasonning": "x"}), "unknown key 'reasonning'"),
        (json.dumps({**GOOD, "dimension": "emotions"}), "'emotions' is not one of"),
        (json.dumps([1, 2]), "expected a JSON object, got list"),
    ],
)
def test_bad_stimuli_line_names_file_and_line(tmp_path, line, expected):
    path = write_lines(tmp_path / "s.jsonl", [GOOD, line])
    with pytest.raises(DataError) as e:
        load_stimuliqa(path)
    assert (
        f"{path}:2: " in str(e.value)
        and expected in str(e.value)
        and "nothing loaded" in str(e.value)
    )


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"options": ["only"], "answer": "only"}, "at least 2 options"),
        ({"answer_index": 3}, "out of range for 3 options"),
        ({"answer_index": True}, "expected an integer"),
        ({"answer": "sad"}, "!= options[0]"),
        ({"options": ["happy", ""]}, "an option is empty"),
        ({"options": "happy"}, "expected a list of strings"),
    ],
)
def test_bad_benchmark_line(tmp_path, change, expected):
    path = write_lines(tmp_path / "b.jsonl", [{**MC, **change}])
    with pytest.raises(
        DataError, match=r"b\.jsonl:1: .*" + expected.replace("[", r"\[").replace("]", r"\]")
    ):
        load_benchmark(path)


def test_every_bad_line_is_reported_and_duplicates_caught(tmp_path):
    path = write_lines(
        tmp_path / "s.jsonl", [GOOD, "{", GOOD, "", {**GOOD, "id": "a/3", "question": 1}]
    )
    message = str(pytest.raises(DataError, load_stimuliqa, path).value)
    assert "3 bad line(s)" in message
    assert f"{path}:2: invalid JSON" in message
    assert f"{path}:3: duplicate id 'a/1' (first on line 1)" in message
    assert f"{path}:5: key 'question'" in message


def test_bad_encoding_is_a_line_error_and_a_bom_is_fine(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"
        + json.dumps(GOOD).encode()
        + b"\n"
        + json.dumps({**GOOD, "id": "a/2"}).encode().replace(b"sad", b"s\xe9d")
        + b"\n"
    )
    with pytest.raises(DataError, match=r"s\.jsonl:2: not valid UTF-8 \(byte \d+ of the line\)"):
        load_stimuliqa(path)


def test_read_jsonl_names_lines_and_drops_a_torn_end_only_when_asked(tmp_path):
    path = tmp_path / "r.jsonl"
    # line 2 blank; line 4 cut short by a crash (no newline)
    path.write_bytes(b'{"a": 1}\n\n[2]\n{"a": 3')
    with pytest.raises(
        DataError, match=r"r\.jsonl:4: invalid JSON \(Expecting ',' delimiter at column 8\)$"
    ):
        read_jsonl(path)
    torn = []
    assert read_jsonl(path, torn=torn) == [(1, {"a": 1}), (3, [2])]
    assert torn == [(4, "invalid JSON (Expecting ',' delimiter at column 8)")]
    # a bad line that ends in its newline is damage, not a crash: only `bad` takes it
    path.write_bytes(b'{"a": 1}\n{oops\n{"a": 3}')
    with pytest.raises(DataError, match=r"r\.jsonl:2: invalid JSON"):
        read_jsonl(path, torn=[])
    bad = []
    assert read_jsonl(path, bad=bad) == [(1, {"a": 1}), (3, {"a": 3})] and [n for n, _ in bad] == [
        2
    ]
    # bad UTF-8 is named by its line and byte; a byte-order mark is no content
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n{"a": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"r\.jsonl:2: not valid UTF-8 \(byte 11 of the line\)"):
        read_jsonl(path)
    # a value `parse` refuses is a bad line too, torn or not
    path.write_text('{"a": 1}\n{"b": 2}')

    def parse(value):
        if "a" not in value:
            raise ValueError("no key 'a'")
        return value["a"]

    with pytest.raises(DataError, match=r"r\.jsonl:2: no key 'a'"):
        read_jsonl(path, parse)
    assert read_jsonl(path, parse, torn=[]) == [(1, 1)]


def test_labels_are_optional_for_sft_sets(tmp_path):
    minimal = {"id": "r/1", "stimuli": "s", "question": "q", "answer": "a", "reasoning": "r"}
    (record,) = load_stimuliqa(write_lines(tmp_path / "s.jsonl", [minimal]))
    assert (record.variable, record.dimension, record.subdimension) == ("", "", "")
    assert sft_target(record, "cot") == "<think>r</think><answer>a</answer>"


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DataError, match="holds no records"):
        load_stimuliqa(write_lines(tmp_path / "e.jsonl", []))
    with pytest.raises(DataError, match="no such data file") as missing:
        load_benchmark(tmp_path / "missing.jsonl")
    assert "psyrl data convert SOURCE --to benchmark" in str(missing.value)
    # the GPU configs' data/stimuliqa/train.jsonl: the message names the commands that make it
    with pytest.raises(DataError) as missing:
        load_stimuliqa(tmp_path / "data" / "stimuliqa" / "train.jsonl")
    assert str(missing.value).startswith(f"{tmp_path}/data/stimuliqa/train.jsonl: no such data")
    assert "`psyrl build qa ...`" in str(missing.value)
    assert "`psyrl data convert SOURCE --to stimuliqa ...`" in str(missing.value)


def test_shipped_benchmarks_load():
    counts = {
        p.parent.name: len(load_benchmark(p))
        for p in sorted(Path("data/benchmarks").glob("*/*.jsonl"))
    }
    # data/benchmarks/README.md's table
    assert counts == {
        "bbh": 550,
        "cosmosqa": 2388,
        "emobench": 600,
        "simpletom": 2754,
        "socialiqa": 1563,
        "tombench": 2289,
    }


def test_write_jsonl_round_trips(tmp_path):
    records = [BenchmarkRecord(**{**MC, "options": tuple(MC["options"]), "meta": {"k": 1}})]
    write_jsonl(tmp_path / "o.jsonl", records)
    assert load_benchmark(tmp_path / "o.jsonl") == records


def test_sft_target():
    r = StimuliRecord(**GOOD)
    assert sft_target(r, "cot") == "<think>Losing a pet hurts.</think><answer>sad</answer>"
    assert sft_target(r, "direct") == "<answer>sad</answer>"
    assert sft_target(StimuliRecord(**{**GOOD, "reasoning": None}), "cot") is None
    assert sft_target(StimuliRecord(**{**GOOD, "reasoning": " "}), "cot") is None


def test_reason_is_an_optional_field_kept_through_a_round_trip(tmp_path):
    # the builder's `Reason:` line; files without the key (all older ones) load with reason None
    with_reason = {**GOOD, "id": "a/2", "reason": "A lost pet is a loss."}
    lines = [GOOD, with_reason, {**GOOD, "id": "a/3", "reason": None}]
    records = load_stimuliqa(write_lines(tmp_path / "s.jsonl", lines))
    assert [r.reason for r in records] == [None, "A lost pet is a loss.", None]
    write_jsonl(tmp_path / "o.jsonl", records)
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    # a None reason is left out, so a file written without one is byte for byte as before
    assert lines[0] == GOOD and lines[1] == with_reason and "reason" not in lines[2]
    assert load_stimuliqa(tmp_path / "o.jsonl") == records
    with pytest.raises(DataError, match="key 'reason': expected a string, got 3"):
        load_stimuliqa(write_lines(tmp_path / "b.jsonl", [{**GOOD, "reason": 3}]))


def test_sft_target_thinks_with_the_reason_when_asked():
    r = StimuliRecord(**{**GOOD, "reasoning": None}, reason="A lost pet is a loss.")
    assert sft_target(r, "cot", "reason") == (
        "<think>A lost pet is a loss.</think><answer>sad</answer>"
    )
    assert sft_target(r, "cot") is None  # the default think text is `reasoning`, which it lacks
    assert sft_target(r, "direct", "reason") == sft_target(r, "direct") == "<answer>sad</answer>"
    both = StimuliRecord(**GOOD, reason="A lost pet is a loss.")
    assert sft_target(both, "cot") == "<think>Losing a pet hurts.</think><answer>sad</answer>"
    assert sft_target(StimuliRecord(**GOOD), "cot", "reason") is None
    with pytest.raises(ValueError, match="unknown think source 'why'"):
        sft_target(r, "cot", "why")


def test_split_rule():
    records = [
        StimuliRecord(**{**GOOD, "id": f"{v}/{i}", "variable": v})
        for v, n in (("B_a", 7), ("C_low", 4), ("B_b", 5))
        for i in range(n)
    ]
    split = split_by_variable(records, n_train=3, n_test=2, seed=0)
    assert split.excluded == {"C_low": 4}  # 4 < 3 + 2
    assert [r.variable for r in split.train] == ["B_a"] * 3 + ["B_b"] * 3
    assert [r.variable for r in split.test] == ["B_a"] * 2 + ["B_b"] * 2
    assert not {r.id for r in split.train} & {r.id for r in split.test}
    b_b = {r.id for r in split.train + split.test if r.variable == "B_b"}
    assert b_b == {f"B_b/{i}" for i in range(5)}  # exactly n_train + n_test items: all used
    assert split_by_variable(records, 3, 2, seed=0) == split  # seeded
    assert split_by_variable(records, 3, 2, seed=1).train != split.train
    assert split_by_variable(records, 3, 2, seed=0, min_count=4).excluded == {}


def test_order_is_seeded_and_resumable():
    drawn, cursor = next_indices(Cursor(), 5, 12, seed=3)
    assert cursor == Cursor(epoch=2, position=2)
    # each epoch a permutation
    assert sorted(drawn[:5]) == list(range(5)) and sorted(drawn[5:10]) == list(range(5))
    pieces, c = [], Cursor()
    for count in (4, 1, 7):  # drawing in pieces (as a resumed run does) gives the same stream
        got, c = next_indices(c, 5, count, seed=3)
        pieces += got
    assert pieces == drawn and c == cursor
    assert next_indices(Cursor(), 5, 5, seed=3, shuffle=False)[0] == [0, 1, 2, 3, 4]
    # seed matters
    assert next_indices(Cursor(), 50, 50, seed=4)[0] != next_indices(Cursor(), 50, 50, seed=3)[0]

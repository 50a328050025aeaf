"""`psyrl reward score|audit` end to end: on hand-made answers, on the shipped triples, and on each
kind of bad input (exit status 2, one message naming file and line, nothing on standard output)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.main import main

TRIPLES = Path("data/reward_triples/triples.jsonl")


def run(*args):
    return CliRunner().invoke(main, ["reward", *args])


def test_score_writes_one_object_per_row(tmp_path):
    rows = [
        {"gold": "Very angry.", "prediction": "Very calm."},  # F1: {very} of 2 and 2 -> 0.5
        {"gold": "Proud", "prediction": "She beams with pride.", "id": "x"},  # no shared word: 0
        {"gold": "Proud", "prediction": ""},  # no answer: 0 under both
    ]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run("score", str(path), "--accuracy", "f1", "--accuracy", "semantic")
    assert result.exit_code == 0, result.output
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(out) == 3 and all(list(o) == ["f1", "semantic"] for o in out)
    assert [o["f1"] for o in out] == [0.5, 0.0, 0.0]
    assert 0 < out[1]["semantic"] <= 1 and out[2]["semantic"] == 0.0
    assert result.stderr == ""


def test_score_takes_the_config_tables(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"gold": "a", "prediction": "b"}\n')
    result = run("score", str(path), "--accuracy", "semantic", "--set", "semantic.encoder=nowhere")
    assert result.exit_code == 1 and result.stdout == ""
    assert "nowhere: not a Hugging Face encoder directory" in result.stderr


def test_audit_on_the_shipped_triples():
    result = run("audit", str(TRIPLES), "--accuracy", "f1", "--accuracy", "semantic", "--json")
    assert result.exit_code == 0, result.output
    f1, sem = (json.loads(line) for line in result.stdout.splitlines())
    assert f1["signal"] == "f1" and sem["signal"] == "semantic"
    assert f1["n"] == sem["n"] >= 60
    # every shipped wrong answer shares more words with the gold than the right one does
    assert f1["above"] == 0 and f1["margin"] < 0
    for figures in (f1, sem):
        low, high = figures["above_interval"]
        assert 0 <= low <= figures["above"] <= high <= 1
    table = run("audit", str(TRIPLES), "--accuracy", "f1")
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["signal", "n", "right"]
    assert row.startswith("f1  ") and f" 0/{f1['n']} = 0.000 [0.000, 0.000]" in row


@pytest.mark.parametrize(
    ("command", "content", "message"),
    [
        ("score", '{"gold": "a", "prediction": "b"}\n{oops\n', ":2: invalid JSON"),
        ("score", '"a string"\n', ":1: expected a JSON object with string keys"),
        ("score", '{"prediction": "b"}\n', ":1: missing key 'gold' (a string)"),
        ("score", '{"gold": "a", "prediction": null}\n', ":1: key 'prediction': expected a string"),
        ("score", b'{"gold": "\xff"}\n', ":1: not valid UTF-8"),
        ("score", "", ": the file holds no rows"),
        ("score", "\n  \n", ": the file holds no rows"),
        ("audit", '{"gold": "g", "right": "r"}\n', ":1: missing key 'wrong' (a string)"),
        ("audit", '{"gold": "g", "right": "r", "wrong": 0}\n', ":1: key 'wrong': expected a"),
    ],
)
def test_bad_input_exits_1_with_file_and_line_and_writes_nothing(
    tmp_path, command, content, message
):
    path = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    result = run(command, str(path), "--accuracy", "f1")
    assert result.exit_code == 1  # a file's contents: 1, as for every command (docs/cli.md)
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: {path}") and f"{path}{message}" in result.stderr
    assert "Traceback" not in result.output


def test_missing_file_and_unknown_signal_are_usage_errors(tmp_path):
    missing = run("score", str(tmp_path / "none.jsonl"), "--accuracy", "f1")
    assert missing.exit_code == 2 and missing.stdout == "" and "does not exist" in missing.stderr
    unknown = run("audit", str(TRIPLES), "--accuracy", "bleu")
    assert unknown.exit_code == 2 and "'bleu' is not one of" in unknown.stderr


def test_an_unanswered_judge_stops_the_command_instead_of_scoring_f1(tmp_path):
    # port 9 (discard) refuses the connection: training would fall back to F1 (judge.on_failure),
    # but a score or an audit labelled "judge" must be the judge's
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"gold": "proud", "prediction": "proud"}) + "\n")
    result = run(
        "score",
        str(rows),
        "--accuracy",
        "judge",
        "--set",
        'judge.base_url="http://127.0.0.1:9/v1"',
        "--set",
        'judge.model="x"',
        "--set",
        "judge.retries=0",
    )
    assert result.exit_code == 1, result.output
    assert "http://127.0.0.1:9/v1/chat/completions" in result.output
    assert '"judge"' not in result.stdout


def test_an_out_of_range_seed_is_a_usage_error_not_a_traceback():
    result = run("audit", str(TRIPLES), "--accuracy", "f1", "--seed", "99999999999999999999999")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        "Invalid value for '--seed'" in result.output
        and "0<=x<=9223372036854775807" in result.output
    )


def test_an_audit_of_few_triples_warns_that_its_interval_says_little(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(TRIPLES.read_text().splitlines()[0] + "\n")
    result = run("audit", str(one), "--accuracy", "f1")
    assert result.exit_code == 0, result.output
    assert (
        "warning: 1 triple(s)" in result.stderr and "one triple's is its own value" in result.stderr
    )
    assert "[0.000, 0.000]" in result.stdout


def test_the_probes_of_f1_on_the_shipped_triples():
    result = run("audit", str(TRIPLES), "--accuracy", "f1", "--probes", "--json")
    assert result.exit_code == 0, result.output
    (f1,) = (json.loads(line) for line in result.stdout.splitlines())
    probes = {p["id"]: p for p in f1["probes"]}
    assert len(probes) == 22 and {"score-line", "empty", "every-emotion", "thought-process"} <= set(
        probes
    )
    assert probes["empty"]["mean"] == 0.0 and probes["score-line"]["mean"] == 0.0
    # F1 counts shared words: no probe's mean reaches the wrong answers', which share the gold's
    assert not any(p["beats"] for p in probes.values()) and all(
        p["unscored"] == 0 for p in probes.values()
    )
    table = run("audit", str(TRIPLES), "--accuracy", "f1", "--probes").stdout
    assert "beat the wrong answers   0/22" in table
    assert "escape the judge         0/22" in table

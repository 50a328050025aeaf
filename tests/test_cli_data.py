"""`psyrl data check` and the other data sub-commands of the `psyrl` group."""

from click.testing import CliRunner

from psyrl.cli.main import main


def test_data_check_reports_counts_and_bad_lines(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "x", "benchmark": "b", "task": "", "context": "", "question": "q", "options": '
        '["a"], "answer_index": 0, "answer": "a"}\n'
    )
    result = CliRunner().invoke(
        main, ["data", "check", "data/demo/train.jsonl", "data/demo/mc.jsonl", str(bad)]
    )
    assert result.exit_code == 1
    assert "data/demo/train.jsonl: 720 StimuliRecord records, all valid" in result.output
    assert "data/demo/mc.jsonl: 360 BenchmarkRecord records, all valid" in result.output
    assert f"{bad}:1: key 'options': expected at least 2 options" in result.output


def test_data_check_unknown_schema(tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"prompt": "hi"}\n')
    result = CliRunner().invoke(main, ["data", "check", str(odd)])
    assert result.exit_code == 1 and f"{odd}:1: neither a StimuliQA record" in result.output


def test_group_lists_its_commands():
    out = CliRunner().invoke(main, ["--help"]).output
    for command in ("config", "data", "demo-data", "select-checkpoint", "tiny-tokenizer"):
        assert command in out

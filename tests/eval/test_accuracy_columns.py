"""`psyrl evaluate --accuracy` and `--choose-by similarity` (issue 41 item 6): accuracy signals
beside the paper's metrics, and options chosen by semantic similarity, on the real
all-MiniLM-L6-v2 weights; without the options every output byte is the paper's."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_evaluate import tiny_model  # noqa: F401 (the evaluation tests' model)

import evaluate as evaluate_script
from psyrl.core.presets import benchmarks_dir
from psyrl.core.records import BenchmarkRecord, StimuliRecord
from psyrl.core.text import choice_of
from psyrl.eval.benchmarks import EvalError, aggregate, resolve_sources, score_response
from psyrl.eval.report import compare_markdown, results_markdown
from psyrl.rl.accuracy import Pair
from psyrl.signals.evaluation import Scorers, score_signals
from psyrl.signals.semantic import SemanticSignal

SOURCES = "bbh,data/demo/test.jsonl"  # a multiple-choice benchmark and a StimuliQA file
FAST = ["--limit", 1, "--max-new-tokens", 6, "--no-progress"]
PROUD = BenchmarkRecord(
    id="x/1",
    benchmark="x",
    task="",
    context="Tom won the race. His mother watched him cross the line.",
    question="How does his mother feel?",
    options=("She is not proud of him at all", "She is proud of him"),
    answer_index=1,
    answer="She is proud of him",
)


@pytest.fixture(scope="module")
def semantic():
    return SemanticSignal()


def here(*args):
    return CliRunner().invoke(evaluate_script.evaluate, [str(a) for a in args])


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def results_of(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["results"]


def test_semantic_column_beside_the_paper_and_the_default_unchanged(tiny_model, tmp_path, semantic):  # noqa: F811
    plain, scored = tmp_path / "plain", tmp_path / "scored"
    args = ["--model", tiny_model, "--benchmarks", SOURCES, *FAST]
    assert (done := here(*args, "--out", plain)).exit_code == 0, done.output[-2000:]
    flagged = here(*args, "--out", scored, "--accuracy", "semantic")
    assert flagged.exit_code == 0, flagged.output[-2000:]

    # every row gains accuracy/semantic in [0, 1]; its paper fields are the plain run's
    rows, paper = rows_of(scored), rows_of(plain)
    assert all(0.0 <= r["accuracy/semantic"] <= 1.0 for r in rows)
    assert [{k: v for k, v in r.items() if k != "accuracy/semantic"} for r in rows] == paper
    # the signal of the extracted answer against the gold answer text
    sources = resolve_sources(SOURCES.split(","), benchmarks_dir())
    records = {r.id: r for s in sources for r in s.records}
    pairs = [Pair(records[r["id"]].answer, r["extracted"]) for r in rows]
    expected = semantic(pairs).tolist()
    assert [r["accuracy/semantic"] for r in rows] == pytest.approx(expected, abs=1e-6)

    # the summary's mean x100, after the paper's keys; a column after the paper's in every table
    summary, before = results_of(scored), results_of(plain)
    assert summary["bbh"]["accuracy/semantic"] == pytest.approx(
        100 * sum(r["accuracy/semantic"] for r in rows if r["benchmark"] == "bbh") / 3
    )
    for name, s in summary.items():
        assert list(s)[-2:] == ["accuracy/semantic", "tasks"]
        assert {k: v for k, v in s.items() if k not in ("accuracy/semantic", "tasks")} == {
            k: v for k, v in before[name].items() if k != "tasks"
        }
    markdown = (scored / "results.md").read_text()
    assert "| run | BIG-Bench Hard F1 | BIG-Bench Hard Acc | BIG-Bench Hard semantic |" in markdown
    assert "| overall F1 | format % | n | semantic |" in markdown
    assert "| format % | length | semantic |" in markdown
    assert json.loads((scored / "eval.json").read_text())["accuracy"] == ["semantic"]

    # a resume scores the same rows (the encoder is deterministic for the same batches)
    first = (scored / "predictions.jsonl").read_bytes()
    again = here(*args, "--out", scored, "--accuracy", "semantic")
    assert again.exit_code == 0 and "9 already in" in again.output
    assert (scored / "predictions.jsonl").read_bytes() == first
    # the same directory without the option: every file as the paper's run wrote it
    assert here(*args, "--out", scored).exit_code == 0
    for name in ("predictions.jsonl", "eval.json", "results.md"):
        assert (scored / name).read_bytes() == (plain / name).read_bytes(), name
    assert results_of(scored) == results_of(plain)


def row_of(record, answer: str, source: str = "x") -> dict:
    return score_response(record, source, f"<answer>{answer}</answer>", 8, "stop", 0, "direct")


def test_choose_by_similarity_takes_the_most_similar_option(semantic):
    row = row_of(PROUD, "she beams with pride at him")
    # F1 (SPEC §7) picks the negation, which shares more words: 3/7 against 4/11
    assert choice_of(row["option_f1"]) == 0 and row["correct"] is False
    score_signals([row], {PROUD.id: PROUD}, Scorers(similarity=semantic))
    # the rule, computed with the signal itself: the option of highest similarity
    expected = semantic([Pair(o, "she beams with pride at him") for o in PROUD.options]).tolist()
    assert row["option_similarity"] == expected and expected[1] > expected[0]
    assert row["choice"] == 1 and row["correct"] is True
    assert row["option_f1"][0] > row["option_f1"][1]  # the paper's scores are kept
    # recorded in the summary and the table; never compared with an F1-chosen run
    result = aggregate([row])
    assert result["x"]["choose_by"] == "similarity" and result["x"]["accuracy"] == 100.0
    settings = {
        "model": "m",
        "prompt": "direct",
        "temperature": 0.5,
        "top_p": 1.0,
        "seed": 0,
        "max_new_tokens": 8,
        "split": "all",
        "limit": 0,
        "choose_by": "similarity",
    }
    assert "| run | x F1 | x Acc (sim) |" in results_markdown("m", result, settings)
    paper = aggregate([row_of(PROUD, "she beams with pride at him")])
    with pytest.raises(EvalError, match="different rules"):
        compare_markdown(["sim", "f1"], [result, paper])
    # a tie at the top is E, as under F1: no answer scores 0 against every option
    empty = row_of(PROUD, "")
    score_signals([empty], {PROUD.id: PROUD}, Scorers(similarity=semantic))
    assert empty["option_similarity"] == [0.0, 0.0] and empty["choice"] is None


class FakeJudge:
    """Records what it is asked: one call per benchmark, with the item's stimulus and question."""

    name = "judge"

    def __init__(self):
        self.calls, self.fallbacks = [], 0

    def __call__(self, pairs):
        self.calls.append(list(pairs))
        return torch.full((len(pairs),), 0.75, dtype=torch.float64)


def test_signals_score_a_whole_benchmark_at_once_with_its_context():
    story = StimuliRecord(
        id="s/1", stimuli="Ann lost her keys.", question="How does Ann feel?", answer="Annoyed"
    )
    rows = [row_of(PROUD, "proud"), row_of(PROUD, "glad"), row_of(story, "cross", "s")]
    judge = FakeJudge()
    perf = score_signals(rows, {PROUD.id: PROUD, story.id: story}, Scorers({"judge": judge}))
    assert [len(c) for c in judge.calls] == [2, 1] and perf == {"judge_fallbacks": 0}
    assert judge.calls[0][0] == Pair("She is proud of him", "proud", PROUD.context, PROUD.question)
    assert judge.calls[1][0] == Pair("Annoyed", "cross", "Ann lost her keys.", "How does Ann feel?")
    assert [r["accuracy/judge"] for r in rows] == [0.75] * 3


def test_bad_signal_options_are_refused_before_any_model_is_read(tmp_path):
    args = ["--model", tmp_path, "--benchmarks", "bbh", "--limit", 1]
    unknown = here(*args, "--accuracy", "bleu")
    assert unknown.exit_code == 2 and "'bleu' is not one of 'semantic', 'judge'" in unknown.output
    bad_rule = here(*args, "--choose-by", "judge")
    assert bad_rule.exit_code == 2 and "'judge' is not one of 'f1', 'similarity'" in bad_rule.output
    no_endpoint = here(*args, "--accuracy", "judge")
    assert no_endpoint.exit_code == 1
    assert "--accuracy judge needs the judge's endpoint: base_url and model" in no_endpoint.stderr
    config = tmp_path / "signals.toml"
    config.write_text('[judge]\nmodel = "qwen"\n')
    no_url = here(*args, "--accuracy", "judge", "--signal-config", config)
    assert (
        no_url.exit_code == 1 and "base_url = ''" in no_url.stderr and str(config) in no_url.stderr
    )
    unused = here(*args, "--signal-config", config)
    assert unused.exit_code == 1 and "--signal-config configures" in unused.stderr
    config.write_text("[judge]\nmodle = 1\n")
    typo = here(*args, "--accuracy", "judge", "--signal-config", config)
    assert typo.exit_code == 1 and "modle" in typo.stderr
    assert not (tmp_path / "runs").exists()

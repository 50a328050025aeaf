"""Evaluation scoring (SPEC §7), item selection and halves (§8), the tables, self-labelling and the
RQ5 counts: pure functions of records and responses, tested without a model against hand-computed
values."""

import json
import math
import random

import pytest

from psyrl.core.config import ModelConfig, PromptConfig
from psyrl.core.records import (
    BenchmarkRecord,
    DataError,
    StimuliRecord,
    load_benchmark,
    load_stimuliqa,
    write_jsonl,
)
from psyrl.core.text import choice_of, option_scores
from psyrl.eval.benchmarks import (
    EvalError,
    aggregate,
    half_of,
    item_seed,
    read_predictions,
    resolve_sources,
    score_response,
    select_items,
)
from psyrl.eval.lengths import (
    counts_markdown,
    lengths_by_benchmark,
    lengths_by_index,
    plot_lengths,
    separation,
)
from psyrl.eval.report import (
    compare_markdown,
    main_table,
    results_markdown,
    stimuliqa_table,
    task_table,
)
from psyrl.eval.self_label import self_label
from psyrl.runtime.model import load_tokenizer
from psyrl.sft.loss import build_examples

FEELINGS = ("very happy", "sad", "angry")
HALVES_PINNED = ["eval", "selftrain", "eval", "eval", "eval", "selftrain"]


def mc(item_id, options=FEELINGS, answer_index=0, task="t1", benchmark="toy", meta=None):
    return BenchmarkRecord(
        item_id,
        benchmark,
        task,
        f"story {item_id}",
        "How does she feel?",
        tuple(options),
        answer_index,
        options[answer_index],
        meta or {},
    )


def test_f1_accuracy_hand_cases():
    # a clear winner; a two-way tie -> E; all options zero -> E; duplicate options -> E
    assert (
        option_scores("very happy", FEELINGS) == [1.0, 0.0, 0.0] and choice_of([1.0, 0.0, 0.0]) == 0
    )
    assert option_scores("happy", FEELINGS) == [2 / 3, 0.0, 0.0]
    assert (
        option_scores("sad angry", FEELINGS) == [0.0, 2 / 3, 2 / 3]
        and choice_of([0.0, 2 / 3, 2 / 3]) is None
    )
    assert choice_of(option_scores("nothing at all", FEELINGS)) is None
    assert choice_of(option_scores("calm", ["calm", "Calm!", "tense"])) is None
    # the data has such items: socialiqa/dev/0103 repeats an option text
    assert choice_of(option_scores("tense", ["calm", "calm", "tense"])) == 2


RESPONSES = [  # (record, response, tokens): the fixed fake responses of the table test
    (mc("toy/a"), "<think>x</think><answer>very happy</answer>", 10),  # right, formatted
    # right by F1-accuracy, no think: format 0
    (mc("toy/b"), "<answer>happy</answer>", 20),
    (mc("toy/c"), "<think>r</think><answer>sad angry</answer>", 30),  # tie -> E
    (mc("toy/d"), "nothing", 40),  # all zero -> E, format 0
    # duplicates -> E
    (mc("toy/e", ("calm", "calm", "tense"), 2, "t2"), "<think>a</think><answer>calm</answer>", 50),
]


def fake_rows():
    return [
        score_response(r, r.benchmark, text, tokens, "stop", -0.5, "cot")
        for r, text, tokens in RESPONSES
    ]


def test_score_response_fields():
    rows = fake_rows()
    assert [r["choice"] for r in rows] == [0, 0, None, None, None]
    assert [r["correct"] for r in rows] == [True, True, False, False, False]
    assert [r["f1"] for r in rows] == [1.0, 2 / 3, 0.0, 0.0, 0.0]
    assert [r["format"] for r in rows] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert rows[2]["extracted"] == "sad angry" and rows[2]["option_f1"] == [0.0, 2 / 3, 2 / 3]
    assert set(rows[0]) == {
        "id",
        "benchmark",
        "task",
        "index",
        "response",
        "extracted",
        "f1",
        "format",
        "tokens",
        "finish",
        "mean_logprob",
        "option_f1",
        "choice",
        "correct",
    }


def test_fake_responses_give_exactly_known_tables():
    results = aggregate(fake_rows())
    toy = results["toy"]
    assert toy["tasks"]["t1"] == {
        "count": 4,
        "f1": pytest.approx(100 * (1 + 2 / 3) / 4),
        "accuracy": 50.0,
        "not_applicable": 2,
        "format": 50.0,
        "length": 25.0,
    }
    assert toy["tasks"]["t2"] == {
        "count": 1,
        "f1": 0.0,
        "accuracy": 0.0,
        "not_applicable": 1,
        "format": 100.0,
        "length": 50.0,
    }
    assert {
        k: toy[k] for k in ("count", "f1", "accuracy", "not_applicable", "format", "length")
    } == {
        "count": 5,
        "f1": pytest.approx(100 / 3),
        "accuracy": 40.0,
        "not_applicable": 3,
        "format": 60.0,
        "length": 30.0,
    }
    assert main_table(["m"], [results]).splitlines()[2] == "| m | 33.33 | 40.00 |"
    rows = task_table(results).splitlines()
    assert rows[2] == "| toy | (all) | 5 | 33.33 | 40.00 | 3 | 60.0 | 30.0 |"
    assert rows[3] == "| toy | t1 | 4 | 41.67 | 50.00 | 2 | 50.0 | 25.0 |"
    # a second run with one more right answer: deltas against the first
    better = aggregate(
        fake_rows()[:4]
        + [
            score_response(
                mc("toy/e", ("calm", "calm", "tense"), 2, "t2"),
                "toy",
                "<think>a</think><answer>tense</answer>",
                50,
                "stop",
                -0.5,
                "cot",
            )
        ]
    )
    assert (
        compare_markdown(["a", "b"], [results, better]).splitlines()[3]
        == "| b | 53.33 (+20.00) | 60.00 (+20.00) |"
    )


def test_stimuliqa_records_are_grouped_by_subdimension_without_accuracy():
    records = [
        StimuliRecord(
            "s/1",
            "I shouted.",
            "How did I feel?",
            "very angry",
            "B_anger",
            "emotional reactions",
            "specific emotions",
        ),
        StimuliRecord(
            "s/2",
            "We won.",
            "Whom am I proud of?",
            "my team",
            "C_pcol",
            "emotional reactions",
            "targeted emotions",
        ),
    ]
    rows = [
        score_response(
            records[0], "demo/test", "<think>x</think><answer>angry</answer>", 8, "stop", -1, "cot"
        ),
        score_response(records[1], "demo/test", "<answer>my team</answer>", 4, "stop", -1, "cot"),
    ]
    assert (
        rows[0]["task"] == "specific emotions"
        and rows[0]["correct"] is None
        and rows[0]["f1"] == 2 / 3
    )
    results = aggregate(rows)
    assert (
        results["demo/test"]["accuracy"] is None and results["demo/test"]["not_applicable"] is None
    )
    assert main_table(["m"], [results]) == ""
    table = stimuliqa_table(["m"], [results]).splitlines()
    assert table[2] == "| run | specific emotions | targeted emotions | overall F1 | format % | n |"
    assert table[4] == "| m | 66.67 | 100.00 | 83.33 | 50.00 | 2 |"
    settings = {
        "model": "/x/hf",
        "prompt": "cot",
        "temperature": 0.5,
        "top_p": 0.99,
        "seed": 0,
        "max_new_tokens": 8,
        "split": "all",
        "split_seed": 0,
        "limit": 0,
    }
    markdown = results_markdown("m", results, settings)
    assert "| m | 66.67 | 100.00 | 83.33 | 50.00 | 2 |" in markdown
    assert " Acc |" not in markdown.split("## Per")[0]


def test_halves_partition_every_benchmark_and_limit_is_per_task():
    records = load_benchmark("data/benchmarks/bbh/test.jsonl")
    train = select_items(records, 0, "selftrain", seed=0)
    held = select_items(records, 0, "eval", seed=0)
    assert {r.id for r in train}.isdisjoint({r.id for r in held}) and len(train) + len(held) == len(
        records
    )
    assert 0.4 < len(train) / len(records) < 0.6
    assert select_items(records, 0, "eval", seed=1) != held  # the split seed moves items
    # pinned: a change of the hash would silently move items between the halves of earlier runs
    assert [half_of(f"bbh/formal_fallacies/{i:04d}", 0) for i in range(1, 7)] == HALVES_PINNED
    limited = select_items(records, 5, "all", seed=0)
    assert sorted(r.task for r in limited) == sorted(
        ["causal_judgement", "disambiguation_qa", "formal_fallacies"] * 5
    )
    assert [r.id for r in limited] == [r.id for r in records if r in limited]  # file order
    # an item's selection does not depend on the others: the same 5 after shuffling the file
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    assert {r.id for r in select_items(shuffled, 5, "all", 0)} == {r.id for r in limited}
    assert item_seed(0, "x") == item_seed(0, "x") != item_seed(1, "x")
    with pytest.raises(EvalError, match="unknown split"):
        select_items(records, 0, "test", 0)


def test_unknown_benchmark_lists_the_valid_ones():
    with pytest.raises(EvalError) as e:
        resolve_sources(["tombench", "theoryofmind"], "data/benchmarks")
    assert "'theoryofmind'" in str(e.value)
    for name in ("tombench", "simpletom", "socialiqa", "cosmosqa", "bbh", "emobench"):
        assert name in str(e.value)


def test_bad_benchmark_line_is_reported_with_file_and_line(tmp_path):
    lines = tmp_path / "b.jsonl"
    good = {
        "id": "x/1",
        "benchmark": "x",
        "task": "",
        "context": "c",
        "question": "q",
        "options": ["a", "b"],
        "answer_index": 0,
        "answer": "a",
    }
    lines.write_text(
        json.dumps(good) + "\n" + json.dumps({**good, "id": "x/2", "answer_index": 5}) + "\n"
    )
    with pytest.raises(DataError, match=r"b\.jsonl:2: key 'answer_index': 5 is out of range"):
        resolve_sources([str(lines)], "data/benchmarks")
    lines.write_text(json.dumps(good) + "\n")
    other = tmp_path / "c.jsonl"
    other.write_text(json.dumps({**good, "benchmark": "y"}) + "\n")
    with pytest.raises(EvalError, match="item id 'x/1' is also in"):
        resolve_sources([str(lines), str(other)], "data/benchmarks")


def test_read_predictions_drops_only_a_torn_last_line(tmp_path):
    path = tmp_path / "predictions.jsonl"
    rows = fake_rows()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + json.dumps(rows[0])[:40])
    with pytest.raises(EvalError, match=r"predictions\.jsonl:6:"):
        read_predictions(path)
    assert read_predictions(path, tolerate_torn_end=True) == (rows, 1)
    path.write_text(text.replace(json.dumps(rows[1]), "{oops"))
    with pytest.raises(EvalError, match=r"predictions\.jsonl:2:"):
        # a bad line in the middle is damage, not a crash
        read_predictions(path, tolerate_torn_end=True)


def label_case():
    """Predictions with hand-known fates at tau = 0.4 (F1 confidence)."""
    records = {r.id: r for r in [mc(f"toy/{k}") for k in "abcdef"]}
    texts = {
        # kept: very happy (confidence 1)
        "a": "<think>she smiles</think><answer>very happy</answer>",
        "b": "<answer>very happy</answer>",  # format invalid in cot mode
        # E tie at 2/3: kept, a seeded one of the two
        "c": "<think>hmm</think><answer>sad angry</answer>",
        "d": "<think>hmm</think><answer>nothing</answer>",  # confidence 0
        # confidence exactly 0.4: not > tau
        "e": "<think>hmm</think><answer>happy one two three</answer>",
        # kept: sad (wrong by the gold, which is unused)
        "f": "<think>she frowns</think><answer>sad</answer>",
    }
    rows = [
        score_response(records[f"toy/{k}"], "toy", t, 5, "stop", math.log(0.5), "cot")
        for k, t in texts.items()
    ]
    return rows, records


def test_self_label_keeps_exactly_the_expected_items():
    rows, records = label_case()
    kept, counts = self_label(rows, records, tau=0.4)
    assert counts == {
        "predictions": 6,
        "kept": 3,
        "evaluation_only": 0,
        "no_context": 0,
        "format_invalid": 1,
        "low_confidence": 2,
        "no_matching_option": 0,
    }
    assert [(r.id, r.answer) for r in kept][0::2] == [
        ("self/toy/a", "very happy"),
        ("self/toy/f", "sad"),
    ]
    assert kept[1].id == "self/toy/c" and kept[1].answer in ("sad", "angry")
    assert kept[0].reasoning == "she smiles" and kept[0].stimuli == "story toy/a"
    assert kept[0].question == "How does she feel?" and kept[0].variable == "toy/t1"
    # the tie's option is seeded per item: both appear over seeds, the same one for the same seed
    picks = {self_label(rows, records, 0.4, seed=s)[0][1].answer for s in range(20)}
    assert picks == {"sad", "angry"}
    assert self_label(rows[::-1], records, 0.4)[0][::-1] == kept  # order-independent
    # gold answers are never read: other golds give the same set
    regolded = {k: mc(k, answer_index=2) for k in records}
    assert self_label(rows, regolded, 0.4) == (kept, counts)
    # the model-probability confidence: exp(mean log p) = 0.5 > 0.4 keeps every formatted one with a
    # matching option
    kept_lp, counts_lp = self_label(rows, records, 0.4, confidence="logprob")
    assert counts_lp == {
        "predictions": 6,
        "kept": 4,
        "evaluation_only": 0,
        "no_context": 0,
        "format_invalid": 1,
        "low_confidence": 0,
        "no_matching_option": 1,
    }
    assert self_label(rows, records, 0.6, confidence="logprob")[1]["kept"] == 0
    # an --engine openai run has no log-probs: f1 works on it, logprob is refused by name
    api_rows = [{**r, "mean_logprob": None} for r in rows]
    assert self_label(api_rows, records, 0.4) == (kept, counts)
    with pytest.raises(EvalError, match="has no mean_logprob.*--confidence f1"):
        self_label(api_rows, records, 0.4, confidence="logprob")


def test_self_labelled_file_loads_as_sft_data(tmp_path):
    rows, records = label_case()
    kept, _ = self_label(rows, records, 0.4)
    write_jsonl(tmp_path / "self.jsonl", kept)
    loaded = load_stimuliqa(tmp_path / "self.jsonl")
    assert loaded == kept
    examples, counts = build_examples(loaded, load_tokenizer(ModelConfig()), PromptConfig(), 512)
    assert counts["kept"] == 3 and len(examples) == 3


def test_paper_option_benchmarks_keep_their_options_in_the_self_labelled_question():
    record = mc("socialiqa/x", benchmark="socialiqa")
    row = score_response(
        record, "socialiqa", "<think>t</think><answer>sad</answer>", 3, "stop", -1.0, "cot"
    )
    kept, _ = self_label([row], {record.id: record})
    assert kept[0].question == "How does she feel?\nA. very happy\nB. sad\nC. angry"


def test_self_label_leaves_out_tombench_and_items_without_a_context():
    records = [
        mc("tombench/x", benchmark="tombench"),
        BenchmarkRecord("toy/empty", "toy", "t1", "", "How?", FEELINGS, 0, FEELINGS[0]),
    ]
    rows = [
        score_response(
            r, r.benchmark, "<think>t</think><answer>sad</answer>", 3, "stop", -1.0, "cot"
        )
        for r in records
    ]
    by_id = {r.id: r for r in records}
    kept, counts = self_label(rows, by_id)
    assert kept == [] and counts["evaluation_only"] == 1 and counts["no_context"] == 1
    kept, counts = self_label(rows, by_id, include_evaluation_only=True)
    assert [r.id for r in kept] == ["self/tombench/x"] and counts["no_context"] == 1


def uot_row(index, f1, tokens):
    return {
        "benchmark": "tombench",
        "task": "Unexpected Outcome Test",
        "index": index,
        "f1": f1,
        "tokens": tokens,
    }


def test_rq5_lengths_count_only_non_zero_f1_samples(tmp_path):
    rows = [
        uot_row(1, 0.5, 10),
        uot_row(1, 0.0, 99),
        uot_row(2, 0.2, 30),
        uot_row(2, 1.0, 50),
        uot_row(3, 0.0, 7),
        {**uot_row(1, 1.0, 5), "task": "False Belief Task"},
    ]
    lengths, items = lengths_by_index(rows)
    assert lengths == {1: [10], 2: [30, 50], 3: []} and items == {1: 2, 2: 2, 3: 1}
    table = counts_markdown(
        ["base", "bilateral"], [(lengths, items), (lengths, items)]
    ).splitlines()
    # index 3 has no valid sample: no separation
    assert table[2] == "| base | 1 / 2 (10) | 2 / 2 (40) | 0 / 1 (-) | 3 | - |"
    out = plot_lengths(
        ["base", "bilateral"], [(lengths, items), (lengths, items)], tmp_path / "fig6.png"
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(EvalError, match="no Unexpected Outcome Test item"):
        lengths_by_index(rows[-1:])


def test_lengths_by_benchmark_and_the_separation_of_the_last_level_from_the_first(tmp_path):
    """The testbed's Figure 6: valid samples' lengths per benchmark file, in the predictions'
    order, and median(last) - median(first) with an unpaired bootstrap interval."""
    rows = [
        {"benchmark": b, "f1": f1, "tokens": n}
        for b, f1, n in [
            ("test-k1", 1.0, 20),
            ("test-k1", 1.0, 24),
            ("test-k1", 0.0, 90),  # wrong: not counted
            ("test-k3", 1.0, 40),
            ("test-k3", 1.0, 44),
            ("test-k3", 1.0, 48),
            ("test-k2", 0.0, 30),
        ]
    ]
    lengths, items = lengths_by_benchmark(rows)
    assert list(lengths) == ["test-k1", "test-k3", "test-k2"]
    assert lengths == {"test-k1": [20, 24], "test-k3": [40, 44, 48], "test-k2": []}
    assert items == {"test-k1": 3, "test-k3": 3, "test-k2": 1}
    # last group here is test-k2 with no valid sample: no separation
    assert separation(lengths) is None
    two = {"test-k1": [20, 24], "test-k3": [40, 44, 48]}
    # medians 22 and 44: +22; a resample's medians lie in [20, 24] and [40, 48], so the interval
    # lies in [+16, +28]; every resample of a constant group has the same median
    mid, low, high = separation(two)
    assert mid == 22.0 and 16.0 <= low <= 22.0 <= high <= 28.0
    assert separation({"a": [5, 5], "b": [9]}) == (4.0, 4.0, 4.0)
    table = counts_markdown(["BR"], [(two, {"test-k1": 3, "test-k3": 3})]).splitlines()
    assert table[0].startswith("| run | test-k1: valid / items (median tokens) | test-k3: ")
    assert table[0].endswith("| total valid | test-k3 − test-k1 median tokens [95 % CI] |")
    assert table[2].startswith("| BR | 2 / 3 (22) | 3 / 3 (44) | 5 | +22 [")
    out = plot_lengths(["BR"], [(two, {"test-k1": 3, "test-k3": 3})], tmp_path / "levels.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(EvalError, match="no predictions"):
        lengths_by_benchmark([])


def test_lengths_by_benchmark_refuses_runs_of_different_benchmarks(tmp_path):
    """`psyrl evaluate lengths --by benchmark` over two runs that evaluated different files: an
    error that names each run's benchmarks, no figure."""
    from click.testing import CliRunner

    from psyrl.cli.evaluate import evaluate

    for name, benchmarks in (("a", ["test-k1", "test-k3"]), ("b", ["test-k1"])):
        (tmp_path / name).mkdir()
        rows = [
            {"id": str(i), "benchmark": b, "task": "-", "f1": 1.0, "format": 1.0, "tokens": 9}
            for i, b in enumerate(benchmarks)
        ]
        (tmp_path / name / "predictions.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    out = tmp_path / "fig.png"
    args = ["lengths", str(tmp_path / "a"), str(tmp_path / "b"), "--by", "benchmark"]
    result = CliRunner().invoke(evaluate, [*args, "--out", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "the runs evaluated different benchmarks" in result.output
    assert f"{tmp_path / 'a'}: test-k1, test-k3; {tmp_path / 'b'}: test-k1" in result.output

"""The testbed tasks (psyrl/dataset/testbed.py, issue 43), mood drift, mood swing and swing with two
reasoning lengths (choice): deterministic, the committed copies == a fresh generation, every answer
recomputed from the story's own words, reasoning that grows with k (choice: two lengths per level),
splits that share no combination of steps, shortcut baselines under a bound, files that `psyrl data
check` accepts."""

import itertools
import re
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.data import data_check, demo_data_command
from psyrl.core.records import load_stimuliqa
from psyrl.core.text import normalize, token_f1
from psyrl.dataset.testbed import (
    ALL_EVENTS,
    EVENTS,
    FILES,
    FIRST,
    FORMS,
    KS,
    LATER,
    LEVELS,
    OPENERS,
    QUESTIONS,
    SWINGS,
    TASKS,
    TEST_PER_ANSWER,
    TRAIN_PER_ANSWER,
    generate,
    shortcut_baselines,
    write,
)

DATA = Path(__file__).resolve().parents[2] / "data"
SHIPPED = {
    "drift": DATA / "testbed",
    "swing": DATA / "testbed-swing",
    "choice": DATA / "testbed-choice",
}


@pytest.fixture(scope="module", params=TASKS)
def bed(request):
    return generate(request.param, 0)


def _bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in FILES}


def parse(stimuli: str) -> tuple[int, list[int | str]]:
    """(start level, what each event does: its shift or "swing") read back from the story's words
    alone."""
    sentences = [s + "." for s in stimuli.removesuffix(".").split(". ")]
    start = None
    for opener in OPENERS:
        found = re.fullmatch(re.escape(opener).replace(r"\{mood\}", r"(\w+)"), sentences[0])
        if found:
            start = LEVELS.index(found.group(1))
    assert start is not None, stimuli
    by_sentence = {e.sentence: "swing" if e.swing else e.shift for e in ALL_EVENTS}
    shifts = []
    for i, sentence in enumerate(sentences[1:]):
        connective = next(c for c in (FIRST if i == 0 else LATER) if sentence.startswith(c + " "))
        shifts.append(by_sentence[sentence[len(connective) + 1 : -1]])
    return start, shifts


def clamped(start: int, ops: list[int | str]) -> list[int]:
    """The running levels: a shift clamped to 0..6, a swing mirrored (level -> 6 - level)."""
    levels = [start]
    for op in ops:
        levels.append(6 - levels[-1] if op == "swing" else min(6, max(0, levels[-1] + op)))
    return levels[1:]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path, bed):
    write(bed, tmp_path / "a")
    write(generate(bed.task, 0), tmp_path / "b")
    write(generate(bed.task, 1), tmp_path / "c")
    a, b, c = _bytes(tmp_path / "a"), _bytes(tmp_path / "b"), _bytes(tmp_path / "c")
    assert a == b
    assert all(a[name] != c[name] for name in FILES if name.endswith(".jsonl"))


@pytest.mark.parametrize("task", TASKS)
def test_committed_files_equal_a_fresh_generation_and_pass_data_check(tmp_path, task):
    runner = CliRunner()
    result = runner.invoke(
        demo_data_command, ["--task", task, "--out", str(tmp_path), "--seed", "0"]
    )
    assert result.exit_code == 0, result.output
    assert f"wrote synthetic {task} testbed" in result.output
    fresh, shipped = _bytes(tmp_path), _bytes(SHIPPED[task])
    for name in FILES:
        assert shipped[name] == fresh[name], (
            f"{SHIPPED[task].relative_to(DATA.parent)}/{name} drifted: run `psyrl demo-data --task "
            f"{task} --out {SHIPPED[task].relative_to(DATA.parent)} --seed 0`"
        )
    checked = runner.invoke(data_check, [str(tmp_path / n) for n in FILES if n.endswith(".jsonl")])
    assert checked.exit_code == 0, checked.output
    assert checked.output.count("all valid") == len(FILES) - 1
    # small enough to commit
    assert sum(p.stat().st_size for p in SHIPPED[task].iterdir()) < 1_000_000
    readme = (SHIPPED[task] / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# A SYNTHETIC testbed") and "Shortcut baselines" in readme


def test_the_files_hold_the_splits_by_level(bed):
    shipped, task = SHIPPED[bed.task], bed.task
    train, test = load_stimuliqa(shipped / "train.jsonl"), load_stimuliqa(shipped / "test.jsonl")
    assert [r.id for r in train] == [r.id for r in bed.records("train")]
    assert [r.id for r in test] == [
        r.id for k in KS for r in load_stimuliqa(shipped / f"test-k{k}.jsonl")
    ]
    for k in KS:
        level = load_stimuliqa(shipped / f"test-k{k}.jsonl")
        assert {r.variable for r in level} == {f"{task}_k{k}"}
        assert all(r.id.startswith(f"testbed/{task}-k{k}/") for r in level)
        assert all(not r.dimension and not r.subdimension for r in level)
    assert '"subdimension"' not in (shipped / "train.jsonl").read_text(encoding="utf-8")


def test_every_answer_is_the_clamped_walk_of_the_storys_own_events(bed):
    swings = 0
    for item in bed.items:
        r = item.record
        start, ops = parse(r.stimuli)
        levels = clamped(start, ops)
        swings += "swing" in ops
        assert len(ops) == item.k and r.question in QUESTIONS, r.id
        assert r.answer == LEVELS[levels[-1]], r.id
        assert (start, tuple(levels)) == (item.start, item.levels), r.id
        # the reasoning walks the same levels: the start, then one level per event (terse: the
        # start and the answer; padded: the one step, then the answer again)
        named = [w for w in normalize(r.reasoning) if w in LEVELS]
        walk = {"short": levels, "full": levels, "terse": levels[-1:], "padded": levels * 2}
        assert named == [LEVELS[start]] + [LEVELS[lv] for lv in walk[item.form]], r.id
    # drift has no swing; in swing a fair share of the items has one (a fifth of the bank)
    assert swings == 0 if bed.task == "drift" else swings > 0.2 * len(bed.items)


def test_clamping_happens_at_every_step_and_a_swing_mirrors():
    # miserable, then -2 (stays miserable), then +1: sad; summing first would give miserable
    assert clamped(0, [-2, 1]) == [0, 1]
    assert [LEVELS[lv] for lv in clamped(5, [2, 2, -1])] == ["elated", "elated", "happy"]
    swung = clamped(1, ["swing", -1, "swing"])
    assert [LEVELS[lv] for lv in swung] == ["happy", "content", "uneasy"]
    assert clamped(3, ["swing"]) == [3]  # calm is its own mirror
    from psyrl.dataset.testbed import running_levels

    swing, minus_one = len(EVENTS), EVENTS.index(next(e for e in EVENTS if e.shift == -1))
    assert running_levels(1, [swing, minus_one, swing]) == [5, 4, 2]


def test_answers_are_balanced_and_reasoning_grows_with_k(bed):
    words = {}
    for k in KS:
        for split, per_answer in (("train", TRAIN_PER_ANSWER), ("test", TEST_PER_ANSWER)):
            counts = Counter(r.answer for r in bed.records(split, k))
            assert counts == dict.fromkeys(LEVELS, per_answer), (k, split)
        words[k] = [
            len(r.reasoning.split()) for r in bed.records("train", k) + bed.records("test", k)
        ]
    if (
        bed.task == "choice"
    ):  # two lengths per level: test_choice_has_two_reasoning_lengths_per_level
        return
    assert max(words[1]) < min(words[2]) and max(words[2]) < min(words[3]), words
    short = bed.records("train", 1)[0].reasoning
    assert re.fullmatch(r"[A-Z][a-z]+, then [^:]+: [a-z]+\.", short), short
    step = bed.records("train", 3)[0].reasoning
    assert re.fullmatch(r"[A-Z][a-z]+ to start\.( [A-Z][^:]*: [a-z]+\.){3}", step), step


def test_choice_has_two_reasoning_lengths_per_level():
    choice, swing = generate("choice", 0), generate("swing", 0)
    # swing's items, only the ids, the variable and the reasoning's form differ
    assert len(choice.items) == len(swing.items)
    for c, s in zip(choice.items, swing.items):
        assert c.record.id == s.record.id.replace("/swing-", "/choice-")
        assert c.record.variable == f"choice_k{c.k}" and s.form == FORMS[s.k][0]
        assert (c.record.stimuli, c.record.question, c.record.answer) == (
            s.record.stimuli,
            s.record.question,
            s.record.answer,
        )
        assert (c.k, c.split, c.start, c.events) == (s.k, s.split, s.start, s.events)
        if c.form == FORMS[c.k][0]:
            assert c.record.reasoning == s.record.reasoning
    words = {}
    for k in KS:
        for split in ("train", "test"):
            forms = Counter(i.form for i in choice.items if i.k == k and i.split == split)
            count = sum(forms.values())
            assert forms == {FORMS[k][0]: count - count // 2, FORMS[k][1]: count // 2}, (k, split)
        for form in FORMS[k]:
            words[form, k] = [
                len(i.record.reasoning.split()) for i in choice.items if (i.k, i.form) == (k, form)
            ]
    # at every level a short and a long form: padded k = 1 as long as a k = 3 walk, terse k > 1 as
    # short as the k = 1 step
    assert (
        max(words["short", 1])
        < min(words["terse", 2])
        <= max(words["terse", 3])
        < min(words["full", 2])
    )
    assert max(words["full", 3]) < min(words["padded", 1])
    first = {i.form: i.record.reasoning for i in choice.items if i.k == 1}
    assert re.fullmatch(
        r"[A-Z][a-z]+ to start\. [A-Z][^:]*: ([a-z]+)\. "
        r"Nothing else happens, so at the end I still feel: \1\.",
        first["padded"],
    ), first["padded"]
    terse = next(i.record.reasoning for i in choice.items if i.form == "terse")
    assert re.fullmatch(r"[A-Z][a-z]+ to start; at the end: [a-z]+\.", terse), terse


def test_a_form_that_its_level_does_not_have_is_refused():
    from psyrl.dataset.testbed import reasoning_text

    assert reasoning_text(3, [0], "padded").endswith("at the end I still feel: happy.")
    with pytest.raises(ValueError, match="no 'terse' reasoning for 1 events"):
        reasoning_text(3, [0], "terse")
    with pytest.raises(ValueError, match="no 'padded' reasoning for 2 events"):
        reasoning_text(3, [0, 1], "padded")


def test_train_and_test_share_no_combination_of_steps_and_no_story(bed):
    for k in KS:
        # k = 1: no (start, event); k > 1: no (start, shift-or-swing sequence), so that a held-out
        # item cannot be answered from a memorised table of seen step sequences
        combos = {
            split: {
                (i.start, *(i.events if k == 1 else parse(i.record.stimuli)[1]))
                for i in bed.items
                if i.k == k and i.split == split
            }
            for split in ("train", "test")
        }
        assert combos["train"] and combos["test"] and not combos["train"] & combos["test"], k
    stories = [i.record.stimuli for i in bed.items]
    ids = [i.record.id for i in bed.items]
    assert len(set(stories)) == len(stories) and len(set(ids)) == len(ids)
    # every (level, event) step a test story takes is taught somewhere in training
    taught = {
        (lv, e)
        for i in bed.items
        if i.split == "train"
        for lv, e in zip((i.start, *i.levels), i.events)
    }
    for i in bed.items:
        if i.split == "test":
            assert set(zip((i.start, *i.levels), i.events)) <= taught, i.record.id


def test_no_shortcut_gives_the_answer_for_more_than_one_event(bed):
    baselines = shortcut_baselines(bed.items)
    for k in KS:
        assert baselines[k]["majority"] == pytest.approx(1 / len(LEVELS))
    assert baselines[1]["start + last event"] == 1.0  # k = 1: the whole item; the tables work
    for k in (2, 3):
        for name in ("start only", "last event only"):
            assert baselines[k][name] < 0.35, (k, name, baselines[k])
        assert max(baselines[k].values()) < 0.55, (k, baselines[k])


def test_mood_words_are_distinct_single_tokens_for_f1_and_appear_only_as_moods():
    sets = [frozenset(normalize(w)) for w in LEVELS]
    assert all(len(s) == 1 for s in sets) and len(set(sets)) == len(LEVELS)
    for a, b in itertools.product(LEVELS, repeat=2):
        assert token_f1(a, b) == float(a == b)
    templates = [e.sentence for e in ALL_EVENTS] + [e.gist for e in ALL_EVENTS]
    templates += [o.replace("{mood}", "") for o in OPENERS] + list(FIRST + LATER + QUESTIONS)
    for text in templates:
        assert not set(normalize(text)) & set(LEVELS), text
    assert len({e.sentence for e in ALL_EVENTS}) == len({e.gist for e in ALL_EVENTS})
    assert len({e.gist for e in ALL_EVENTS}) == len(EVENTS) + len(SWINGS)


def test_the_tiny_tokenizer_encodes_every_text_without_an_unknown_token(bed):
    from psyrl.core.config import ModelConfig
    from psyrl.runtime.model import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(tokenizer="tiny"))
    assert tokenizer.unk_token_id is None  # byte-level BPE: every byte has a token
    texts = {
        t for i in bed.items for t in (i.record.stimuli, i.record.question, i.record.reasoning)
    }
    for text in sorted(texts)[:300] + [" ".join(LEVELS)]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    # the answers differ in their first token, with and without a leading space
    for prefix in ("", " "):
        firsts = [tokenizer.tokenize(prefix + w)[0] for w in LEVELS]
        assert len(set(firsts)) == len(LEVELS), firsts


def test_an_unknown_task_is_refused_with_the_known_ones(tmp_path):
    result = CliRunner().invoke(demo_data_command, ["--task", "appraisal", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "Invalid value for '--task'" in result.output and "'drift'" in result.output
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="unknown testbed task 'appraisal'"):
        generate("appraisal", 0)


def test_the_default_output_directory_follows_the_task(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(demo_data_command, ["--task", "drift", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "data" / "testbed").iterdir()) == sorted(FILES)
    assert not (tmp_path / "data" / "demo").exists()

"""psyrl.core.text: eq. 4-5 normalisation and token-set F1, answer extraction, option matching (SPEC
§2, §7)."""

import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psyrl.core.text import best_option, extract_answer, normalize, set_f1, think_text, token_f1


@pytest.mark.parametrize(
    "text, words",
    [
        ("Don't worry, I'm FINE!", ["don", "t", "worry", "i", "m", "fine"]),
        ("well-being", ["well", "being"]),
        ("  tabs\tand\nnewlines  ", ["tabs", "and", "newlines"]),
        ("$100 + 5% = ¥7", ["100", "5", "7"]),  # $ ¥ (Sc), + = (Sm), % (Po)
        # em dash Pd, curly quotes Pi/Pf
        ("Café — naïve “quoted” «x»", ["café", "naïve", "quoted", "x"]),
        ("ÉMOTION", ["émotion"]),
        ("", []),
        ("!!! ...", []),
        ("emoji😀joy", ["emoji", "joy"]),  # 😀 is So
    ],
)
def test_normalize_eq5(text, words):
    assert normalize(text) == words


def test_normalize_matches_unicodedata_on_every_assigned_code_point():
    # Reference: a character splits a word iff unicodedata puts it in a P* or S* category (SPEC §2),
    # or it is whitespace; every other character stays inside its word.
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        category = unicodedata.category(ch)
        if category == "Cn":
            continue
        words = normalize("a" + ch + "b")
        if category[0] in "PS" or ch.isspace():
            assert words == ["a", "b"], hex(cp)
        else:
            assert len(words) == 1, hex(cp)


@pytest.mark.parametrize(
    "response, answer",
    [
        ("<think>x</think> <answer> Joy </answer>", "Joy"),
        ("<answer>first</answer><answer>second</answer>", "second"),  # the last block wins
        # last block = last <answer> before the last </answer>
        ("<answer>a<answer>b</answer>", "b"),
        ("<think>hidden</think>visible", "visible"),  # no answer block: think blocks removed
        ("<think>a</think>x<think>b</think>y", "xy"),
        ("<think>never closed", "never closed"),  # no block to remove; the tag text goes
        ("<answer><think>x</think>y</answer>", "xy"),  # tags inside the answer are removed
        ("</answer> stray", "stray"),  # a close tag with no open tag is not a block
        ("<answer>unclosed", "unclosed"),
        ("plain text", "plain text"),
        ("", ""),
        ("<answer>   </answer>", ""),
    ],
)
def test_extract_answer(response, answer):
    assert extract_answer(response) == answer


def test_think_text_is_the_first_closed_block():
    assert think_text("<think>one</think><think>two</think>") == "one"
    assert think_text("pre <think> a b </think>") == " a b "
    assert think_text("<think>never closed") is None
    assert think_text("no think") is None
    assert think_text("</think><think>x</think>") == "x"


def test_token_f1_hand_values():
    # pred {the, cat, sat}, gold {the, cat, ran, away}: 2 shared; P = 2/3, R = 2/4;
    # F1 = 2 * (2/3) * (1/2) / (2/3 + 1/2) = (2/3) / (7/6) = 4/7
    assert token_f1("The cat sat.", "the cat ran away") == pytest.approx(4 / 7, abs=1e-15)
    # token SETS, not bags: {happy, joy} both sides -> 1.0 (SQuAD's bag F1 would give 0.8)
    assert token_f1("happy happy joy", "Happy, joy!") == 1.0
    # one shared token of 1 and 3: P = 1, R = 1/3, F1 = 2 * 1/3 / (4/3) = 0.5
    assert token_f1("sad", "very sad person") == 0.5


def test_token_f1_empty_rules():
    assert token_f1("", "") == 1.0  # both empty
    assert token_f1("!!!", "...") == 1.0  # both empty after normalisation
    assert token_f1("", "gold") == 0.0
    assert token_f1("pred", "") == 0.0
    assert token_f1("apple", "orange") == 0.0  # nothing shared


def test_best_option():
    options = ["She feels happy", "She feels sad", "He is angry"]
    # "happy" F1: option 0 {she, feels, happy} vs {happy}: 2*1/(3+1) = 0.5; option 1: 0; option 2: 0
    assert best_option("happy", options) == 0
    # "she feels" ties options 0 and 1 at 2*2/(2+3) = 0.8 -> E
    assert best_option("she feels", options) is None
    assert best_option("nothing matches", options) is None  # all zero -> E
    assert best_option("happy", ["happy", "Happy!"]) is None  # duplicate options -> E
    assert best_option("yes", ["Yes", "No"]) == 0
    with pytest.raises(ValueError):
        best_option("x", [])


def test_best_option_detects_equal_rationals_as_ties():
    # pred has 5 tokens. Option 0 {a}: 1 shared, F1 = 2*1/(5+1) = 1/3. Option 1 {a, b, v, w, x, y,
    # z}:
    # 2 shared, F1 = 2*2/(5+7) = 1/3. A tie -> E. Computed as 2PR/(P+R) in floats the two differ
    # (0.33333333333333337 vs 0.3333333333333333) and option 0 would wrongly win.
    assert set_f1({"a", "b", "c", "d", "e"}, {"a"}) == set_f1(
        {"a", "b", "c", "d", "e"}, {"a", "b", "v", "w", "x", "y", "z"}
    )
    assert best_option("a b c d e", ["a", "a b v w x y z"]) is None


words = st.lists(
    st.sampled_from(["joy", "sad", "fear", "the", "a", "Anger", "don't", "naïve", "😀", "x-y"]),
    max_size=8,
)


@given(words, words)
def test_f1_in_unit_interval_and_symmetric(a, b):
    x, y = " ".join(a), " ".join(b)
    assert 0.0 <= token_f1(x, y) <= 1.0
    assert token_f1(x, y) == token_f1(y, x)


@given(st.text(max_size=50))
def test_f1_of_text_with_itself_is_one(x):
    assert token_f1(x, x) == 1.0  # non-empty: F1 = 1; empty: the both-empty rule gives 1 too


@given(
    st.lists(st.frozensets(st.sampled_from("abcdef")), min_size=1, max_size=5),
    st.frozensets(st.sampled_from("abcdef")),
)
def test_best_option_is_a_strict_maximum(options, pred):
    texts = [" ".join(sorted(o)) for o in options]
    choice = best_option(" ".join(sorted(pred)), texts)
    scores = [set_f1(set(pred), set(o)) for o in options]
    if choice is None:
        assert max(scores) == 0.0 or scores.count(max(scores)) > 1
    else:
        assert scores[choice] > 0 and all(
            s < scores[choice] for i, s in enumerate(scores) if i != choice
        )

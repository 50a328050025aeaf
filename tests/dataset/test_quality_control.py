"""psyrl.dataset.quality_control: the leak rules and duplicate detection for generated QA pairs
(appendix B)."""

import pytest

from psyrl.dataset.catalogue import Variable
from psyrl.dataset.qa_pairs import QAPair
from psyrl.dataset.quality_control import (
    NEAR_DUPLICATE,
    duplicate_reasons,
    jaccard,
    leak_reason,
    names_code,
    question_stem,
    writes_number,
)

DISAP = Variable(
    "B_disap",
    "disappointment",
    0.0,
    3.0,
    "emotional reactions",
    "specific emotions",
    "disappointment",
)
ROLE = Variable("S_role", "the narrator's role", 1.0, 5.0, "self", "identity", "role")
AGENCY = Variable("S_agency", "sense of agency", 1.0, 5.0, "self", "agency", "agency")
MARATHON = (
    "I had trained for the city marathon for six months, and two days before the race it was "
    "cancelled because of a storm. I sat on my kitchen floor and could not stop thinking about all "
    "those early mornings."
)
STATION = "I waited 2 hours at the station for my sister, and she never came or called."
FRIEND = (
    "My best friend of twelve years forgot my birthday and posted photos from a party I was "
    "not invited to."
)
HOW_DISAPPOINTED = "How disappointed is the narrator after the race was cancelled?"
MC = "How does the narrator feel about the cancelled race?"


@pytest.mark.parametrize(
    "question, answer, stimulus, variable, value, expected",
    [
        pytest.param(
            "Why could the narrator not stop thinking about the early mornings?",
            "The marathon was cancelled after months of training",
            MARATHON,
            DISAP,
            3.0,
            None,
            id="kept",
        ),
        pytest.param(
            "How high is B_disap for the narrator?",
            "High",
            MARATHON,
            DISAP,
            3.0,
            "variable_code",
            id="code_in_question",
        ),
        pytest.param(
            "On the b-disap scale, how does the narrator feel about the race?",
            "Very let down",
            MARATHON,
            DISAP,
            3.0,
            "variable_code",
            id="code_lower_hyphen",
        ),
        pytest.param(
            "What is the **B\\_disap** rating of the narrator?",
            "Strong",
            MARATHON,
            DISAP,
            3.0,
            "variable_code",
            id="code_markdown_escaped",
        ),
        pytest.param(
            MC, "High B_disap", MARATHON, DISAP, 3.0, "variable_code", id="code_in_answer"
        ),
        pytest.param(
            "Which B_disap value of 3 fits the narrator?",
            "3",
            MARATHON,
            DISAP,
            3.0,
            "variable_code",
            id="code_fires_first",
        ),
        pytest.param(
            "What is the narrator's role in the cancelled race?",
            "A runner who trained for months",
            MARATHON,
            ROLE,
            4.0,
            None,
            id="possessive_is_not_code",
        ),
        pytest.param(
            "Given a disappointment level of 3, what made the narrator sit on the kitchen floor?",
            "The cancelled marathon",
            MARATHON,
            DISAP,
            3.0,
            "value_in_question",
            id="value_in_question",
        ),
        pytest.param(
            "With a disappointment of 3.0, why does the narrator sit on the floor?",
            "The cancelled marathon",
            MARATHON,
            DISAP,
            3.0,
            "value_in_question",
            id="value_with_decimal_zero",
        ),
        pytest.param(
            "After waiting 2 hours, how does the narrator feel about the sister?",
            "Let down and ignored",
            STATION,
            DISAP,
            2.0,
            None,
            id="value_also_in_stimulus",
        ),
        pytest.param(
            "After 12 years of friendship, why is the narrator hurt?",
            "Left out of the party",
            FRIEND,
            DISAP,
            2.0,
            None,
            id="twelve_is_not_two",
        ),
        pytest.param(
            "With agency at 2.5, what did the narrator decide to do?",
            "Keep training for next year",
            MARATHON,
            AGENCY,
            2.5,
            "value_in_question",
            id="fractional_value",
        ),
        pytest.param(
            "What did the narrator do in the 2 days before the race?",
            "Trained and waited",
            MARATHON,
            AGENCY,
            2.5,
            None,
            id="two_is_not_two_and_a_half",
        ),
        pytest.param(
            "Which of the 3 events upset the narrator most?",
            "The cancelled marathon",
            MARATHON,
            DISAP,
            None,
            None,
            id="no_value_for_comparison_sets",
        ),
        pytest.param(
            HOW_DISAPPOINTED, "2", MARATHON, DISAP, 2.0, "answer_is_value", id="bare_number"
        ),
        pytest.param(
            HOW_DISAPPOINTED, "Score: 2", MARATHON, DISAP, 2.0, "answer_is_value", id="score_label"
        ),
        pytest.param(
            HOW_DISAPPOINTED, "2/3", MARATHON, DISAP, 2.0, "answer_is_value", id="fraction"
        ),
        pytest.param(
            HOW_DISAPPOINTED, "2 out of 3", MARATHON, DISAP, 2.0, "answer_is_value", id="out_of"
        ),
        pytest.param(
            HOW_DISAPPOINTED,
            "It would be rated a level 2",
            MARATHON,
            DISAP,
            2.0,
            "answer_is_value",
            id="rating_sentence",
        ),
        pytest.param(
            HOW_DISAPPOINTED,
            "3",
            MARATHON,
            DISAP,
            None,
            "answer_is_value",
            id="number_without_value",
        ),
        pytest.param(
            "How long did the narrator wait at the station?",
            "2",
            STATION,
            DISAP,
            2.0,
            "answer_is_value",
            id="number_from_the_story",
        ),
        pytest.param(
            HOW_DISAPPOINTED, "2 (moderate)", MARATHON, DISAP, 2.0, None, id="number_with_a_word"
        ),
        pytest.param(
            "How long did the narrator wait at the station?",
            "2 hours",
            STATION,
            DISAP,
            2.0,
            None,
            id="number_with_unit",
        ),
        pytest.param(
            "Is the narrator disappointed or relieved that the marathon was cancelled?",
            "Disappointed",
            MARATHON,
            DISAP,
            3.0,
            "answer_in_question",
            id="answer_in_question",
        ),
        pytest.param(
            f"{MC} A) Relieved B) Disappointed C) Proud",
            "Disappointed",
            MARATHON,
            DISAP,
            3.0,
            None,
            id="answer_among_options",
        ),
        pytest.param(
            f"{MC}\nA) Relieved\nB) Disappointed",
            "B) Disappointed",
            MARATHON,
            DISAP,
            3.0,
            None,
            id="answer_among_options_on_lines",
        ),
        pytest.param(
            "Was the narrator disappointed that the race was cancelled? A) Disappointed B) Calm",
            "Disappointed",
            MARATHON,
            DISAP,
            3.0,
            "answer_in_question",
            id="answer_in_stem_and_options",
        ),
        pytest.param(
            "What emotion do people usually feel when plans fall through?",
            "Disappointment",
            MARATHON,
            DISAP,
            3.0,
            "ungrounded",
            id="ungrounded",
        ),
        pytest.param(
            "What emotion does the narrator most likely feel?",
            "Disappointment",
            MARATHON,
            DISAP,
            3.0,
            None,
            id="refers_to_the_narrator",
        ),
        pytest.param(
            "What emotion fits best?",
            "Disappointment about the storm",
            MARATHON,
            DISAP,
            3.0,
            None,
            id="answer_shares_a_story_word",
        ),
    ],
)
def test_leak_reason(question, answer, stimulus, variable, value, expected):
    assert leak_reason(QAPair(question, answer), stimulus, variable, value) == expected


def test_answer_is_value_with_range():
    assert (
        leak_reason(QAPair(HOW_DISAPPOINTED, "2 on a scale of 0 to 3"), MARATHON, DISAP, 2.0)
        == "answer_is_value"
    )


@pytest.mark.parametrize(
    "question, stem",
    [
        ("How does she feel? A) Sad B) Happy", "How does she feel?"),
        ("How does she feel?\nA) Sad\nB) Happy\nC) Calm", "How does she feel?"),
        ("How does she feel? (a) sad (b) happy", "How does she feel?"),
        ("How does she feel? a. sad b. happy", "How does she feel?"),
        ("How does she feel? A: sad B: happy", "How does she feel?"),
        ("Did she pick plan A. Then what?", "Did she pick plan A. Then what?"),
        ("Who wrote the note, e.g. her sister?", "Who wrote the note, e.g. her sister?"),
        ("How does she feel?", "How does she feel?"),
    ],
)
def test_question_stem(question, stem):
    assert question_stem(question) == stem


@pytest.mark.parametrize(
    "text, code, expected",
    [
        ("B_disap", "B_disap", True),
        ("the b-disap score", "B_disap", True),
        ("the B\\_disap score", "B_disap", True),
        ("B_DISAP", "B_disap", True),
        ("(B_disap).", "B_disap", True),
        ("B disap", "B_disap", False),
        ("B_disappointment", "B_disap", False),
        ("AB_disap", "B_disap", False),
        ("B2_disap", "B_disap", False),
        ("the narrator's role", "S_role", False),
        ("the S-role", "S_role", True),
        ("The anger rises", "anger", True),
        ("a dangerous road", "anger", False),
        ("S\\_role\\_self", "S_role_self", True),
        ("s-role-self", "S_role_self", True),
    ],
)
def test_names_code(text, code, expected):
    assert names_code(text, code) is expected


@pytest.mark.parametrize(
    "text, value, expected",
    [
        ("2", 2.0, True),
        ("level 2.0", 2.0, True),
        ("level 2.", 2.0, True),
        ("2/3", 2.0, True),
        ("3.00", 3.0, True),
        ("12", 2.0, False),
        ("20", 2.0, False),
        ("2.5", 2.0, False),
        ("0.2", 2.0, False),
        ("two", 2.0, False),
        ("2.5", 2.5, True),
        ("12.5", 2.5, False),
        ("2", 2.5, False),
        ("2.55", 2.5, False),
        ("0", 0.0, True),
        ("0.5", 0.0, False),
        ("10", 0.0, False),
    ],
)
def test_writes_number(text, value, expected):
    assert writes_number(text, value) is expected


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ({"a", "b"}, {"b", "c"}, 1 / 3),
        ({"a", "b"}, {"a", "b"}, 1.0),
        (set(), set(), 1.0),
        ({"a"}, set(), 0.0),
        ({"a", "b", "c", "d"}, {"a", "b", "c", "d", "e"}, 0.8),
        ({"a"}, {"b"}, 0.0),
    ],
)
def test_jaccard(a, b, expected):
    assert jaccard(a, b) == pytest.approx(expected)
    assert jaccard(b, a) == pytest.approx(expected)


# narrator upset cancelled marathon
UPSET = "Why was the narrator upset about the cancelled marathon?"
UPSET_RACE = "Why was the narrator upset about the cancelled marathon race?"  # + race: 4/5 = 0.8
# narrator upset cancelled: 3/4 = 0.75
UPSET_SO = "Why was the narrator so upset about what was cancelled?"


def test_exact_duplicates_within_a_group():
    items = [
        ("s1", "How does the narrator feel?"),
        ("s1", "how does the narrator FEEL"),
        ("s2", "How does the narrator feel?"),
        ("s1", "How does the narrator feel?"),
    ]
    assert duplicate_reasons(items) == [None, "duplicate", None, "duplicate"]


def test_near_duplicate_at_the_threshold():
    assert NEAR_DUPLICATE == 0.8
    assert duplicate_reasons([("s1", UPSET), ("s1", UPSET_RACE)]) == [None, "near_duplicate"]
    assert duplicate_reasons([("s1", UPSET), ("s1", UPSET_RACE)], threshold=0.81) == [None, None]
    assert duplicate_reasons([("s1", UPSET), ("s2", UPSET_RACE)]) == [None, None]


def test_below_threshold_kept():
    assert duplicate_reasons([("s1", UPSET), ("s1", UPSET_SO)]) == [None, None]
    assert duplicate_reasons([("s1", UPSET), ("s1", UPSET_SO)], threshold=0.75) == [
        None,
        "near_duplicate",
    ]


def test_stopwords_alone_make_a_near_duplicate():
    items = [("v", "How does the narrator feel?"), ("v", "How did the narrator feel?")]
    assert duplicate_reasons(items) == [None, "near_duplicate"]


def test_first_of_a_group_is_kept_in_generation_order():
    items = [("s1", UPSET_RACE), ("s1", UPSET), ("s1", UPSET_RACE)]
    assert duplicate_reasons(items) == [None, "near_duplicate", "duplicate"]
    assert duplicate_reasons([]) == []


@pytest.mark.parametrize(
    "question, value, expected",
    [
        ("On a scale of 0 to 3, how let down was the narrator after the race?", 3.0, None),
        ("On a scale of 0 to 3, how let down was the narrator after the race?", 0.0, None),
        ("Rated 0-3, how let down was the narrator after the race?", 3.0, None),
        ("The narrator's letdown is 3 out of 3; what caused it?", 3.0, "value_in_question"),
        ("The narrator's letdown is 3 out of 3; what caused it?", 2.0, None),
        ("How let down was the narrator?\nA) 0\nB) 1\nC) 2\nD) 3", 2.0, None),
    ],
)
def test_value_in_question_sets_the_scale_and_the_options_aside(question, value, expected):
    assert leak_reason(QAPair(question, "Deeply let down"), MARATHON, DISAP, value) == expected


def test_a_code_that_is_a_plain_word_is_not_a_leak():
    anger = Variable(
        "anger", "anger", 0.0, 3.0, "emotional reactions", "specific emotions", "anger"
    )
    pair = QAPair(
        "How much anger did the narrator feel when the race was cancelled?",
        "A burst of frustration",
    )
    assert leak_reason(pair, MARATHON, anger, 2.0) is None
    assert (
        leak_reason(pair, MARATHON, Variable("B_anger", *list(anger.__dict__.values())[1:]), 2.0)
        is None
    )
    leaky = QAPair("What is the narrator's B_anger?", "A burst of frustration")
    renamed = Variable("B_anger", *list(anger.__dict__.values())[1:])
    assert leak_reason(leaky, MARATHON, renamed, 2.0) == "variable_code"

"""psyrl.dataset.qa_pairs: reading generations of the appendix A.1 prompts (QA pairs, topic lists,
reasoning)."""

from collections import Counter

import pytest

from psyrl.dataset.qa_pairs import (
    MAX_TOPIC_WORDS,
    QAPair,
    Rejected,
    contains_words,
    parse_qa,
    parse_reasoning,
    parse_topics,
    topic_key,
)

Q = "How does the narrator feel after the marathon is cancelled?"
R = "Months of training were wasted by the storm."
PAIR = QAPair(Q, "Disappointed", R)
OPTIONS_Q = "How does the narrator feel?\nA) Relieved\nB) Disappointed\nC) Proud"
STORY = "I waited two hours at the station, and my sister never came."


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(f"Question: {Q}\nAnswer: Disappointed\nReason: {R}", PAIR, id="well_formed"),
        pytest.param(
            f"Question: {Q}\n\nAnswer: Disappointed\n\nReason: {R}\n", PAIR, id="blank_lines"
        ),
        pytest.param(f"question: {Q}\nANSWER: Disappointed\nreason: {R}", PAIR, id="any_case"),
        pytest.param(
            f"**Question:** {Q}\n**Answer:** Disappointed\n**Reason:** {R}",
            PAIR,
            id="bold_colon_inside",
        ),
        pytest.param(
            f"**Question**: {Q}\n**Answer**: Disappointed\n**Reason**: {R}",
            PAIR,
            id="bold_colon_outside",
        ),
        pytest.param(
            f"### Question: {Q}\nAnswer: Disappointed\nReason: {R}", PAIR, id="heading_first_label"
        ),
        pytest.param(
            f"1. Question: {Q}\nAnswer: Disappointed\nReason: {R}", PAIR, id="numbered_first_label"
        ),
        pytest.param(
            f"Question 1: {Q}\nAnswer 1: Disappointed\nReason 1: {R}", PAIR, id="label_numbers"
        ),
        pytest.param(
            f"Question\uff1a{Q}\nAnswer\uff1aDisappointed\nReason\uff1a{R}",
            PAIR,
            id="fullwidth_colon",
        ),
        pytest.param(
            f"Question: {Q}\nCorrect Answer: Disappointed\nExplanation: {R}",
            PAIR,
            id="correct_answer",
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: Disappointed\nReasoning: {R}", PAIR, id="reasoning_label"
        ),
        pytest.param(
            f"Sure! Here is the pair:\n\nQuestion: {Q}\nAnswer: Disappointed\nReason: {R}",
            PAIR,
            id="preamble",
        ),
        pytest.param(
            f"```\nQuestion: {Q}\nAnswer: Disappointed\nReason: {R}\n```", PAIR, id="code_fence"
        ),
        pytest.param(
            f"```text\nQuestion: {Q}\n```\n```\nAnswer: Disappointed\n```",
            QAPair(Q, "Disappointed"),
            id="two_fences",
        ),
        pytest.param(f"Question: {Q} Answer: Disappointed Reason: {R}", PAIR, id="one_line"),
        pytest.param(
            f"Question: {Q} **Answer:** Disappointed **Reason:** {R}", PAIR, id="one_line_bold"
        ),
        pytest.param(
            f"Question: {Q} Correct Answer: Disappointed Reason: {R}", PAIR, id="one_line_correct"
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: Disappointed", QAPair(Q, "Disappointed"), id="no_reason"
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: Disappointed\n\nI hope this question works well for your "
            "dataset!",
            QAPair(Q, "Disappointed"),
            id="chit_chat_after_answer",
        ),
        pytest.param(
            f"Question: {OPTIONS_Q}\nAnswer: B) Disappointed\nReason: {R}",
            QAPair(OPTIONS_Q, "B) Disappointed", R),
            id="options",
        ),
        pytest.param(f'Question: "{Q}"\nAnswer: "Disappointed"\nReason: {R}', PAIR, id="quoted"),
        pytest.param(
            f"Question: {Q}\nAnswer: 'Disappointed'\nReason: {R}", PAIR, id="single_quoted"
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: **Disappointed**\nReason: {R}", PAIR, id="bold_value"
        ),
        pytest.param(
            f"Question:\n{Q}\n\nAnswer:\nThe narrator feels\ndisappointed.\n\nReason: {R}",
            QAPair(Q, "The narrator feels disappointed.", R),
            id="values_on_next_lines",
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: Disappointed\nReason: {R}\nReason: Something else.",
            PAIR,
            id="repeated_reason_label",
        ),
        pytest.param(
            f"Stimuli: {STORY}\nQuestion: {Q}\nAnswer: Disappointed\nReason: {R}",
            PAIR,
            id="stimulus_ignored_for_qa",
        ),
    ],
)
def test_parse_qa_accepts(text, expected):
    assert parse_qa(text) == expected


def test_parse_qa_sign_off_after_reason():
    pair = parse_qa(
        f"Question: {Q}\nAnswer: Disappointed\nReason: {R}\n\nLet me know if you need another pair!"
    )
    assert (pair.question, pair.answer, pair.stimulus) == (Q, "Disappointed", "")
    assert pair.reason.split("\n\n")[0] == R


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"### Question: {Q}\n### Answer: Disappointed\n### Reason: {R}", id="heading"),
        pytest.param(f"1. Question: {Q}\n2. Answer: Disappointed\n3. Reason: {R}", id="numbered"),
        pytest.param(f"- Question: {Q}\n- Answer: Disappointed\n- Reason: {R}", id="bulleted"),
    ],
)
def test_parse_qa_marked_labels_after_the_first(text):
    assert parse_qa(text) == PAIR


@pytest.mark.parametrize("label", ["Explanation", "Reasoning"])
def test_parse_qa_one_line_reason_synonyms(label):
    assert parse_qa(f"Question: {Q} Answer: Disappointed {label}: {R}") == PAIR


@pytest.mark.parametrize(
    "text, reason",
    [
        pytest.param(
            "Sure! The narrator feels disappointed because the race was cancelled.",
            "no_question",
            id="prose",
        ),
        pytest.param(f"Q: {Q}\nA: Disappointed", "no_question", id="q_a_abbreviations"),
        pytest.param(f"Answer: Disappointed\nReason: {R}", "no_question", id="answer_only"),
        pytest.param(
            f"Question 1: {Q}\nAnswer: Disappointed\nQuestion 2: What was cancelled?\nAnswer: The "
            "marathon",
            "several_questions",
            id="numbered_pairs",
        ),
        pytest.param(
            f"Question: {Q}\nQuestion: Why?\nAnswer: Disappointed",
            "several_questions",
            id="two_questions",
        ),
        pytest.param(f"Question: {Q}\nReason: {R}", "no_answer", id="reason_only"),
        pytest.param(
            f"Question: {Q}\nThe answer is disappointed.", "no_answer", id="unlabelled_answer"
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: Disappointed\nCorrect Answer: Disappointed",
            "several_answers",
            id="answer_and_correct_answer",
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: B\nReason: {R}\nAnswer: C", "several_answers", id="two_answers"
        ),
        pytest.param(
            f"Answer: Disappointed\nQuestion: {Q}\nReason: {R}",
            "answer_before_question",
            id="swapped",
        ),
        pytest.param(
            f"Question:\n\nAnswer: Disappointed\nReason: {R}", "empty_question", id="empty_question"
        ),
        pytest.param(
            "**Question:** **\nAnswer: Disappointed", "empty_question", id="markdown_only_question"
        ),
        pytest.param(f"Question: {Q}\nAnswer:\nReason: {R}", "empty_answer", id="empty_answer"),
        pytest.param(f'Question: {Q}\nAnswer: ""', "empty_answer", id="empty_quotes_answer"),
        pytest.param(
            "Question: <Insert question here>\nAnswer: <Insert answer here>\n"
            "Reason: <Explain why the answer is correct>",
            "template_echo",
            id="whole_template",
        ),
        pytest.param(
            f"Question: {Q}\nAnswer: < insert answer here >",
            "template_echo",
            id="answer_placeholder",
        ),
    ],
)
def test_parse_qa_rejects(text, reason):
    with pytest.raises(Rejected) as e:
        parse_qa(text)
    assert e.value.reason == reason
    assert str(e.value) == reason


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(
            f"Stimuli: {STORY}\nQuestion: {Q}\nAnswer: Disappointed\nReason: {R}",
            QAPair(Q, "Disappointed", R, STORY),
            id="stimuli",
        ),
        pytest.param(
            f"**Stimulus:**\n{STORY}\n\n**Question:** {Q}\n**Answer:** Disappointed",
            QAPair(Q, "Disappointed", "", STORY),
            id="stimulus_bold_next_line",
        ),
        pytest.param(
            f"Here is a Stimuli based on (a broken promise):\n\nStory: {STORY}\n\nQuestion: {Q}\n"
            f"Answer: Disappointed\nReason: {R}",
            QAPair(Q, "Disappointed", R, STORY),
            id="story_preamble",
        ),
        pytest.param(
            f"Stimuli: {STORY}\n\nShe had promised.\nQuestion: {Q}\nAnswer: Disappointed",
            QAPair(Q, "Disappointed", "", f"{STORY}\n\nShe had promised."),
            id="two_paragraphs",
        ),
    ],
)
def test_parse_qa_with_stimulus(text, expected):
    assert parse_qa(text, want_stimulus=True) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"Question: {Q}\nAnswer: Disappointed\nReason: {R}", id="none"),
        pytest.param(
            f"Question: {Q}\nAnswer: Disappointed\nStimulus: {STORY}", id="after_question"
        ),
        pytest.param(f"Stimuli:\nQuestion: {Q}\nAnswer: Disappointed", id="empty"),
    ],
)
def test_parse_qa_no_stimulus(text):
    with pytest.raises(Rejected) as e:
        parse_qa(text, want_stimulus=True)
    assert e.value.reason == "no_stimulus"


@pytest.mark.parametrize(
    "text, topics, dropped",
    [
        pytest.param(
            "Sure! Here are some related topics:\n\n- Grief after losing a pet\n* Broken promises "
            "between friends\n\u2022 Moving to a new city\n+ Being passed over for a promotion",
            [
                "Grief after losing a pet",
                "Broken promises between friends",
                "Moving to a new city",
                "Being passed over for a promotion",
            ],
            {"header": 1},
            id="bulleted",
        ),
        pytest.param(
            "1. Loneliness in old age.\n2) Betrayal by a sibling\n(3) Public embarrassment\n"
            "10. Topic: Exam failure\nTopic 11: Losing a job",
            [
                "Loneliness in old age",
                "Betrayal by a sibling",
                "Public embarrassment",
                "Exam failure",
                "Losing a job",
            ],
            {},
            id="numbered",
        ),
        pytest.param(
            "Here are more topics:\n"
            '["grief", "jealousy in friendships", "a cancelled wedding"]\nEnjoy!',
            ["grief", "jealousy in friendships", "a cancelled wedding"],
            {"header": 1, "chatter": 1},
            id="json",
        ),
        pytest.param(
            '```json\n[\n  "grief",\n  "envy"\n]\n```', ["grief", "envy"], {}, id="json_fenced"
        ),
        pytest.param(
            "### Emotional topics:\n- Grief\n\n**Social topics**:\n- Rejection",
            ["Grief", "Rejection"],
            {"header": 2},
            id="headers",
        ),
        pytest.param(
            '1. **Grief and loss**\n2. __Envy__\n3. `Shame`\n4. "Guilt"',
            ["Grief and loss", "Envy", "Shame", "Guilt"],
            {},
            id="markdown",
        ),
        pytest.param(
            "- Here is a list of topics that relate to the idea of loss\n"
            "- the quiet grief of watching an old parent slowly forget your name",
            ["the quiet grief of watching an old parent slowly forget your name"],
            {"chatter": 1},
            id="chatter_line",
        ),
        pytest.param(
            "- grief\n- a long sentence about how every one of these topics relates to the loss of "
            "trust\n"
            "I hope these help!\nLet me know if you need more.\nWhat about envy?",
            ["grief"],
            {"too_long": 1, "chatter": 3},
            id="too_long_and_sign_offs",
        ),
        pytest.param(
            '["grief", "envy"]\n3. a cancelled wedding\n4. Envy',
            ["grief", "envy", "a cancelled wedding", "Envy"],
            {},
            id="json_echo_then_new_lines",
        ),
    ],
)
def test_parse_topics(text, topics, dropped):
    assert parse_topics(text) == (topics, Counter(dropped))


def test_max_topic_words_is_twelve():
    assert MAX_TOPIC_WORDS == 12
    assert parse_topics(" ".join(["word"] * 12)) == ([" ".join(["word"] * 12)], Counter())
    assert parse_topics(" ".join(["word"] * 13)) == ([], Counter(too_long=1))


@pytest.mark.parametrize(
    "text, topics, dropped",
    [
        pytest.param(
            "**Related topics:**\n- grief\n- envy",
            ["grief", "envy"],
            {"header": 1},
            id="bold_header",
        ),
        pytest.param(
            '[\n  "grief",\n  "envy",\n]', ["grief", "envy"], {}, id="json_trailing_comma"
        ),
        pytest.param(
            "1. **Workplace stress**: pressure from deadlines",
            ["Workplace stress: pressure from deadlines"],
            {},
            id="bold_term_with_description",
        ),
    ],
)
def test_parse_topics_markdown_and_loose_json(text, topics, dropped):
    assert parse_topics(text) == (topics, Counter(dropped))


@pytest.mark.parametrize(
    "topic, key",
    [
        ("Grief & Loss!", "grief loss"),
        ("  Work-place   STRESS ", "work place stress"),
        ("**Envy**", "envy"),
        ("A broken promise.", "a broken promise"),
        ("", ""),
    ],
)
def test_topic_key(topic, key):
    assert topic_key(topic) == key


@pytest.mark.parametrize(
    "text, answer, rationale",
    [
        pytest.param(
            "The narrator trained for months, so the cancellation wastes that effort.",
            "Disappointed",
            "The narrator trained for months, so the cancellation wastes that effort.",
            id="plain",
        ),
        pytest.param(
            "<think>The race was cancelled after months of training.</think>",
            "Disappointed",
            "The race was cancelled after months of training.",
            id="think_tags",
        ),
        pytest.param(
            "Reasoning: The race was cancelled.",
            "Disappointed",
            "The race was cancelled.",
            id="label",
        ),
        pytest.param(
            "**Step-by-step reasoning:**\n1. Months of training.\n2. The race is cancelled.",
            "Disappointed",
            "1. Months of training.\n2. The race is cancelled.",
            id="bold_step_label",
        ),
        pytest.param(
            "<think>\nReasoning process: Hopes were raised, then not met.\n</think>",
            "Disappointed",
            "Hopes were raised, then not met.",
            id="think_and_label",
        ),
        pytest.param(
            "```\nThe storm cancelled the race.\n```",
            "Disappointed",
            "The storm cancelled the race.",
            id="fence",
        ),
        pytest.param(
            "The narrator's annoyance grows with each delay.",
            "Mild annoyance",
            "The narrator's annoyance grows with each delay.",
            id="part_of_answer",
        ),
        pytest.param(
            "The mild weather did not ease the annoyance.",
            "Mild annoyance",
            "The mild weather did not ease the annoyance.",
            id="answer_words_apart",
        ),
        pytest.param(
            "Nothing here suggests danger.",
            "Anger",
            "Nothing here suggests danger.",
            id="substring_only",
        ),
    ],
)
def test_parse_reasoning_keeps(text, answer, rationale):
    assert parse_reasoning(text, answer) == rationale


@pytest.mark.parametrize(
    "text, answer, reason",
    [
        pytest.param(
            "<answer>Disappointed</answer>", "Disappointed", "answer_tag", id="answer_block"
        ),
        pytest.param(
            "The race was cancelled.</answer>", "Disappointed", "answer_tag", id="closing_tag"
        ),
        pytest.param("<answer></answer>", "Disappointed", "answer_tag", id="empty_answer_block"),
        pytest.param("", "Disappointed", "empty", id="nothing"),
        pytest.param("<think>\n</think>", "Disappointed", "empty", id="empty_think"),
        pytest.param("Reasoning:", "Disappointed", "empty", id="label_only"),
        pytest.param("```\n```", "Disappointed", "empty", id="empty_fence"),
        pytest.param(
            "So the narrator feels disappointed.", "Disappointed", "states_answer", id="single_word"
        ),
        pytest.param(
            "She feels MILD-annoyance, nothing more.",
            "mild annoyance",
            "states_answer",
            id="case_punct",
        ),
        pytest.param(
            "Hence: mild, annoyance.", "Mild annoyance", "states_answer", id="punctuation_between"
        ),
    ],
)
def test_parse_reasoning_rejects(text, answer, reason):
    with pytest.raises(Rejected) as e:
        parse_reasoning(text, answer)
    assert e.value.reason == reason


@pytest.mark.parametrize(
    "text, phrase, expected",
    [
        ("I felt so Relieved!", "relieved", True),
        ("She was unrelieved.", "relieved", False),
        ("mild, annoyance", "Mild annoyance", True),
        ("annoyance, mild", "Mild annoyance", False),
        ("I don't know", "don\u2019t", True),
        ("a b a b c", "a b c", True),
        ("anything", "", False),
        ("", "anger", False),
        ("!!!", "?", False),
    ],
)
def test_contains_words(text, phrase, expected):
    assert contains_words(text, phrase) is expected


def test_parse_qa_numbered_labels_on_one_line_and_an_unlabelled_explanation():
    assert parse_qa(f"1. Question: {Q} 2. Answer: Disappointed 3. Reason: {R}") == PAIR
    explained = parse_qa(
        f"Question: {OPTIONS_Q}\nAnswer: B) Disappointed\nThe narrator trained for months."
    )
    assert (explained.answer, explained.reason) == ("B) Disappointed", "")


@pytest.mark.parametrize(
    "rationale, answer, given",
    [
        ("Months of training vanished, so he is clearly disappointed.", "B) Disappointed", True),
        ("Months of training vanished overnight.", "B) Disappointed", False),
        ("No one came to the party, which hurts.", "No", False),
        ("She waited alone. The answer is no.", "No", True),
        ("Answer: yes", "Yes", True),
    ],
)
def test_parse_reasoning_states_answer_sets_option_letters_and_yes_no_apart(
    rationale, answer, given
):
    if given:
        with pytest.raises(Rejected, match="states_answer"):
            parse_reasoning(rationale, answer)
    else:
        assert parse_reasoning(rationale, answer) == rationale

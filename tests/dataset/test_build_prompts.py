"""The builder's four data-generation prompts of appendix A.1, filled (psyrl.dataset.prompts)."""

import pytest

from psyrl.core.records import StimuliRecord
from psyrl.dataset import prompts as build_prompts
from psyrl.dataset.catalogue import Variable

DISAP = Variable(
    "B_disap",
    "disappointment against expectations",
    0.0,
    3.0,
    "emotional reactions",
    "specific emotions",
    "disappointment",
)
DATASET_FILLED = (
    "You are an AI assistant that generates one question\u2013answer pair based on a short "
    "Stimuli. The question should assess the human-labeled psychological parameter B_disap "
    "(disappointment against expectations), with value range 0 to 3. Ensure that the question:\n"
    "\u2022 Directly relates to the Stimuli,\n"
    "\u2022 Evaluates the concept of disappointment,\n"
    "\u2022 Follows the exact format:\n"
    "Question: <Insert question here>\n"
    "Answer: <Insert answer here>\n"
    "Reason: <Explain why the answer is correct>\n"
    "Language should be clear, concise, and include plausible distractor options."
)


def test_dataset_prompt_is_the_papers_text_filled_then_the_stimulus_and_its_label():
    assert build_prompts.dataset_prompt(DISAP, "The trip was cancelled.", 2.0) == (
        DATASET_FILLED + "\n\nStimuli: The trip was cancelled.\nB_disap: 2"
    )
    assert build_prompts.dataset_prompt(DISAP, "x", 2.5).endswith("\nB_disap: 2.5")


def test_comparison_prompt_follows_the_dataset_prompt_it_refers_to():
    assert build_prompts.comparison_prompt(DISAP, "a failed exam") == (
        DATASET_FILLED
        + "\n\nGenerate a Stimuli based on (a failed exam), then generate the Q&A pair for "
        "psychological parameter B_disap (disappointment against expectations) in the same format "
        "as above."
    )
    # --dialogue two-turn: the same two texts as separate user turns, the filled dataset prompt
    # (no stimulus: turn 2 asks for one) first
    assert build_prompts.comparison_turns(DISAP, "a failed exam") == (
        DATASET_FILLED,
        "Generate a Stimuli based on (a failed exam), then generate the Q&A pair for "
        "psychological parameter B_disap (disappointment against expectations) in the same format "
        "as above.",
    )


def test_topic_prompt_puts_the_seeds_in_as_a_json_list():
    assert build_prompts.topic_prompt(["a broken promise", "a \u201cgift\u201d"]) == (
        "Refer to the following topics as conceptual anchors. Generate as many psychologically or "
        "contextually related topics as possible while preserving thematic coherence:\n"
        '["a broken promise", "a \u201cgift\u201d"]'
    )


def test_reasoning_prompt_fills_the_item_and_its_answer():
    record = StimuliRecord("r1", "My brother cancelled.", "How did I feel?", "let down")
    assert build_prompts.reasoning_prompt(record) == (
        "Given a psychological prompt, generate a step-by-step reasoning process only.\n"
        "\u2022 Do not output the final answer.\n"
        "\u2022 Do not include <think>or <answer>tags.\n"
        "\u2022 If it is a direct emotion prediction, use only a few words.\n"
        "\u2022 Generate reasoning for Stimuli: My brother cancelled.\nQuestion: How did I feel? "
        "with the expected answer let down."
    )


def test_fill_is_one_pass_and_names_a_missing_field():
    # a description holding a placeholder's spelling is written as is, not filled again
    odd = Variable(
        "X_y", "see [range]", 1.0, 5.0, "emotional reactions", "specific emotions", "[topic]"
    )
    assert "parameter X_y (see [range]), with value range 1 to 5" in build_prompts.dataset_prompt(
        odd, "s", 1.0
    )
    assert "the concept of [topic]," in build_prompts.dataset_prompt(odd, "s", 1.0)
    with pytest.raises(KeyError, match=r"\[topic\]"):
        build_prompts.fill(build_prompts.COMPARISON_PROMPT, column_name="a", description="b")

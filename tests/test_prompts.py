"""Appendix A.1 prompts rendered with the real Qwen2.5 chat template (SPEC §5)."""

import pytest

from psyrl import prompts
from psyrl.catalogue import Variable
from psyrl.config import ModelConfig, PromptConfig
from psyrl.data import BenchmarkRecord, StimuliRecord, load_benchmark
from psyrl.model import load_tokenizer

COT = (
    "A conversation between User and Assistant. The user provides a “Stimuli:”, and the Assistant reads it and "
    "answers the “Question:”. The Assistant first thinks about the reasoning process internally, then provides the "
    "answer to the user. The reasoning and answer are enclosed in the following tags:\n"
    "• Reasoning: <think> … </think>\n"
    "• Answer: <answer> … </answer>\n"
    "Example: <think> reasoning process here </think> <answer> answer here </answer>"
)
DIRECT = (
    "A conversation between User and Assistant. The user provides a “Stimuli:”, and the Assistant reads it and "
    "answers the “Question:”. The Assistant only provides the answer, enclosed as:\n"
    "• <answer> answer here </answer>"
)
SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
RECORD = StimuliRecord("s/1", "  I lost my keys again.\n", "How did I feel?", "annoyed", "B_ann",
                       "emotional reactions", "specific emotions", "keys lost")


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(ModelConfig(tokenizer="qwen2.5"))


def test_instructions_are_the_papers_words():
    assert prompts.INSTRUCTIONS == {"cot": COT, "direct": DIRECT}


def test_rendered_cot_prompt_is_pinned(qwen):
    expected = (SYSTEM + "<|im_start|>user\nStimuli:   I lost my keys again.\n\nQuestion: How did I feel? " + COT
                + "<|im_end|>\n<|im_start|>assistant\n")
    assert prompts.render(qwen, RECORD, PromptConfig()) == expected
    ids = prompts.prompt_ids(qwen, RECORD, PromptConfig())
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198]  # <|im_start|>system\n ... assistant\n
    assert qwen.decode(ids) == expected


def test_direct_mode_and_system_placement(qwen):
    direct = prompts.render(qwen, RECORD, PromptConfig(mode="direct"))
    assert direct.endswith("Question: How did I feel? " + DIRECT + "<|im_end|>\n<|im_start|>assistant\n")
    system = prompts.render(qwen, RECORD, PromptConfig(placement="system"))
    assert system == ("<|im_start|>system\n" + COT + "<|im_end|>\n<|im_start|>user\nStimuli:   I lost my keys "
                      "again.\n\nQuestion: How did I feel?<|im_end|>\n<|im_start|>assistant\n")


def test_options_appended_for_simpletom_and_socialiqa_only():
    item = BenchmarkRecord("x", "socialiqa", "", "Kai waved.", "Why?", ("to greet", "to leave"), 0, "to greet")
    with_options = "Stimuli: Kai waved.\nQuestion: Why?\nA. to greet\nB. to leave"
    assert prompts.content(item) == with_options
    assert prompts.content(BenchmarkRecord(**{**item.__dict__, "benchmark": "cosmosqa"})) == \
        "Stimuli: Kai waved.\nQuestion: Why?"
    assert prompts.content(BenchmarkRecord(**{**item.__dict__, "benchmark": "cosmosqa"}), "all") == with_options
    assert prompts.content(item, "none") == "Stimuli: Kai waved.\nQuestion: Why?"


@pytest.mark.parametrize("path", ["data/benchmarks/simpletom/test.jsonl", "data/benchmarks/socialiqa/dev.jsonl"])
def test_option_format_matches_the_shipped_question_with_options(path):
    for r in load_benchmark(path):
        assert prompts.question_with_options(r.question, r.options) == r.meta["question_with_options"]


# ---------------------------------------------------------------- data-generation prompts (psyrl build)
DISAP = Variable("B_disap", "disappointment against expectations", 0.0, 3.0, "emotional reactions",
                 "specific emotions", "disappointment")
DATASET_FILLED = (
    "You are an AI assistant that generates one question\u2013answer pair based on a short Stimuli. The question "
    "should assess the human-labeled psychological parameter B_disap (disappointment against expectations), with "
    "value range 0 to 3. Ensure that the question:\n"
    "\u2022 Directly relates to the Stimuli,\n"
    "\u2022 Evaluates the concept of disappointment,\n"
    "\u2022 Follows the exact format:\n"
    "Question: <Insert question here>\n"
    "Answer: <Insert answer here>\n"
    "Reason: <Explain why the answer is correct>\n"
    "Language should be clear, concise, and include plausible distractor options.")


def test_dataset_prompt_is_the_papers_text_filled_then_the_stimulus_and_its_label():
    assert prompts.dataset_prompt(DISAP, "The trip was cancelled.", 2.0) == (
        DATASET_FILLED + "\n\nStimuli: The trip was cancelled.\nB_disap: 2")
    assert prompts.dataset_prompt(DISAP, "x", 2.5).endswith("\nB_disap: 2.5")


def test_comparison_prompt_follows_the_dataset_prompt_it_refers_to():
    assert prompts.comparison_prompt(DISAP, "a failed exam") == (
        DATASET_FILLED + "\n\nGenerate a Stimuli based on (a failed exam), then generate the Q&A pair for "
        "psychological parameter B_disap (disappointment against expectations) in the same format as above.")


def test_topic_prompt_puts_the_seeds_in_as_a_json_list():
    assert prompts.topic_prompt(["a broken promise", "a \u201cgift\u201d"]) == (
        "Refer to the following topics as conceptual anchors. Generate as many psychologically or contextually "
        "related topics as possible while preserving thematic coherence:\n"
        '["a broken promise", "a \u201cgift\u201d"]')


def test_reasoning_prompt_fills_the_item_and_its_answer():
    record = StimuliRecord("r1", "My brother cancelled.", "How did I feel?", "let down")
    assert prompts.reasoning_prompt(record) == (
        "Given a psychological prompt, generate a step-by-step reasoning process only.\n"
        "\u2022 Do not output the final answer.\n"
        "\u2022 Do not include <think>or <answer>tags.\n"
        "\u2022 If it is a direct emotion prediction, use only a few words.\n"
        "\u2022 Generate reasoning for Stimuli: My brother cancelled.\nQuestion: How did I feel? with the expected "
        "answer let down.")


def test_fill_is_one_pass_and_names_a_missing_field():
    # a description holding a placeholder's spelling is written as is, not filled again
    odd = Variable("X_y", "see [range]", 1.0, 5.0, "emotional reactions", "specific emotions", "[topic]")
    assert "parameter X_y (see [range]), with value range 1 to 5" in prompts.dataset_prompt(odd, "s", 1.0)
    assert "the concept of [topic]," in prompts.dataset_prompt(odd, "s", 1.0)
    with pytest.raises(KeyError, match=r"\[topic\]"):
        prompts.fill(prompts.COMPARISON_PROMPT, column_name="a", description="b")

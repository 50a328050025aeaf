"""Appendix A.1 prompts rendered with the real Qwen2.5 chat template (SPEC §5)."""

import pytest

from psyrl.core import prompts
from psyrl.core.config import ModelConfig, PromptConfig
from psyrl.core.records import BenchmarkRecord, StimuliRecord, load_benchmark
from psyrl.runtime.model import load_tokenizer

COT = (
    "A conversation between User and Assistant. The user provides a “Stimuli:”, and the Assistant "
    "reads it and answers the “Question:”. The Assistant first thinks about the reasoning process "
    "internally, then provides the answer to the user. The reasoning and answer are enclosed in "
    "the following tags:\n• Reasoning: <think> … </think>\n"
    "• Answer: <answer> … </answer>\n"
    "Example: <think> reasoning process here </think> <answer> answer here </answer>"
)
DIRECT = (
    "A conversation between User and Assistant. The user provides a “Stimuli:”, and the Assistant "
    "reads it and answers the “Question:”. The Assistant only provides the answer, enclosed as:\n"
    "• <answer> answer here </answer>"
)
SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n"
)
RECORD = StimuliRecord(
    "s/1",
    "  I lost my keys again.\n",
    "How did I feel?",
    "annoyed",
    "B_ann",
    "emotional reactions",
    "specific emotions",
    "keys lost",
)


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(ModelConfig(tokenizer="qwen2.5"))


def test_instructions_are_the_papers_words():
    assert prompts.INSTRUCTIONS == {"cot": COT, "direct": DIRECT}


def test_rendered_cot_prompt_is_pinned(qwen):
    expected = (
        SYSTEM
        + "<|im_start|>user\nStimuli:   I lost my keys again.\n\nQuestion: How did I feel? "
        + COT
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompts.render(qwen, RECORD, PromptConfig()) == expected
    ids = prompts.prompt_ids(qwen, RECORD, PromptConfig())
    # <|im_start|>system\n ... assistant\n
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198]
    assert qwen.decode(ids) == expected


def test_direct_mode_and_system_placement(qwen):
    direct = prompts.render(qwen, RECORD, PromptConfig(mode="direct"))
    assert direct.endswith(
        "Question: How did I feel? " + DIRECT + "<|im_end|>\n<|im_start|>assistant\n"
    )
    system = prompts.render(qwen, RECORD, PromptConfig(placement="system"))
    assert system == (
        "<|im_start|>system\n" + COT + "<|im_end|>\n<|im_start|>user\nStimuli:   I lost my keys "
        "again.\n\nQuestion: How did I feel?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_options_appended_for_simpletom_and_socialiqa_only():
    item = BenchmarkRecord(
        "x", "socialiqa", "", "Kai waved.", "Why?", ("to greet", "to leave"), 0, "to greet"
    )
    with_options = "Stimuli: Kai waved.\nQuestion: Why?\nA. to greet\nB. to leave"
    assert prompts.content(item) == with_options
    assert (
        prompts.content(BenchmarkRecord(**{**item.__dict__, "benchmark": "cosmosqa"}))
        == "Stimuli: Kai waved.\nQuestion: Why?"
    )
    assert (
        prompts.content(BenchmarkRecord(**{**item.__dict__, "benchmark": "cosmosqa"}), "all")
        == with_options
    )
    assert prompts.content(item, "none") == "Stimuli: Kai waved.\nQuestion: Why?"


@pytest.mark.parametrize(
    "path", ["data/benchmarks/simpletom/test.jsonl", "data/benchmarks/socialiqa/dev.jsonl"]
)
def test_option_format_matches_the_shipped_question_with_options(path):
    for r in load_benchmark(path):
        assert (
            prompts.question_with_options(r.question, r.options) == r.meta["question_with_options"]
        )


# ------------------------------------------------------------ data-generation prompts (psyrl build)

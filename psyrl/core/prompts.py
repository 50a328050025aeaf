"""The answering prompts of appendix A.1 (SPEC §5): the content, the paper's instruction, the chat
template (the builder's four data-generation prompts are in `psyrl.dataset.prompts`).

The paper prints each instruction after `[content | trim]`, the format-prompt template of the stack
it ran on (EasyR1): the user turn is `Stimuli: <context>\\nQuestion: <question>`, a space, then the
instruction; no system message of our own (the chat template adds the model's default).
`prompt.placement = "system"` puts the instruction in the system message instead.
"""

from __future__ import annotations

from psyrl.core.config import PromptConfig
from psyrl.core.records import BenchmarkRecord, StimuliRecord

# Appendix A.1 word for word, with the paper's characters (curly quotes, bullets, ellipses); one
# line per printed line.
INSTRUCTIONS: dict[str, str] = {
    "cot": (
        "A conversation between User and Assistant. The user provides a \u201cStimuli:\u201d, and "
        "the Assistant reads it and answers the \u201cQuestion:\u201d. The Assistant first thinks "
        "about the reasoning process internally, then provides the answer to the user. The "
        "reasoning and answer are enclosed in the following tags:\n"
        "\u2022 Reasoning: <think> \u2026 </think>\n"
        "\u2022 Answer: <answer> \u2026 </answer>\n"
        "Example: <think> reasoning process here </think> <answer> answer here </answer>"
    ),
    "direct": (
        "A conversation between User and Assistant. The user provides a \u201cStimuli:\u201d, and "
        "the Assistant reads it and answers the \u201cQuestion:\u201d. The Assistant only provides "
        "the answer, enclosed as:\n\u2022 <answer> answer here </answer>"
    ),
}
# paper §4.1: "As SimpleToM and SocialIQa answers were difficult to connect to their questions, we
# appended them"
PAPER_OPTION_BENCHMARKS = ("simpletom", "socialiqa")
OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def question_with_options(question: str, options) -> str:
    """The question, then one `A. <option>` line per option (the format of
    `meta.question_with_options`)."""
    return "\n".join(
        [question] + [f"{OPTION_LETTERS[i]}. {option}" for i, option in enumerate(options)]
    )


def question_text(record: StimuliRecord | BenchmarkRecord, options: str = "paper") -> str:
    """The question as the prompt shows it: a benchmark's options appended per `prompt.options`
    (paper §4.1)."""
    if isinstance(record, BenchmarkRecord) and (
        options == "all" or (options == "paper" and record.benchmark in PAPER_OPTION_BENCHMARKS)
    ):
        return question_with_options(record.question, record.options)
    return record.question


def content(record: StimuliRecord | BenchmarkRecord, options: str = "paper") -> str:
    """`Stimuli: <context>\\nQuestion: <question>`, options appended per `prompt.options`, trimmed
    (A.1)."""
    context = record.stimuli if isinstance(record, StimuliRecord) else record.context
    return f"Stimuli: {context}\nQuestion: {question_text(record, options)}".strip()


def messages(record: StimuliRecord | BenchmarkRecord, cfg: PromptConfig) -> list[dict[str, str]]:
    """The chat turns before the model's answer."""
    instruction = INSTRUCTIONS[cfg.mode]
    text = content(record, cfg.options)
    if cfg.placement == "system":
        return [{"role": "system", "content": instruction}, {"role": "user", "content": text}]
    return [{"role": "user", "content": f"{text} {instruction}"}]


def render(tokenizer, record: StimuliRecord | BenchmarkRecord, cfg: PromptConfig) -> str:
    """The prompt string the model sees: the tokenizer's chat template with the generation
    prompt."""
    return tokenizer.apply_chat_template(
        messages(record, cfg), tokenize=False, add_generation_prompt=True
    )


def prompt_ids(tokenizer, record: StimuliRecord | BenchmarkRecord, cfg: PromptConfig) -> list[int]:
    """Token ids of `render(...)`; the special tokens of the template are parsed as single
    tokens."""
    return tokenizer(render(tokenizer, record, cfg), add_special_tokens=False)["input_ids"]

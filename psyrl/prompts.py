"""The prompts of appendix A.1 (SPEC §5): the content, the paper's instruction, the chat template; and the four
data-generation prompts the StimuliQA builder sends (`psyrl build`).

The paper prints each instruction after `[content | trim]`, the format-prompt template of the
stack it ran on (EasyR1): the user turn is `Stimuli: <context>\\nQuestion: <question>`, a space,
then the instruction; no system message of our own (the chat template adds the model's default).
`prompt.placement = "system"` puts the instruction in the system message instead.
"""

from __future__ import annotations

import json
import re

from psyrl.catalogue import number_text
from psyrl.config import PromptConfig
from psyrl.data import BenchmarkRecord, StimuliRecord

# Appendix A.1 word for word, with the paper's characters (curly quotes, bullets, ellipses); one line per printed line.
INSTRUCTIONS: dict[str, str] = {
    "cot": (
        "A conversation between User and Assistant. The user provides a \u201cStimuli:\u201d, and the Assistant "
        "reads it and answers the \u201cQuestion:\u201d. The Assistant first thinks about the reasoning process "
        "internally, then provides the answer to the user. The reasoning and answer are enclosed in the "
        "following tags:\n"
        "\u2022 Reasoning: <think> \u2026 </think>\n"
        "\u2022 Answer: <answer> \u2026 </answer>\n"
        "Example: <think> reasoning process here </think> <answer> answer here </answer>"
    ),
    "direct": (
        "A conversation between User and Assistant. The user provides a \u201cStimuli:\u201d, and the Assistant "
        "reads it and answers the \u201cQuestion:\u201d. The Assistant only provides the answer, enclosed as:\n"
        "\u2022 <answer> answer here </answer>"
    ),
}
# paper §4.1: "As SimpleToM and SocialIQa answers were difficult to connect to their questions, we appended them"
PAPER_OPTION_BENCHMARKS = ("simpletom", "socialiqa")
OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def question_with_options(question: str, options) -> str:
    """The question, then one `A. <option>` line per option (the format of `meta.question_with_options`)."""
    return "\n".join([question] + [f"{OPTION_LETTERS[i]}. {option}" for i, option in enumerate(options)])


def question_text(record: StimuliRecord | BenchmarkRecord, options: str = "paper") -> str:
    """The question as the prompt shows it: a benchmark's options appended per `prompt.options` (paper §4.1)."""
    if isinstance(record, BenchmarkRecord) and (
            options == "all" or (options == "paper" and record.benchmark in PAPER_OPTION_BENCHMARKS)):
        return question_with_options(record.question, record.options)
    return record.question


def content(record: StimuliRecord | BenchmarkRecord, options: str = "paper") -> str:
    """`Stimuli: <context>\\nQuestion: <question>`, options appended per `prompt.options`, trimmed (A.1)."""
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
    """The prompt string the model sees: the tokenizer's chat template with the generation prompt."""
    return tokenizer.apply_chat_template(messages(record, cfg), tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer, record: StimuliRecord | BenchmarkRecord, cfg: PromptConfig) -> list[int]:
    """Token ids of `render(...)`; the special tokens of the template are parsed as single tokens."""
    return tokenizer(render(tokenizer, record, cfg), add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- data generation (appendix A.1, `psyrl build`)
# Appendix A.1 word for word, one line per printed line; each is the whole user turn, no system message of our own.
TOPIC_PROMPT = (
    "Refer to the following topics as conceptual anchors. Generate as many psychologically or contextually related "
    "topics as possible while preserving thematic coherence:\n"
    '["sample topics"]'
)
DATASET_PROMPT = (
    "You are an AI assistant that generates one question\u2013answer pair based on a short Stimuli. The question "
    "should assess the human-labeled psychological parameter [column_name] ([description]), with value range "
    "[range]. Ensure that the question:\n"
    "\u2022 Directly relates to the Stimuli,\n"
    "\u2022 Evaluates the concept of [category],\n"
    "\u2022 Follows the exact format:\n"
    "Question: <Insert question here>\n"
    "Answer: <Insert answer here>\n"
    "Reason: <Explain why the answer is correct>\n"
    "Language should be clear, concise, and include plausible distractor options."
)
COMPARISON_PROMPT = (
    "Generate a Stimuli based on ([topic]), then generate the Q&A pair for psychological parameter [column_name] "
    "([description]) in the same format as above."
)
# "<think>or <answer>tags": the paper's spacing, kept as printed
REASONING_PROMPT = (
    "Given a psychological prompt, generate a step-by-step reasoning process only.\n"
    "\u2022 Do not output the final answer.\n"
    "\u2022 Do not include <think>or <answer>tags.\n"
    "\u2022 If it is a direct emotion prediction, use only a few words.\n"
    "\u2022 Generate reasoning for [QA] with the expected answer [Answer]."
)
_PLACEHOLDER = re.compile(r'\["sample topics"\]|\[(?:column_name|description|range|category|topic|QA|Answer)\]')


def fill(template: str, **fields: str) -> str:
    """The template with each `[name]` replaced by fields[name] (`["sample topics"]` by fields["topics"]), in one
    pass: a filled-in text that itself holds `[range]` stays as written."""
    def value(match: re.Match) -> str:
        name = "topics" if match.group(0).startswith('["') else match.group(0)[1:-1]
        if name not in fields:
            raise KeyError(f"the prompt needs [{name}]")
        return fields[name]
    return _PLACEHOLDER.sub(value, template)


def topic_prompt(seed_topics: list[str]) -> str:
    """The topic-generation prompt; its `["sample topics"]` placeholder is already a JSON list, so the seeds go in as
    one."""
    return fill(TOPIC_PROMPT, topics=json.dumps(list(seed_topics), ensure_ascii=False))


def dataset_prompt(variable, stimulus: str, value: float) -> str:
    """The dataset-generation prompt for one (stimulus, variable) with its annotated value. The printed prompt has no
    slot for either; psyrl appends them after a blank line as `Stimuli: <text>` and `<code>: <value>` (appendix B:
    the generator saw the annotated value, which is why the leak filter exists)."""
    return f"{_dataset_fields(variable)}\n\nStimuli: {stimulus}\n{variable.code}: {number_text(value)}"


def comparison_prompt(variable, topic: str) -> str:
    """The comparison-dataset prompt: "the same format as above" refers to the dataset-generation prompt, so both go
    in one user turn, that one first (LlamaQA/MistralQA, appendix B)."""
    return (f"{_dataset_fields(variable)}\n\n"
            + fill(COMPARISON_PROMPT, topic=topic, column_name=variable.code, description=variable.description))


def reasoning_prompt(record: StimuliRecord) -> str:
    """The reasoning-CoT prompt: [QA] is the item as the model will see it (`Stimuli: ...\\nQuestion: ...`),
    [Answer] its gold answer."""
    return fill(REASONING_PROMPT, QA=content(record), Answer=record.answer)


def _dataset_fields(variable) -> str:
    return fill(DATASET_PROMPT, column_name=variable.code, description=variable.description,
                range=variable.range_text, category=variable.category)

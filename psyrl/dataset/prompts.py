"""The four data-generation prompts of appendix A.1 that the StimuliQA builder sends (`psyrl
build`): topic expansion, QA pairs from a labelled stimulus, comparison sets, reasoning samples."""

from __future__ import annotations

import json
import re

from psyrl.core.prompts import content
from psyrl.core.records import StimuliRecord
from psyrl.dataset.catalogue import number_text

# appendix B's sizes, the defaults of `psyrl build topics` and `psyrl build reasoning`
PAPER_TOPICS = 200  # "expand them into up to 200 diverse topics each"
PAPER_REASONING = 500  # "500 short and 500 long reasoning samples"
SHORT_WORDS = 40  # psyrl's line between a short and a long rationale (the paper does not say)
# how `psyrl build comparison` sends the comparison prompt: one user turn after the dataset prompt,
# or a dialogue whose first exchange is the dataset prompt and the generator's reply
DIALOGUES = ("one-turn", "two-turn")

# Appendix A.1 word for word, one line per printed line; each is the whole user turn, no system
# message of our own.
TOPIC_PROMPT = (
    "Refer to the following topics as conceptual anchors. Generate as many psychologically or "
    "contextually related topics as possible while preserving thematic coherence:\n"
    '["sample topics"]'
)
DATASET_PROMPT = (
    "You are an AI assistant that generates one question\u2013answer pair based on a short "
    "Stimuli. The question should assess the human-labeled psychological parameter [column_name] "
    "([description]), with value range [range]. Ensure that the question:\n"
    "\u2022 Directly relates to the Stimuli,\n"
    "\u2022 Evaluates the concept of [category],\n"
    "\u2022 Follows the exact format:\n"
    "Question: <Insert question here>\n"
    "Answer: <Insert answer here>\n"
    "Reason: <Explain why the answer is correct>\n"
    "Language should be clear, concise, and include plausible distractor options."
)
COMPARISON_PROMPT = (
    "Generate a Stimuli based on ([topic]), then generate the Q&A pair for psychological parameter "
    "[column_name] ([description]) in the same format as above."
)
# "<think>or <answer>tags": the paper's spacing, kept as printed
REASONING_PROMPT = (
    "Given a psychological prompt, generate a step-by-step reasoning process only.\n"
    "\u2022 Do not output the final answer.\n"
    "\u2022 Do not include <think>or <answer>tags.\n"
    "\u2022 If it is a direct emotion prediction, use only a few words.\n"
    "\u2022 Generate reasoning for [QA] with the expected answer [Answer]."
)
_PLACEHOLDER = re.compile(
    r'\["sample topics"\]|\[(?:column_name|description|range|category|topic|QA|Answer)\]'
)


def fill(template: str, **fields: str) -> str:
    """The template with each `[name]` replaced by fields[name] (`["sample topics"]` by
    fields["topics"]), in one pass: a filled-in text that itself holds `[range]` stays as
    written."""

    def value(match: re.Match) -> str:
        name = "topics" if match.group(0).startswith('["') else match.group(0)[1:-1]
        if name not in fields:
            raise KeyError(f"the prompt needs [{name}]")
        return fields[name]

    return _PLACEHOLDER.sub(value, template)


def topic_prompt(seed_topics: list[str]) -> str:
    """The topic-generation prompt; its `["sample topics"]` placeholder is already a JSON list, so
    the seeds go in as one."""
    return fill(TOPIC_PROMPT, topics=json.dumps(list(seed_topics), ensure_ascii=False))


def dataset_prompt(variable, stimulus: str, value: float) -> str:
    """The dataset-generation prompt for one (stimulus, variable) with its annotated value. The
    printed prompt has no slot for either; psyrl appends them after a blank line as `Stimuli:
    <text>` and `<code>: <value>` (appendix B: the generator saw the annotated value, which is why
    the leak filter exists)."""
    return (
        f"{_dataset_fields(variable)}\n\nStimuli: {stimulus}\n{variable.code}: {number_text(value)}"
    )


def comparison_prompt(variable, topic: str) -> str:
    """The comparison-dataset prompt, one-turn form (`--dialogue one-turn`, the default): "the same
    format as above" refers to the dataset-generation prompt, so both go in one user turn, that one
    first (LlamaQA/MistralQA, appendix B)."""
    return "\n\n".join(comparison_turns(variable, topic))


def comparison_turns(variable, topic: str) -> tuple[str, str]:
    """The two user turns of the two-turn form (`--dialogue two-turn`, appendix B's "multi-turn
    dialogue generation"): the filled dataset-generation prompt, which has no stimulus here (the
    generator writes one in turn 2), then the comparison prompt. The assistant turn between them is
    the generator's own reply to turn 1, generated first (psyrl.dataset.builder)."""
    return _dataset_fields(variable), fill(
        COMPARISON_PROMPT, topic=topic, column_name=variable.code, description=variable.description
    )


def reasoning_prompt(record: StimuliRecord) -> str:
    """The reasoning-CoT prompt: [QA] is the item as the model will see it (`Stimuli:
    ...\\nQuestion: ...`), [Answer] its gold answer."""
    return fill(REASONING_PROMPT, QA=content(record), Answer=record.answer)


def _dataset_fields(variable) -> str:
    return fill(
        DATASET_PROMPT,
        column_name=variable.code,
        description=variable.description,
        range=variable.range_text,
        category=variable.category,
    )

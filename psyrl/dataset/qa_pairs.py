"""Reading what a generator wrote for the data-generation prompts (appendix A.1): QA pairs, topic
lists, reasoning.

Models drift from `Question: / Answer: / Reason:`; what is tolerated:
- labels in any case, in markdown (`**Question:**`, `### Answer:`), after a bullet or a number (`1.
  Question:`), `Correct Answer`, `Reasoning` and `Explanation` as synonyms, and labels run together
  on one line;
- text before the first label (a preamble) and after the reason (a sign-off), code fences, a missing
Reason;
- the answer is the text after its label, or the first paragraph below an empty label line (an
  unlabelled explanation or a sign-off after it is not part of it). Everything else is rejected with
  a counted reason: no_question, several_questions, no_answer, several_answers,
  answer_before_question, empty_question, empty_answer, template_echo (the prompt's placeholders
  repeated), and for comparison sets no_stimulus.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

from psyrl.core.text import normalize

_FIELDS = {
    "question": "question",
    "answer": "answer",
    "correct answer": "answer",
    "reason": "reason",
    "reasoning": "reason",
    "explanation": "reason",
    "stimuli": "stimulus",
    "stimulus": "stimulus",
    "story": "stimulus",
}
_LABEL_WORDS = "question|correct answer|answer|reasoning|reason|explanation|stimuli|stimulus|story"
# what may precede a label on its line: bullets, headings, numbers
_MARKER = r"[\s>#*_\-\u2022]*(?:\d+[.)]\s*)?"
_LABEL_LINE = re.compile(
    rf"^{_MARKER}[*_]*\s*(?P<label>{_LABEL_WORDS})(?:\s*\d+)?"
    r"\s*[*_]*\s*[:\uff1a]\s*[*_]*\s*(?P<rest>.*)$",
    re.IGNORECASE,
)
_LEADING_MARKER = re.compile(_MARKER)
# a label run into the previous text ("...? Answer: Anger Reason: ...", "...? 2. Answer: ..."):
# exact capitals only, so prose is left alone
_INLINE_LABEL = re.compile(
    r"(?<=\S)(?<!Correct)(?<!\s\d[.)])[ \t]+(?=(?:\d+[.)]\s*)?(?:\*\*|__)?(?:Question|"
    r"Correct Answer|Answer|Reasoning|Reason|Explanation|Stimuli|Stimulus)(?:\*\*|__)?\s*:)"
)
_TEMPLATE = re.compile(
    r"<\s*(?:Insert (?:question|answer) here|Explain why the answer is correct)\s*>", re.I
)
MAX_TOPIC_WORDS = 12  # a longer line is a sentence about topics, not a topic


class Rejected(ValueError):
    """A generation that cannot be used; `reason` is the report's counter name."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class QAPair:
    question: str
    answer: str
    reason: str = ""
    stimulus: str = ""
    """Comparison sets only: the stimulus the generator wrote from its topic."""


def _fields(text: str) -> list[tuple[str, list[str]]]:
    """(field, lines) for every label in order; text before the first label is dropped."""
    fields: list[tuple[str, list[str]]] = []
    lines = []
    for raw in text.splitlines():
        # "2. Answer:" stays one label; only what follows is split
        marker = _LEADING_MARKER.match(raw).end()
        lines += (raw[:marker] + _INLINE_LABEL.sub("\n", raw[marker:])).split("\n")
    for line in lines:
        if line.strip().startswith("```"):
            continue
        match = _LABEL_LINE.match(line)
        if match:
            fields.append((_FIELDS[match["label"].lower()], [match["rest"]]))
        elif fields:
            fields[-1][1].append(line)
    return fields


def _clean(lines: list[str], answer: bool = False) -> str:
    """A field's text; an answer is its label's line, or when that is empty its first paragraph:
    unlabelled lines after it are an explanation or a sign-off, not the answer."""
    text = "\n".join(lines).strip()
    if answer:
        text = lines[0].strip() or " ".join(re.split(r"\n\s*\n", text, maxsplit=1)[0].split())
    text = text.strip().strip("*_`").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def parse_qa(text: str, want_stimulus: bool = False) -> QAPair:
    """The QA pair in a generation of the dataset-generation prompt (or, with `want_stimulus`, of
    the comparison prompt, which also writes the stimulus); raises Rejected."""
    fields = _fields(text)
    names = [name for name, _ in fields]
    if "question" not in names:
        raise Rejected("no_question")
    if names.count("question") > 1:
        raise Rejected("several_questions")
    if "answer" not in names:
        raise Rejected("no_answer")
    if names.count("answer") > 1:
        raise Rejected("several_answers")
    if names.index("answer") < names.index("question"):
        raise Rejected("answer_before_question")
    values = {}
    # the first of each (a repeated reason or stimulus label continues nothing)
    for name, lines in fields:
        values.setdefault(name, _clean(lines, answer=name == "answer"))
    stimulus = values.get("stimulus", "") if "stimulus" in names[: names.index("question")] else ""
    if want_stimulus and not stimulus:
        raise Rejected("no_stimulus")
    if not values["question"]:
        raise Rejected("empty_question")
    if not values["answer"]:
        raise Rejected("empty_answer")
    if any(_TEMPLATE.search(v) for v in (values["question"], values["answer"], stimulus)):
        raise Rejected("template_echo")
    return QAPair(
        values["question"],
        values["answer"],
        values.get("reason", ""),
        stimulus if want_stimulus else "",
    )


# ---------------------------------------------------------------- topics
_BULLET = re.compile(
    r"^[\s>#*_\-\u2022+]*(?:\(?\d+[.):]\s*)?(?:topic\s*\d*\s*[:.\-]\s*)?", re.IGNORECASE
)

_CHATTER = re.compile(
    r"^(?:sure|certainly|of course|here (?:are|is)|i hope|let me|these (?:topics|are)|feel free|"
    r"note)\b",
    re.IGNORECASE,
)


def parse_topics(text: str) -> tuple[list[str], Counter]:
    """The topics in a generation of the topic prompt: the items of a JSON list if it wrote one (the
    prompt shows its seeds as one) and one per line elsewhere, bullets, numbers and markdown
    removed. Returns (topics, rejected lines by reason: header for a line ending in a colon, chatter
    for a line that talks to the user (Sure, Here are, I hope, Let me, ... or ending in ! or ?),
    too_long above MAX_TOPIC_WORDS words)."""
    dropped: Counter = Counter()
    topics: list[str] = []
    lines: list[str] = []
    start, end = text.find("["), text.rfind("]")
    if 0 <= start < end:
        try:  # a trailing comma, as models often write, is tolerated
            items = json.loads(re.sub(r",\s*\]", "]", text[start : end + 1]))
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list) and items and all(isinstance(t, str) for t in items):
            # and the lines around it
            lines, text = list(items), text[:start] + "\n" + text[end + 1 :]
    for line in lines + text.splitlines():
        if line.strip().startswith("```") or not line.strip():
            continue
        topic = (
            _BULLET.sub("", re.sub(r"\*\*|__", "", line))
            .strip(" \t*_`\"'[")
            .rstrip(" \t*_`\"'.,;]")
        )
        if not topic:
            continue
        if topic.endswith(":"):
            dropped["header"] += 1
        elif _CHATTER.match(topic) or topic.endswith(("!", "?")):
            dropped["chatter"] += 1
        elif len(topic.split()) > MAX_TOPIC_WORDS:
            dropped["too_long"] += 1
        else:
            topics.append(topic)
    return topics, dropped


def topic_key(topic: str) -> str:
    """Two topics are the same when their normalised words are (case, punctuation and spacing
    aside)."""
    return " ".join(normalize(topic))


# ---------------------------------------------------------------- reasoning
_REASONING_LABEL = re.compile(
    r"^\s*[*_#]*\s*(?:step[- ]by[- ]step\s+)?reasoning(?:\s+process)?\s*[*_]*\s*:\s*[*_]*",
    re.IGNORECASE,
)


def parse_reasoning(text: str, answer: str) -> str:
    """The rationale in a generation of the reasoning-CoT prompt, which must not give the answer:
    raises Rejected (answer_tag when it wrote an <answer> tag, states_answer when it gives the
    answer (see `states_answer`), empty). <think> tags and a leading `Reasoning:` label are removed
    (the prompt forbids them; they are harmless)."""
    if "<answer>" in text or "</answer>" in text:
        raise Rejected("answer_tag")
    lines = [
        line
        for line in text.replace("<think>", "").replace("</think>", "").splitlines()
        if not line.strip().startswith("```")
    ]
    rationale = _REASONING_LABEL.sub("", "\n".join(lines).strip(), count=1).strip()
    if not rationale:
        raise Rejected("empty")
    if states_answer(rationale, answer):
        raise Rejected("states_answer")
    return rationale


_OPTION_LETTER = re.compile(r"^\s*\(?[A-Ea-e][).:]\s+")
_YES_NO = {"yes", "no", "true", "false"}


def states_answer(rationale: str, answer: str) -> bool:
    """Whether the rationale gives the answer: its words in a row (an option's letter aside: "B)
    Disappointed" is given by "...so he is disappointed"); a yes/no answer only by "answer is no" or
    "answer: no", since "no one" is not an answer."""
    answer = _OPTION_LETTER.sub("", answer)
    words = normalize(answer)
    if len(words) == 1 and words[0] in _YES_NO:
        return (
            re.search(rf"\banswer\s*(?:is|:)\s*\W*{words[0]}\b", rationale, re.IGNORECASE)
            is not None
        )
    return contains_words(rationale, answer)


def contains_words(text: str, phrase: str) -> bool:
    """Whether the normalised words of `phrase` occur in `text`'s, consecutively (eq. 5
    normalisation)."""
    needle, hay = normalize(phrase), normalize(text)
    if not needle:
        return False
    return any(hay[i : i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))

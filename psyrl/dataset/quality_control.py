"""Quality control of generated QA pairs (appendix B, "Dataset Construction and Quality Control").

The paper saw generators "rephrase the parameter into a question and return the annotated value as
the answer" and filtered such trivial pairs out; it does not print its rules. psyrl's, applied in
this order (the first that fires is the pair's reason). Words are eq. 5's normalised tokens; content
words are those outside STOPWORDS.
- variable_code: the question or the answer names the variable's code (`B_disap`, `b-disap`,
  markdown's `B\\_disap`); only for codes with `_` or a digit (a code that is a plain word, `anger`,
  may fairly appear in a question).
- value_in_question: the annotated value is written as a number in the question's stem and not in
  the stimulus (a number the story itself holds, "I waited 2 hours", is fair to ask about). The
  variable's scale as the prompt gave it ("on a scale of 0 to 3", "out of 3") is set aside first, or
  extreme labels would be dropped for naming it.
- answer_is_value: the answer is only numbers once rating words (score, level, out of, ...) are set
  aside: "2", "Score: 2", "2/3". A number is never an answer that needed the story.
- answer_in_question: every content word of the answer is in the question's stem (the question
  before its options: the prompt asks for distractor options, so the answer may be among them).
- ungrounded: the stem and the answer share no content word with the stimulus and the stem refers to
  no story, narrator or person (REFERENCE_WORDS): a generic question one answers without reading the
  stimulus. Duplicates, among the pairs that pass, in generation order (the first is kept):
- duplicate: the same words as an earlier pair of the same group;
- near_duplicate: content-word Jaccard similarity >= the threshold with an earlier pair of the same
  group. A group is a stimulus for labelled tables (compare questions) and a variable for comparison
  sets (compare stimulus and question: the generator wrote both).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from psyrl.core.text import normalize
from psyrl.dataset.catalogue import Variable, number_text
from psyrl.dataset.qa_pairs import QAPair

NEAR_DUPLICATE = 0.8  # default Jaccard threshold
STOPWORDS = frozenset(
    "a an the and or but if of to in on at by for with about from into onto over under after "
    "before as is are was were be been being am do does did doing has have had having i me my mine "
    "myself you your yours yourself he him his himself she her hers herself it its itself we us "
    "our ours they them their theirs this that these those what which who whom whose when where "
    "why how there here than then so such very can could would should will shall may might must "
    "just also too only own same other some any each both all most more few s t d ll m re ve "
    "one".split()
)
REFERENCE_WORDS = frozenset(
    "stimuli stimulus story narrative narrator narrators speaker author writer scenario situation "
    "passage text described describes describe account i me my myself you your yourself he him his "
    "she her they them their person character".split()
)
RATING_WORDS = frozenset(
    "score scored rating rated rate level value out of on a the scale to from is it would be "
    "points point intensity degree approximately about around".split()
)
# a multiple-choice stem ends where the options start: "A)", "(b)", "C." or "d:" after a space or a
# line break
_OPTIONS = re.compile(r"(?:^|\s)\(?[A-Ea-e][).:]\s+\S")


def content_words(text: str) -> set[str]:
    return {w for w in normalize(text) if w not in STOPWORDS}


def question_stem(question: str) -> str:
    """The question without its answer options, when it lists at least two (A and B)."""
    marks = list(_OPTIONS.finditer(question))
    return question[: marks[0].start()] if len(marks) >= 2 else question


def names_code(text: str, code: str) -> bool:
    """Whether `text` writes the variable code, its `_` as `_`, `\\_` or `-`, in any case."""
    pattern = r"(?:\\?_|-)".join(re.escape(part) for part in code.split("_"))
    return re.search(rf"(?<![A-Za-z0-9]){pattern}(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


def writes_number(text: str, value: float) -> bool:
    """Whether `text` holds the number (2 matches "2" and "2.0", not "12", "2.5" or "20")."""
    number = re.escape(number_text(value))
    return re.search(rf"(?<![\d.]){number}(?:\.0+)?(?![\d])(?!\.\d)", text) is not None


def without_scale(text: str, variable: Variable) -> str:
    """`text` minus the variable's scale as a question states it ("on a scale of 0 to 3", "0-3",
    "out of 3"): the prompt gives the range, so a question may repeat it whatever the label is."""
    low, high = (re.escape(number_text(x)) for x in (variable.low, variable.high))
    return re.sub(
        rf"(?<![\d.]){low}\s*(?:to|-|\u2013|and)\s*{high}(?![\d])|(?:out of|/)\s*{high}(?![\d])",
        " ",
        text,
        flags=re.IGNORECASE,
    )


def code_like(code: str) -> bool:
    """A code with `_` or a digit (`B_disap`): a plain word (`anger`) is left to the other rules,
    since a question about anger may say so."""
    return "_" in code or any(c.isdigit() for c in code)


def leak_reason(pair: QAPair, stimulus: str, variable: Variable, value: float | None) -> str | None:
    """The first rule of the module doc that drops `pair`, or None to keep it. `value` is the
    annotated label (None for comparison sets, which have none)."""
    question, answer = pair.question, pair.answer
    if code_like(variable.code) and (
        names_code(question, variable.code) or names_code(answer, variable.code)
    ):
        return "variable_code"
    stem = question_stem(question)
    if (
        value is not None
        and writes_number(without_scale(stem, variable), value)
        and not writes_number(stimulus, value)
    ):
        return "value_in_question"
    rest = [w for w in normalize(answer) if w not in RATING_WORDS]
    if rest and all(w.isdigit() for w in rest):
        return "answer_is_value"
    stem_words, answer_words, story_words = (
        content_words(stem),
        content_words(answer),
        content_words(stimulus),
    )
    if answer_words and answer_words <= stem_words:
        return "answer_in_question"
    if not (stem_words | answer_words) & story_words and not set(normalize(stem)) & REFERENCE_WORDS:
        return "ungrounded"
    return None


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def duplicate_reasons(
    items: Sequence[tuple[str, str]], threshold: float = NEAR_DUPLICATE
) -> list[str | None]:
    """For each (group, text) in order: "duplicate" (same words as an earlier kept text of its
    group), "near_duplicate" (content-word Jaccard >= threshold with one), or None (kept)."""
    seen: dict[str, set[tuple[str, ...]]] = {}
    kept: dict[str, list[set[str]]] = {}
    reasons: list[str | None] = []
    for group, text in items:
        words = tuple(normalize(text))
        content = content_words(text)
        if words in seen.setdefault(group, set()):
            reasons.append("duplicate")
        elif any(jaccard(content, other) >= threshold for other in kept.setdefault(group, [])):
            reasons.append("near_duplicate")
        else:
            seen[group].add(words)
            kept[group].append(content)
            reasons.append(None)
    return reasons

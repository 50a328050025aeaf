"""Answer text: the format check, normalisation, extraction, token-set F1 and option matching (paper
eq. 4-6, SPEC §2, §7).

One definition shared by the rewards (training) and the evaluation, so a model is scored the same
way in both places.
"""

from __future__ import annotations

import regex

# Unicode punctuation (P*) and symbols (S*) become spaces: "don't" -> "don t" (SPEC §2, eq. 5).
_PUNCT_OR_SYMBOL = regex.compile(r"[\p{P}\p{S}]+")
_TAG = regex.compile(r"</?(?:think|answer)>")

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def format_reward(response: str, mode: str) -> float:
    """Eq. 6: 1.0 iff the response is exactly `<think>A</think><answer>B</answer>` (`cot`) or
    `<answer>B</answer>` (`direct`): each tag once, only whitespace outside, A and B non-empty."""
    if mode == "cot":
        blocks = [(THINK_OPEN, THINK_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE)]
    elif mode == "direct":
        if THINK_OPEN in response or THINK_CLOSE in response:
            return 0.0
        blocks = [(ANSWER_OPEN, ANSWER_CLOSE)]
    else:
        raise ValueError(f"unknown prompt mode {mode!r}: expected 'cot' or 'direct'")
    # two <answer> blocks: a known hack
    if any(response.count(tag) != 1 for block in blocks for tag in block):
        return 0.0
    rest = response
    for open_tag, close_tag in blocks:
        before, opened, rest = rest.partition(open_tag)
        content, closed, rest = rest.partition(close_tag)
        if before.strip() or not opened or not closed or not content.strip():
            return 0.0
    return 0.0 if rest.strip() else 1.0


def normalize(text: str) -> list[str]:
    """Eq. 5 normalisation: lowercase, punctuation/symbols to spaces, split on whitespace."""
    return _PUNCT_OR_SYMBOL.sub(" ", text.lower()).split()


def extract_answer(response: str) -> str:
    """The content of the last `<answer>...</answer>` block, else the response without its
    `<think>...</think>` blocks; leftover tag text is then removed (SPEC §2)."""
    close = response.rfind(ANSWER_CLOSE)
    open_ = response.rfind(ANSWER_OPEN, 0, close) if close >= 0 else -1
    if open_ >= 0:
        text = response[open_ + len(ANSWER_OPEN) : close]
    else:
        text = _without_think_blocks(response)
    return _TAG.sub("", text).strip()


def _without_think_blocks(text: str) -> str:
    """The text minus every `<think>...</think>` block, in one linear scan (a lazy regex is
    quadratic on a long unclosed `<think>`: 16 s for 700 kB)."""
    kept, pos = [], 0
    while (start := text.find(THINK_OPEN, pos)) >= 0:
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end < 0:
            break
        kept.append(text[pos:start])
        pos = end + len(THINK_CLOSE)
    kept.append(text[pos:])
    return "".join(kept)


def think_text(response: str) -> str | None:
    """The content of the first `<think>...</think>` block, or None when there is no closed
    block."""
    start = response.find(THINK_OPEN)
    if start < 0:
        return None
    end = response.find(THINK_CLOSE, start + len(THINK_OPEN))
    if end < 0:
        return None
    return response[start + len(THINK_OPEN) : end]


def set_f1(pred: set[str] | frozenset[str], gold: set[str] | frozenset[str]) -> float:
    """Eq. 4-5 on token sets. Both empty -> 1.0, one empty or nothing shared -> 0.0."""
    if not pred and not gold:
        return 1.0
    common = len(pred & gold)
    if common == 0:
        return 0.0
    # 2PR/(P+R) with P = c/|pred|, R = c/|gold| is 2c/(|pred|+|gold|): one rounding, so equal
    # rational scores are equal floats and option ties (SPEC §7) are detected exactly.
    return 2.0 * common / (len(pred) + len(gold))


def token_f1(pred: str, gold: str) -> float:
    """Token-set F1 between two texts (eq. 4-5): `set_f1` of their normalised token sets."""
    return set_f1(set(normalize(pred)), set(normalize(gold)))


def option_scores(pred: str, options) -> list[float]:
    """Token-set F1 (eq. 4-5) of `pred` to each option, in option order."""
    pred_set = set(normalize(pred))
    return [set_f1(pred_set, set(normalize(option))) for option in options]


def choice_of(scores) -> int | None:
    """SPEC §7 F1-accuracy's choice from the option scores: the single best option; None (the
    paper's "E", not applicable) when the top score is shared by several options (duplicate options
    included) or is 0."""
    scores = list(scores)
    top = max(scores)
    return None if top == 0.0 or scores.count(top) > 1 else scores.index(top)


def best_option(pred: str, options) -> int | None:
    """Index of the option with the highest F1 to `pred`, or None (E):
    `choice_of(option_scores(pred, options))`."""
    if not options:
        raise ValueError("best_option needs at least one option")
    return choice_of(option_scores(pred, options))

"""A reward plug-in for psyrl (`reward.custom = "examples/exact_match.py:exact_match"` with
`reward.accuracy = "custom"`): 1 when the
answer the response gives (its last <answer>...</answer>, else the text outside <think>) equals the
gold answer once case, punctuation and spacing are ignored, else 0. It replaces the paper's token F1
in the final reward, the trajectory cache's r-bar_F1 and the bilateral bonus; the extra component it
returns is logged as reward/answered, the paper's F1 as reward/accuracy/f1.

    python train_tgrpo.py --config configs/tgrpo/tiny.toml \\
        --set reward.custom='"examples/exact_match.py:exact_match"' --set reward.accuracy=custom
"""

from psyrl.core.text import extract_answer, normalize


def exact_match(responses: list[str], golds: list[str], records: list):
    """(one score in [0, 1] per response, {name: one value per response}); `records` are the
    StimuliQA or benchmark records the responses answer (unused here)."""
    answers = [normalize(extract_answer(r)) for r in responses]
    scores = [float(a == normalize(g)) for a, g in zip(answers, golds)]
    return scores, {"answered": [float(bool(a)) for a in answers]}

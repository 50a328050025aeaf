"""A run's signals (psyrl.signals.build.Accuracy): each signal reads the answer extracted from the
response, the gold answer, and the record's stimulus (a benchmark item's context) and question
whole; the mix is the weighted sum, in [0, 1]."""

import pytest
import torch

from psyrl.core.config import Config, load_config
from psyrl.core.records import BenchmarkRecord, StimuliRecord
from psyrl.rl.accuracy import Pair, reward_accuracy
from psyrl.signals.build import Accuracy


class Capture:
    """A signal that keeps the pairs it is given and scores each 0.25."""

    name = "capture"

    def __init__(self):
        self.pairs = []

    def __call__(self, pairs):
        self.pairs += pairs
        return torch.full((len(pairs),), 0.25, dtype=torch.float64)


def test_each_signal_reads_the_stimulus_and_question_whole():
    accuracy = Accuracy(Config())
    capture = accuracy.built["capture"] = Capture()
    accuracy.names = ["f1", "capture"]
    story = StimuliRecord("s/0", "Tom's team lost the final.", "How does Tom feel?", "sad")
    item = BenchmarkRecord("b/0", "demo", "t", "A long context.", "Who?", ("a", "b"), 0, "a")
    scores = accuracy(
        ["<think>hm</think><answer>very sad</answer>", "b"], ["sad", "a"], [story, item]
    )
    assert capture.pairs == [
        Pair("sad", "very sad", "Tom's team lost the final.", "How does Tom feel?"),
        Pair("a", "b", "A long context.", "Who?"),
    ]
    assert scores.signals["f1"].tolist() == pytest.approx([2 / 3, 0.0])
    assert scores.signals["capture"].tolist() == [0.25, 0.25]
    assert torch.equal(scores.accuracy, scores.signals["f1"])  # reward.accuracy = "f1"


def test_the_mix_is_the_weighted_sum_clamped_to_one():
    cfg = load_config(
        None,
        [
            'reward.accuracy="mix"',
            'reward.mix=["f1", "semantic"]',
            "reward.mix_weights=[0.25, 0.75]",
        ],
    )
    signals = {
        "f1": torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64),
        "semantic": torch.tensor([0.4, 0.0, 1.0], dtype=torch.float64),
    }
    assert reward_accuracy(signals, cfg.reward).tolist() == pytest.approx([0.3, 0.25, 1.0])

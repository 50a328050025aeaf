"""Several held-out sets and n samples per item (issue 42 item 7): the unbiased pass@k estimator
and mean@n against hand-computed values, the config's refusals, and `validate` on scripted
responses (StimuliQA: correct = F1 1; benchmark: the right option)."""

import math

import pytest
import torch

from psyrl.core.config import ConfigError, ModelConfig, load_config
from psyrl.core.records import load_benchmark, load_stimuliqa
from psyrl.run.validation import mean_at_n, pass_at_k, validate
from psyrl.runtime.model import Policy, load_model, load_tokenizer
from psyrl.runtime.sampler import Completion


def product_form(n: int, c: int, k: int) -> float:
    """Chen et al. 2021's numerically stable form (their figure 3's numpy code):
    1 - prod_{i = n-c+1}^{n} (1 - k / i), or 1 when n - c < k."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_pass_at_k_hand_computed():
    # n = 4, c = 1, k = 4: every draw of 4 of 4 holds the correct one -> 1
    assert pass_at_k(4, 1, 4) == 1.0
    # n = 5, c = 0: nothing correct -> 0 for every k
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 0, 1) == 0.0
    # k = 1 is the fraction correct: 3 of 10 -> 0.3
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # n = 5, c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n = 6, c = 1, k = 3: 1 - C(5, 3) / C(6, 3) = 1 - 10/20 = 0.5
    assert pass_at_k(6, 1, 3) == pytest.approx(0.5)
    # k = n (what validation logs): 1 iff any sample is correct
    assert [pass_at_k(4, c, 4) for c in range(5)] == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_pass_at_k_equals_the_product_form():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(product_form(n, c, k), abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 5, 4), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(n, c, k)


def test_mean_at_n_hand_computed():
    # item means 0.5 and 0.5 -> 0.5
    assert mean_at_n(torch.tensor([[1.0, 0.0], [0.5, 0.5]])) == 0.5
    # item means 0.25 and 1 -> 0.625
    assert mean_at_n(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])) == 0.625
    # n = 1: the plain mean
    assert mean_at_n(torch.tensor([[0.2], [0.4], [0.9]])) == pytest.approx(0.5)


def test_config_refuses_two_valid_files_of_one_stem_naming_both():
    with pytest.raises(ConfigError) as refused:
        load_config(None, ['data.valid_files=["a/test.jsonl", "b/test.jsonl"]'])
    message = str(refused.value)
    assert "data.valid_files" in message
    assert "a/test.jsonl" in message and "b/test.jsonl" in message


@pytest.mark.parametrize(
    "override, words",
    [
        ('data.valid_files=["x/accuracy.jsonl"]', "accuracy"),
        ('data.valid_files=[""]', "empty string"),
        ("data.valid_samples=0", "expected >= 1"),
    ],
)
def test_config_refuses_bad_valid_keys(override, words):
    with pytest.raises(ConfigError, match=words):
        load_config(None, [override])


def test_defaults_are_the_papers_single_set():
    cfg = load_config(None)
    assert cfg.data.valid_files == [] and cfg.data.valid_samples == 1


class ScriptedSampler:
    """Answers each prompt's n samples with the next n scripted texts."""

    def __init__(self, texts):
        self.texts = list(texts)

    def generate(self, prompt_token_ids, n, temperature, top_p, max_new_tokens, seed):
        return [
            [Completion((1,) * (j + 1), self.texts.pop(0), "stop", (0.0,)) for j in range(n)]
            for _ in prompt_token_ids
        ]


@pytest.fixture(scope="module")
def policy_and_tokenizer():
    cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    tokenizer = load_tokenizer(cfg)
    return Policy(load_model(cfg, tokenizer, seed=0)), tokenizer


def test_n_samples_on_stimuliqa_log_mean_and_pass(policy_and_tokenizer):
    policy, tokenizer = policy_and_tokenizer
    records = load_stimuliqa("data/demo/test.jsonl")[:2]
    gold0, gold1 = records[0].answer, records[1].answer
    texts = [
        # item 0: a wrong first response, then the exact answer: F1 0, 1
        "<answer>zzz</answer>",
        f"<answer>{gold0}</answer>",
        # item 1: the answer plus one extra word, F1 2|A|/(2|A|+1) < 1 (not correct), then nothing
        f"<answer>{gold1} qqq</answer>",
        "zzz",
    ]
    cfg = load_config(None, ["data.valid_samples=2"])
    metrics, outputs = validate(policy, ScriptedSampler(texts), tokenizer, records, cfg)
    size1 = len(set(gold1.lower().split()))
    partial = 2 * size1 / (2 * size1 + 1)
    # the usual keys score each item's first response: (0 + partial) / 2
    assert metrics["valid/f1"] == pytest.approx(partial / 2)
    assert metrics["valid/items"] == 2 and metrics["valid/length"] == 1.0  # first: 1 token each
    # mean@2: item means (0 + 1)/2 and (partial + 0)/2
    assert metrics["valid/f1_mean@2"] == pytest.approx((0.5 + partial / 2) / 2)
    # pass@2: item 0 has c = 1 -> 1; item 1 has c = 0 -> 0
    assert metrics["valid/pass@2"] == 0.5
    assert "valid/accuracy_mean@2" not in metrics and "valid/loss" in metrics
    assert [s.text for s in outputs] == texts  # n per item, item-major


def test_n_samples_on_a_benchmark_log_accuracy_mean_and_pass(policy_and_tokenizer):
    policy, tokenizer = policy_and_tokenizer
    records = load_benchmark("data/benchmarks/simpletom/test.jsonl")[:2]
    right = [r.answer for r in records]
    wrong = [next(o for o in r.options if o != r.answer) for r in records]
    texts = [
        f"<answer>{right[0]}</answer>",  # item 0: right, right -> c = 2
        f"<answer>{right[0]}</answer>",
        f"<answer>{wrong[1]}</answer>",  # item 1: wrong, then E (no option matches) -> c = 0
        "<answer>zzz</answer>",
    ]
    cfg = load_config(None, ["data.valid_samples=2"])
    metrics, _ = validate(
        policy, ScriptedSampler(texts), tokenizer, records, cfg, prefix="valid/simpletom/"
    )
    assert all(k.startswith("valid/simpletom/") for k in metrics)
    # first responses: right, wrong -> 0.5; no E among them
    assert metrics["valid/simpletom/accuracy"] == 0.5
    assert metrics["valid/simpletom/not_applicable"] == 0.0
    # mean@2: item means 1 and 0
    assert metrics["valid/simpletom/accuracy_mean@2"] == 0.5
    assert metrics["valid/simpletom/pass@2"] == 0.5
    assert 0 <= metrics["valid/simpletom/f1_mean@2"] <= 1


def test_one_sample_logs_nothing_new(policy_and_tokenizer):
    policy, tokenizer = policy_and_tokenizer
    records = load_stimuliqa("data/demo/test.jsonl")[:2]
    texts = [f"<answer>{records[0].answer}</answer>", "zzz"]
    metrics, outputs = validate(
        policy, ScriptedSampler(texts), tokenizer, records, load_config(None)
    )
    # the paper's keys, in the order they were always logged
    assert list(metrics) == [
        "valid/reward",
        "valid/f1",
        "valid/format",
        "valid/length",
        "valid/items",
        "valid/loss",
    ]
    assert metrics["valid/f1"] == 0.5 and len(outputs) == 2

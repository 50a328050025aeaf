"""SFT examples: only response tokens carry loss; the loss does not depend on micro-batching."""

import pytest
import torch

from psyrl.core import prompts
from psyrl.core.config import ModelConfig, PromptConfig
from psyrl.core.records import StimuliRecord
from psyrl.runtime.model import collate, load_model, load_tokenizer, token_logprobs
from psyrl.sft.loss import build_examples, response_tokens, sft_loss

RECORDS = [
    StimuliRecord(
        f"s/{i}",
        f"My friend called me {i} times.",
        "How did I feel?",
        ans,
        "B_x",
        "emotional reactions",
        "specific emotions",
        reason,
    )
    for i, (ans, reason) in enumerate(
        [
            ("annoyed", "Too many calls."),
            ("loved", None),
            ("happy and relieved", "She cared about me a lot."),
        ]
    )
]


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(ModelConfig(tokenizer="qwen2.5"))


def test_loss_mask_covers_exactly_the_target_and_end_of_turn(qwen):
    examples, counts = build_examples(RECORDS, qwen, PromptConfig(), max_length=2048)
    assert counts == {"kept": 2, "no_reasoning": 1, "too_long": 0}
    input_ids, attention_mask, loss_mask = collate(
        [e.input_ids for e in examples], [e.prompt_len for e in examples], qwen.pad_token_id
    )
    for row, (example, record) in enumerate(zip(examples, [RECORDS[0], RECORDS[2]])):
        targets = input_ids[row, 1:][loss_mask[row]]
        assert (
            qwen.decode(targets)
            == f"<think>{record.reasoning}</think><answer>{record.answer}</answer><|im_end|>"
        )
        prompt_part = qwen.decode(input_ids[row, : example.prompt_len])
        assert prompt_part == prompts.render(qwen, record, PromptConfig())
        assert attention_mask[row].sum() == len(example.input_ids)
    assert loss_mask.sum() == response_tokens(examples)
    # right padding, no loss
    assert input_ids[0, len(examples[0].input_ids) :].eq(qwen.pad_token_id).all()


def test_direct_mode_and_length_limit(qwen):
    examples, counts = build_examples(RECORDS, qwen, PromptConfig(mode="direct"), max_length=2048)
    assert counts["kept"] == 3
    assert (
        qwen.decode(examples[1].input_ids[examples[1].prompt_len :])
        == "<answer>loved</answer><|im_end|>"
    )
    longest = max(len(e.input_ids) for e in examples)
    _, counts = build_examples(RECORDS, qwen, PromptConfig(mode="direct"), max_length=longest - 1)
    assert counts["too_long"] >= 1 and counts["kept"] + counts["too_long"] == 3


def test_cot_target_from_the_builders_reason(qwen):
    # data.think_from = "reason": the generator's Reason: line (psyrl build qa) is the think text
    record = StimuliRecord(
        "q/1",
        "My friend called me 3 times.",
        "How did I feel?",
        "loved",
        reason="Three calls show she cared.",
    )
    examples, counts = build_examples([record], qwen, PromptConfig(), 2048, think_from="reason")
    assert counts == {"kept": 1, "no_reasoning": 0, "too_long": 0}
    assert qwen.decode(examples[0].input_ids[examples[0].prompt_len :]) == (
        "<think>Three calls show she cared.</think><answer>loved</answer><|im_end|>"
    )
    assert qwen.decode(examples[0].input_ids[: examples[0].prompt_len]) == prompts.render(
        qwen, record, PromptConfig()
    )
    # the default think text is `reasoning`: the record has none, so it is skipped and counted
    _, counts = build_examples([record], qwen, PromptConfig(), 2048)
    assert counts == {"kept": 0, "no_reasoning": 1, "too_long": 0}
    # direct mode is unchanged whatever the think source
    for think_from in ("reasoning", "reason"):
        (direct,), _ = build_examples(
            [record], qwen, PromptConfig(mode="direct"), 2048, think_from=think_from
        )
        assert qwen.decode(direct.input_ids[direct.prompt_len :]) == (
            "<answer>loved</answer><|im_end|>"
        )


def test_sft_loss_hand_computed():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[False, True, True], [True, False, False]])
    # (2 + 3 + 0.5) / 4 response tokens of the whole step
    assert sft_loss(logp, mask, normalizer=4).item() == pytest.approx(5.5 / 4)


@pytest.mark.numerics
def test_gradient_does_not_depend_on_micro_batching(qwen):
    cfg = ModelConfig(
        tokenizer="qwen2.5",
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
    )
    model = load_model(cfg, qwen, seed=0)
    examples, _ = build_examples(RECORDS, qwen, PromptConfig(mode="direct"), max_length=2048)
    normalizer = response_tokens(examples)
    grads = []
    for micro in (1, 2, 3):
        model.zero_grad()
        for start in range(0, len(examples), micro):
            ids, mask, loss_mask = collate(
                [e.input_ids for e in examples[start : start + micro]],
                [e.prompt_len for e in examples[start : start + micro]],
                qwen.pad_token_id,
            )
            sft_loss(
                token_logprobs(model, ids, mask, 1.0, loss_mask), loss_mask, normalizer
            ).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[2], atol=1e-6, rtol=1e-5)

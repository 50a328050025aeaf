"""The torch sampler: greedy equals transformers' generate, log-probs equal the trainer's, exact
top-p, seeds per prompt, stop tokens, and the weight sync."""

import pytest
import torch
from transformers import GenerationConfig

from psyrl.core import prompts
from psyrl.core.config import ModelConfig, PromptConfig
from psyrl.core.records import load_stimuliqa
from psyrl.runtime.model import load_model, load_tokenizer, stop_token_ids, token_logprobs
from psyrl.runtime.sampler import (
    Completion,
    TorchSampler,
    draw,
    in_nucleus,
    inverse_cdf,
    nucleus_mask,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup():
    cfg = ModelConfig(
        tokenizer="tiny",
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
    )
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer, seed=0).eval()
    records = load_stimuliqa("data/demo/test.jsonl")[:5]
    ids = [prompts.prompt_ids(tokenizer, r, PromptConfig()) for r in records]
    ids[1] = ids[1][:-7]  # different lengths: left padding inside a batch
    return cfg, tokenizer, model, ids


def trainer_logprobs(model, prompt, sample: Completion, temperature: float) -> torch.Tensor:
    ids = torch.tensor([list(prompt) + list(sample.token_ids)])
    positions = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
    positions[0, len(prompt) - 1 :] = True
    return token_logprobs(model, ids, torch.ones_like(ids), temperature, positions)[positions]


def test_greedy_equals_transformers_generate_and_batching_changes_nothing(setup):
    _, tokenizer, model, ids = setup
    sampler = TorchSampler(model, tokenizer, CPU, batch=5)
    together = sampler.generate(ids, 1, 0.0, 1.0, 12, seed=0)
    one_by_one = [
        TorchSampler(model, tokenizer, CPU, batch=1).generate([p], 1, 0.0, 1.0, 12, seed=0)[0]
        for p in ids
    ]
    assert [g[0].token_ids for g in together] == [g[0].token_ids for g in one_by_one]
    config = GenerationConfig(
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=stop_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    for prompt, group in zip(ids, together):
        reference = model.generate(input_ids=torch.tensor([prompt]), generation_config=config)[
            0, len(prompt) :
        ]
        assert group[0].token_ids == tuple(reference.tolist())[: len(group[0].token_ids)]
        assert group[0].finish_reason == "length" and len(group[0].token_ids) == 12


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampler_logprobs_equal_the_trainers_at_the_same_temperature(setup, temperature):
    _, tokenizer, model, ids = setup
    groups = TorchSampler(model, tokenizer, CPU, batch=6).generate(
        ids, 3, temperature, 0.9, 10, seed=3
    )
    for prompt, group in zip(ids, groups):
        assert len(group) == 3
        for sample in group:
            gap = (
                (
                    trainer_logprobs(model, prompt, sample, temperature)
                    - torch.tensor(sample.logprobs)
                )
                .abs()
                .max()
            )
            assert gap < 1e-5  # float32, batched with left padding vs one unpadded row


def test_samples_depend_on_their_own_seed_only(setup):
    _, tokenizer, model, ids = setup
    sampler = TorchSampler(model, tokenizer, CPU, batch=15)
    together = sampler.generate(ids, 3, 1.0, 0.99, 8, seed=[10, 11, 12, 13, 14])
    alone = [
        TorchSampler(model, tokenizer, CPU, batch=3).generate([p], 3, 1.0, 0.99, 8, seed=[10 + i])[
            0
        ]
        for i, p in enumerate(ids)
    ]
    assert [[s.token_ids for s in g] for g in together] == [[s.token_ids for s in g] for g in alone]
    assert [[s.token_ids for s in g] for g in sampler.generate(ids, 3, 1.0, 0.99, 8, seed=10)] == [
        [s.token_ids for s in g] for g in together
    ]
    other = sampler.generate(ids, 3, 1.0, 0.99, 8, seed=99)
    assert [[s.token_ids for s in g] for g in other] != [[s.token_ids for s in g] for g in together]
    assert len({s.token_ids for s in together[0]}) > 1  # the G samples of a prompt differ


def reference_nucleus(row: list[float], top_p: float) -> set[int]:
    """Plain Python: a token is kept when the mass of the strictly more probable tokens is below
    top_p."""
    return {i for i, p in enumerate(row) if sum(q for q in row if q > p) < top_p}


def test_nucleus_matches_plain_python_including_ties():
    gen = torch.Generator().manual_seed(0)
    # flat to peaked rows
    logits = torch.randn(12, 300, generator=gen) * torch.linspace(0.5, 8.0, 12)[:, None]
    probs = torch.cat(
        [torch.softmax(logits, -1), torch.tensor([[0.4, 0.2, 0.2, 0.2] + [0.0] * 296])]
    )
    for top_p in (0.3, 0.5, 0.9, 0.99):
        mask = nucleus_mask(probs, top_p)
        for r, row in enumerate(probs.double().tolist()):
            assert set(mask[r].nonzero().flatten().tolist()) == reference_nucleus(row, top_p), (
                r,
                top_p,
            )
        # in_nucleus for every token of every row
        every = torch.arange(probs.shape[-1]).repeat(len(probs), 1)
        one_pass = torch.stack(
            [in_nucleus(probs, every[:, k], top_p) for k in range(probs.shape[-1])], dim=1
        )
        assert torch.equal(one_pass, mask)
    # the tied 0.2s all stay at the cut
    assert nucleus_mask(probs[-1:], 0.5)[0, :4].tolist() == [True] * 4
    assert nucleus_mask(probs, 1.0).all() and in_nucleus(probs, every[:, 7], 1.0).all()


def test_inverse_cdf_hits_each_token_with_its_probability():
    probs = torch.softmax(torch.randn(1, 1000, generator=torch.Generator().manual_seed(1)), -1)
    # an even grid of u: counts follow the CDF
    u = torch.linspace(0, 1, 200001, dtype=torch.float64)[:-1]
    # 1000 = 15 blocks of 64 + a 40-token tail
    tokens = inverse_cdf(probs.expand(len(u), -1), u, block=64)
    counts = torch.bincount(tokens, minlength=1000).double() / len(u)
    assert (counts - probs[0].double()).abs().max() < 2e-5
    zero = probs.clone()
    zero[0, 500:] = 0.0  # tokens of probability 0 are never drawn
    assert inverse_cdf(zero.expand(len(u), -1), u, block=64).max() < 500
    # a float32 block sum that rounds above its float64 cumulative sum must not land on a zero entry
    x = 1.5 * 2**-25
    p = torch.zeros(1, 512)
    p[0, 0], p[0, 1], p[0, 300] = 0.75, x, 0.25 - x
    sum32, sum64 = p[0, :256].sum().double(), p[0, :256].double().sum()
    assert sum32 > sum64  # the rounding this case needs
    total = sum32 + p[0, 256:].sum().double()
    for u in ((sum64 + (sum32 - sum64) / 2) / total, torch.tensor(1 - 2**-53, dtype=torch.float64)):
        token = inverse_cdf(p, u.reshape(1))
        assert p[0, token] > 0, (u, token)


def test_draw_follows_the_renormalised_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert nucleus_mask(probs, 0.8).tolist() == [[True, True, False, False]]
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.cat([draw(probs, 0.8, [g]) for _ in range(20000)]), minlength=4)
    assert counts[2:].sum() == 0
    assert abs(counts[0] / 20000 - 0.625) < 0.015  # 0.5 / 0.8
    # a nucleus of little mass (top-p 1e-3 on a flat row) ends the rejection rounds and draws inside
    # it
    flat = torch.softmax(
        torch.randn(2, 5000, generator=torch.Generator().manual_seed(2)) * 0.01, -1
    )
    mask = nucleus_mask(flat, 1e-3)
    assert (torch.where(mask, flat, 0.0).sum(-1) < 2e-3).all()  # 16 rounds nearly always reject
    drawn = draw(flat, 1e-3, [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)])
    assert mask.gather(-1, drawn[:, None]).all()


def test_draw_reads_each_rows_generator_in_row_order():
    probs = torch.softmax(torch.randn(6, 2000, generator=torch.Generator().manual_seed(5)), -1)
    # two prompts, n = 3
    shared = [torch.Generator().manual_seed(7)] * 3 + [torch.Generator().manual_seed(8)] * 3
    both = draw(probs, 0.9, shared)
    first = draw(probs[:3], 0.9, [torch.Generator().manual_seed(7)] * 3)
    second = draw(probs[3:], 0.9, [torch.Generator().manual_seed(8)] * 3)
    assert torch.equal(both, torch.cat([first, second]))


def test_response_ends_at_the_first_stop_token(setup):
    cfg, tokenizer, _, ids = setup
    model = load_model(cfg, tokenizer, seed=0).eval()
    eos = tokenizer.eos_token_id
    # make end-of-turn the only possible token: every response is exactly [eos]
    with torch.no_grad():
        model.lm_head.weight.zero_()
        bias = torch.full((model.lm_head.weight.shape[0],), -1e4)
        bias[eos] = 0.0
        model.lm_head.bias = torch.nn.Parameter(bias)
    groups = TorchSampler(model, tokenizer, CPU).generate(ids[:2], 2, 1.0, 0.99, 5, seed=0)
    assert [[(s.token_ids, s.text, s.finish_reason) for s in g] for g in groups] == [
        [((eos,), "", "stop")] * 2
    ] * 2


def test_weight_sync_makes_the_sampler_follow_the_trainer(setup):
    cfg, tokenizer, _, ids = setup
    trainer_model = load_model(cfg, tokenizer, seed=1)
    sampler = TorchSampler(load_model(cfg, tokenizer, seed=2), tokenizer, CPU)
    before = sampler.generate(ids[:2], 2, 1.0, 0.99, 6, seed=0)
    sampler.load_weights((name, t.detach()) for name, t in trainer_model.state_dict().items())
    after = sampler.generate(ids[:2], 2, 1.0, 0.99, 6, seed=0)
    reference = TorchSampler(trainer_model, tokenizer, CPU).generate(
        ids[:2], 2, 1.0, 0.99, 6, seed=0
    )
    assert [[s.token_ids for s in g] for g in after] == [
        [s.token_ids for s in g] for g in reference
    ]
    assert [[s.token_ids for s in g] for g in after] != [[s.token_ids for s in g] for g in before]
    with pytest.raises(ValueError, match="no tensor for"):
        sampler.load_weights([])


def test_bad_input_is_refused(setup):
    _, tokenizer, model, ids = setup
    sampler = TorchSampler(model, tokenizer, CPU)
    with pytest.raises(ValueError, match="empty prompt"):
        sampler.generate([[]], 1, 1.0, 1.0, 4, seed=0)
    with pytest.raises(ValueError, match="seeds"):
        sampler.generate(ids[:2], 1, 1.0, 1.0, 4, seed=[1])


def test_sample_items_is_fixed_and_in_file_order():
    from psyrl.run.validation import sample_items

    items = list(range(100))
    picked = sample_items(items, 10, seed=0)
    assert (
        picked == sorted(picked)
        and len(set(picked)) == 10
        and sample_items(items, 10, seed=0) == picked
    )
    assert sample_items(items, 0, seed=0) == items and sample_items(items, 500, seed=0) == items


class ScriptedSampler:
    """Answers each prompt with the next scripted text (validation's only use of a sampler is
    `generate`)."""

    def __init__(self, texts):
        self.texts = list(texts)

    def generate(self, prompt_token_ids, n, temperature, top_p, max_new_tokens, seed):
        return [[Completion((1,), self.texts.pop(0), "stop", (0.0,))] for _ in prompt_token_ids]


def test_validation_on_a_benchmark_file_scores_f1_accuracy(setup):
    from psyrl.core.config import load_config
    from psyrl.core.records import load_benchmark
    from psyrl.run.validation import validate

    _, tokenizer, model, _ = setup
    records = load_benchmark("data/benchmarks/simpletom/test.jsonl")[:4]
    options = [list(r.options) for r in records]
    right, wrong = records[0].answer, next(o for o in options[1] if o != records[1].answer)
    texts = [
        f"<think>a</think><answer>{right}</answer>",
        f"<answer>{wrong}</answer>",
        # a tie, no match: E
        "<think>b</think><answer>" + " ".join(options[2]) + "</answer>",
        "zzz",
    ]
    metrics, outputs = validate(
        model_policy(model), ScriptedSampler(texts), tokenizer, records, load_config(None)
    )
    assert metrics["valid/accuracy"] == 0.25 and metrics["valid/not_applicable"] == 0.5
    assert metrics["valid/format"] == 0.5 and "valid/loss" not in metrics
    assert [s.text for s in outputs] == texts


def model_policy(model):
    from psyrl.runtime.model import Policy

    return Policy(model)


def test_validation_reward_is_the_variants_final_reward_on_the_same_items(setup):
    from psyrl.core.config import load_config
    from psyrl.core.records import load_stimuliqa
    from psyrl.run.validation import validate

    _, tokenizer, model, _ = setup
    records = load_stimuliqa("data/demo/test.jsonl")[:2]
    # F1 1 + format 1; 0 + 0
    texts = [f"<think>the cue event</think><answer>{records[0].answer}</answer>", "zzz"]
    # equal lengths: ratio 1, so no BR bonus; 0.5 F1 + 0.5 format
    for variant in ("base", "bilateral"):
        cfg = load_config(None, [f"reward.variant={variant}"])
        metrics, _ = validate(
            model_policy(model), ScriptedSampler(list(texts)), tokenizer, records, cfg
        )
        assert metrics["valid/reward"] == pytest.approx(0.5) and metrics["valid/f1"] == 0.5
        assert (
            metrics["valid/format"] == 0.5
            and metrics["valid/length"] == 1.0
            and "valid/loss" in metrics
        )

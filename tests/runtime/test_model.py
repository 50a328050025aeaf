"""Models, tokenizers and `token_logprobs` against the naive full-logit computation."""

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from psyrl.core.config import ModelConfig
from psyrl.runtime.model import load_model, load_tokenizer, load_weights, token_logprobs

TINY = ModelConfig(
    tokenizer="qwen2.5",
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
)


@pytest.fixture(scope="module")
def qwen_tokenizer():
    return load_tokenizer(ModelConfig(tokenizer="qwen2.5"))


@pytest.fixture(scope="module")
def model(qwen_tokenizer):
    return load_model(TINY, qwen_tokenizer, seed=0)


def naive_logprobs(model, ids, mask, temperature):
    logits = model(input_ids=ids, attention_mask=mask).logits.float() / temperature  # [B, T, V]
    # [B, T-1]
    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding on one row
    return ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_naive(model, temperature):
    ids, mask = batch(1000)
    got = token_logprobs(model, ids, mask, temperature, chunk=4)  # several chunks
    want = naive_logprobs(model, ids, mask, temperature) * mask[:, 1:]
    assert got.dtype == torch.float32 and got.shape == (3, 10)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got[1, 6:] == 0).all()


def test_token_logprobs_gradients_equal_naive(model):
    ids, mask = batch(1000)
    positions = torch.zeros(3, 10, dtype=torch.bool)
    positions[:, 5:] = True
    weights = torch.randn(3, 10, generator=torch.Generator().manual_seed(2))
    grads = []
    for compute in (
        lambda: token_logprobs(model, ids, mask, 0.9, positions, chunk=5),
        lambda: naive_logprobs(model, ids, mask, 0.9) * positions,
    ):
        model.zero_grad()
        (compute() * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_tiny_model_is_seeded_and_leaves_the_global_rng_alone(qwen_tokenizer):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = load_model(TINY, qwen_tokenizer, seed=5), load_model(TINY, qwen_tokenizer, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = load_model(TINY, qwen_tokenizer, seed=6)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.config.vocab_size == 151680
    assert a.config.eos_token_id == 151645
    assert a.config.pad_token_id == 151643


def test_qwen_tokenizer_ids(qwen_tokenizer):
    assert len(qwen_tokenizer) == 151665
    assert (qwen_tokenizer.eos_token, qwen_tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert qwen_tokenizer.convert_tokens_to_ids(special) == [151643, 151644, 151645]


def test_missing_model_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model directory: .*nowhere"):
        load_tokenizer(ModelConfig(path=str(tmp_path / "nowhere")))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(ModelConfig(path=str(tmp_path), tokenizer="tiny"), None)
    with pytest.raises(FileNotFoundError, match="no such tokenizer directory"):
        load_tokenizer(ModelConfig(tokenizer=str(tmp_path / "tok")))


def test_local_directory_loads_like_the_original(model, qwen_tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    qwen_tokenizer.save_pretrained(tmp_path)
    cfg = ModelConfig(path=str(tmp_path))
    reloaded = load_model(cfg, load_tokenizer(cfg))
    ids, mask = batch(1000)
    with torch.no_grad():
        assert torch.equal(
            model(ids, attention_mask=mask).logits, reloaded(ids, attention_mask=mask).logits
        )


@pytest.mark.slow
def test_peak_memory_is_bounded():
    """Qwen2.5's vocabulary, 8 x 256 tokens, forward + backward: the naive way peaks at 4.6 GiB here
    (bench/logprob_memory.py); the chunked way must stay under 1 GiB."""
    spec = importlib.util.spec_from_file_location("bench_mem", Path("bench/logprob_memory.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_mem"] = bench
    spec.loader.exec_module(bench)
    result = bench.measure("chunked", 8, 256, 151936, 64)
    assert result["peak_above_baseline_gib"] < 1.0, result


def test_bf16_autocast_stays_close_to_float32(model):
    ids, mask = batch(1000)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = token_logprobs(model, ids, mask, 1.0)
    assert low.dtype == torch.float32  # the log-softmax itself runs in float32
    torch.testing.assert_close(low, token_logprobs(model, ids, mask, 1.0), atol=0.05, rtol=0.02)
    grads = []
    for amp in (torch.autocast("cpu", dtype=torch.bfloat16), contextlib.nullcontext()):
        model.zero_grad()
        with amp:
            # backward recomputes in bf16
            token_logprobs(model, ids, mask, 0.7, chunk=6).sum().backward()
        grads.append(model.lm_head.weight.grad.clone())
    assert grads[0].dtype == torch.float32
    cosine = torch.nn.functional.cosine_similarity(grads[0].flatten(), grads[1].flatten(), dim=0)
    assert cosine > 0.99, cosine


def test_load_weights_fills_every_parameter_or_names_the_missing_one(model, qwen_tokenizer):
    copy = load_model(TINY, qwen_tokenizer, seed=5)
    state = model.state_dict()
    # tied to the embedding
    load_weights(copy, ((n, t) for n, t in state.items() if n != "lm_head.weight"))
    ids, mask = batch(model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(
            copy(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits
        )
    with pytest.raises(ValueError, match=r"no tensor for model.norm.weight \(1 parameters\)"):
        load_weights(copy, ((n, t) for n, t in state.items() if n != "model.norm.weight"))

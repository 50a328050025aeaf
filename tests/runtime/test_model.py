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


@pytest.mark.numerics
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_naive(model, temperature):
    ids, mask = batch(1000)
    got = token_logprobs(model, ids, mask, temperature, chunk=4)  # several chunks
    want = naive_logprobs(model, ids, mask, temperature) * mask[:, 1:]
    assert got.dtype == torch.float32 and got.shape == (3, 10)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got[1, 6:] == 0).all()


@pytest.mark.numerics
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


@pytest.mark.numerics
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


def _head_weight_gradient(hidden, weight, targets, g, chunk, per_chunk=False):
    """d/dW of sum(g * log p(target)) through HeadLogprobs: in one call, or (per_chunk) one call
    per chunk whose gradients autograd sums in the weight's dtype (the summation before)."""
    from psyrl.runtime.model import HeadLogprobs

    w = weight.clone().requires_grad_()
    if per_chunk:
        out = torch.cat(
            [
                HeadLogprobs.apply(
                    hidden[s : s + chunk], w, None, targets[s : s + chunk], 1.0, chunk
                )
                for s in range(0, hidden.shape[0], chunk)
            ]
        )
    else:
        out = HeadLogprobs.apply(hidden, w, None, targets, 1.0, chunk)
    (out * g).sum().backward()
    return w.grad


@pytest.mark.numerics
def test_lm_head_gradient_is_summed_in_float32_over_chunks():
    """bf16 weights and rows (FSDP2's mixed precision), 128 chunks of 8 rows, against the gradient
    computed in float64 from the same bf16 values: (onehot - softmax) * g, times the rows."""
    g = torch.Generator().manual_seed(0)
    n, h, v = 1024, 64, 512
    hidden = torch.randn(n, h, generator=g).bfloat16()
    weight = (torch.randn(v, h, generator=g) * 0.1).bfloat16()
    targets = torch.randint(0, v, (n,), generator=g)
    upstream = torch.randn(n, generator=g)
    probs = (hidden.double() @ weight.double().t()).softmax(-1)
    d_logits = -probs * upstream[:, None].double()
    d_logits[torch.arange(n), targets] += upstream.double()
    exact = d_logits.t() @ hidden.double()  # [V, H], float64

    def error(grad):
        return ((grad.double() - exact).norm() / exact.norm()).item()

    summed_in_float32 = _head_weight_gradient(hidden, weight, targets, upstream, chunk=8)
    summed_in_bf16 = _head_weight_gradient(hidden, weight, targets, upstream, 8, per_chunk=True)
    assert summed_in_float32.dtype == torch.bfloat16
    # bf16 rounds to 2^-9 relative: the products' own roundings, then one rounding of the sum
    assert error(summed_in_float32) < 4e-3
    assert error(summed_in_bf16) > 2 * error(summed_in_float32)  # 128 bf16 additions, measured
    # float32 weights: the float64 gradient to float32 precision, however it is chunked
    exact32 = _head_weight_gradient(hidden.float(), weight.float(), targets, upstream, chunk=1024)
    for chunk in (8, 100):
        got = _head_weight_gradient(hidden.float(), weight.float(), targets, upstream, chunk)
        torch.testing.assert_close(got, exact32, rtol=1e-5, atol=1e-5)
    assert error(exact32) < 1e-6

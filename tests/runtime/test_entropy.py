"""The true entropy of the policy's next-token distribution (issue 42 item 6): `HeadLogprobs` with
entropy=True and `token_logprobs(..., entropy=True)`, against a full-softmax reference in float64,
by hand, and through autograd; the log-prob-only call stays what it was."""

import math

import pytest
import torch
from numerics import float32_sum_tolerance
from test_model_packing import TINY

from psyrl.runtime.model import (
    HeadLogprobs,
    Policy,
    collate,
    load_model,
    load_tokenizer,
    pack,
    token_logprobs,
)

pytestmark = (
    pytest.mark.numerics
)  # chunked float32 against full softmaxes, and chunkings against each other

SHAPES = [(7, 3), (5, 11), (9, 2), (6, 8)]  # (prompt, response) tokens


def reference(hidden, weight, bias, targets, temperature):
    """log p(target) and H = -sum_v p_v log p_v from the full [N, V] softmax, in float64."""
    z = hidden.double() @ weight.double().t()  # [N, V]
    if bias is not None:
        z = z + bias.double()
    logp = torch.log_softmax(z / temperature, dim=-1)  # [N, V]
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)  # [N], [N]


def head(n=23, h=16, v=300, bias=True, seed=0):
    """Hand-made rows, head weight and bias, targets and two upstream weights."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)  # [N, H]
    weight = torch.randn(v, h, generator=g) * 0.5  # [V, H]: logits of std ~2, a peaked softmax
    b = torch.randn(v, generator=g) * 0.3 if bias else None  # [V]
    targets = torch.randint(0, v, (n,), generator=g)  # [N]
    return hidden, weight, b, targets, torch.randn(n, generator=g), torch.randn(n, generator=g)


def test_uniform_logits_give_log_v():
    # zero weight: every logit 0, p_v = 1/V, H = -V (1/V) log(1/V) = log V; log p = -log V;
    # and uniform is H's maximum, so dH/dz = -p (log p + H) = -(1/V)(-log V + log V) = 0
    v = 1024
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = torch.zeros(v, 8, requires_grad=True)
    targets = torch.arange(5)
    logp, ent = HeadLogprobs.apply(hidden, weight, None, targets, 0.7, 2, True)
    torch.testing.assert_close(ent, torch.full((5,), math.log(v)), rtol=2e-7, atol=0)
    torch.testing.assert_close(logp, torch.full((5,), -math.log(v)), rtol=2e-7, atol=0)
    ent.sum().backward()
    assert hidden.grad.abs().max() == 0  # dH/dz is 0 and z = hidden @ 0
    # log p + H is 0 up to an ulp of log V (5e-7), times p = 1/V, / T, times |hidden|
    assert weight.grad.abs().max() < 1e-7


def test_two_tokens_by_hand():
    # logits (0, log 3): p = (1/4, 3/4), H = -(1/4 log 1/4 + 3/4 log 3/4) = log 4 - (3/4) log 3
    # = 1.386294 - 0.823959 = 0.562335; log p(token 1) = log 3/4 = -0.287682
    hidden = torch.tensor([[1.0]])
    weight = torch.tensor([[0.0], [math.log(3)]])
    logp, ent = HeadLogprobs.apply(hidden, weight, None, torch.tensor([1]), 1.0, 1, True)
    torch.testing.assert_close(ent, torch.tensor([math.log(4) - 0.75 * math.log(3)]))
    torch.testing.assert_close(logp, torch.tensor([math.log(0.75)]))
    # at T = 2 the logits are (0, log 3 / 2): p = (1, sqrt 3) / (1 + sqrt 3)
    q = torch.tensor([1.0, math.sqrt(3)], dtype=torch.float64) / (1 + math.sqrt(3))
    _, ent = HeadLogprobs.apply(hidden, weight, None, torch.tensor([1]), 2.0, 1, True)
    torch.testing.assert_close(ent, -(q * q.log()).sum()[None].float())


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("chunk", [1, 5, 7, 64])  # 23 rows: chunks that do not divide them
@pytest.mark.parametrize("bias", [True, False])
def test_entropy_equals_full_softmax(temperature, chunk, bias):
    hidden, weight, b, targets, _, _ = head(bias=bias)
    logp, ent = HeadLogprobs.apply(hidden, weight, b, targets, temperature, chunk, True)
    want_logp, want_ent = reference(hidden, weight, b, targets, temperature)
    assert ent.dtype == torch.float32 and ent.shape == (23,)
    torch.testing.assert_close(ent.double(), want_ent, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(logp.double(), want_logp, atol=2e-6, rtol=2e-6)
    assert (ent > 0).all() and (ent < math.log(300)).all()


@pytest.mark.parametrize("a, b", [(1.0, 0.5), (0.0, 1.0), (1.0, -0.01), (1.0, 0.0)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradient_of_logp_and_entropy_equals_autograd(a, b, temperature):
    """d/d(hidden, W, bias) of a * sum(u logp) + b * sum(w H): the chunked backward in float32
    against autograd through the float64 full softmax."""
    hidden, weight, bias, targets, u, w = head()
    inputs = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    logp, ent = HeadLogprobs.apply(*inputs, targets, temperature, 5, True)
    (a * (u * logp).sum() + b * (w * ent).sum()).backward()
    exact = [t.double().requires_grad_() for t in (hidden, weight, bias)]
    want_logp, want_ent = reference(*exact, targets, temperature)
    (a * (u * want_logp).sum() + b * (w * want_ent).sum()).backward()
    for name, got, want in zip(("hidden", "weight", "bias"), inputs, exact):
        assert got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_entropy_unused_in_the_loss_leaves_the_log_prob_path_bit_for_bit():
    """entropy=True as a metric only: the same log-probs and the same gradients, bit for bit, as
    the log-prob-only call (the entropy's gradient arrives as None and the backward is the old
    one)."""
    hidden, weight, bias, targets, u, _ = head()
    grads, outs = [], []
    for entropy in (False, True):
        inputs = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        out = HeadLogprobs.apply(*inputs, targets, 0.7, 5, entropy)
        logp = out[0] if entropy else out
        (u * logp).sum().backward()
        outs.append(logp.detach())
        grads.append([t.grad for t in inputs])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(x, y) for x, y in zip(*grads))


@pytest.fixture(scope="module")
def model():
    return load_model(TINY, load_tokenizer(TINY), seed=3)


def full_logits_reference(model, ids, temperature):
    """Per sequence alone, plain transformers logits: log p of each next token and the entropy,
    [T-1] each, from the full softmax in float64."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double() / temperature
    logp = logits.log_softmax(-1)  # [T-1, V]
    return logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_entropy_padded_and_packed(model, temperature):
    """Padded and packed layouts, several chunks of rows: the entropy at each response position
    equals the full softmax's, 0 elsewhere; the log-probs equal the log-prob-only call's, bit for
    bit."""
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(10, 200, (p + r,), generator=g).tolist() for p, r in SHAPES]
    prompts = [p for p, _ in SHAPES]
    input_ids, attention_mask, mask = collate(ids, prompts, pad_id=0)
    padded = token_logprobs(model, input_ids, attention_mask, temperature, mask, 3, entropy=True)
    packed = token_logprobs(model, pack(ids, prompts), None, temperature, chunk=3, entropy=True)
    for logp, ent in (padded, packed):
        assert logp.shape == ent.shape == mask.shape and ent.dtype == torch.float32
        assert ent[~mask].abs().max() == 0 and ent[mask].min() > 0
        for row, (seq, p) in enumerate(zip(ids, prompts)):
            want_logp, want_ent = full_logits_reference(model, seq, temperature)
            span = slice(p - 1, len(seq) - 1)
            torch.testing.assert_close(
                ent[row, span].double(), want_ent[p - 1 :], atol=2e-5, rtol=0
            )
            torch.testing.assert_close(
                logp[row, span].double(), want_logp[p - 1 :], atol=2e-5, rtol=0
            )
    plain = token_logprobs(model, input_ids, attention_mask, temperature, mask, 3)
    assert torch.equal(padded[0], plain)
    via_policy = Policy(model)(input_ids, attention_mask, temperature, mask, entropy=True)
    direct = token_logprobs(model, input_ids, attention_mask, temperature, mask, entropy=True)
    assert all(torch.equal(a, b) for a, b in zip(via_policy, direct))  # one call, one arithmetic
    # another chunking (3 rows against LOGPROB_CHUNK): the head's matmul rounds the logits
    # differently (measured 3.6e-7), so each entropy, a float32 sum over V terms of one sign,
    # rounds differently: measured 7.6e-6 at H 8.1 on an AVX2 CPU, where 1e-6 (one ulp) failed
    vocab = model.get_output_embeddings().weight.shape[0]
    atol = float32_sum_tolerance(padded[1].max().item(), vocab)
    torch.testing.assert_close(via_policy[1], padded[1], atol=atol, rtol=0)


def test_token_logprobs_entropy_bonus_gradient_equals_full_logits(model):
    """Every parameter's gradient of sum(logp) + 0.3 sum(H) over the response positions: chunked
    against autograd through the full [B, T, V] logits."""
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(10, 200, (p + r,), generator=g).tolist() for p, r in SHAPES]
    input_ids, attention_mask, mask = collate(ids, [p for p, _ in SHAPES], pad_id=0)
    grads = []
    for chunked in (True, False):
        model.zero_grad()
        if chunked:
            logp, ent = token_logprobs(model, input_ids, attention_mask, 0.9, mask, 4, entropy=True)
        else:
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
            full = torch.log_softmax(logits.float() / 0.9, dim=-1)  # [B, T-1, V]
            logp = full.gather(-1, input_ids[:, 1:, None]).squeeze(-1) * mask
            ent = -(full.exp() * full).sum(-1) * mask  # [B, T-1]
        (logp.sum() + 0.3 * ent.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_entropy_under_bf16_autocast_stays_close_to_float32(model):
    g = torch.Generator().manual_seed(2)
    ids = [torch.randint(10, 200, (p + r,), generator=g).tolist() for p, r in SHAPES]
    batch = pack(ids, [p for p, _ in SHAPES])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, low = token_logprobs(model, batch, None, entropy=True)
    _, high = token_logprobs(model, batch, None, entropy=True)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, high, atol=0.05, rtol=0.02)

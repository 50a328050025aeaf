"""Padding-free packed micro-batches (psyrl/runtime/model.py `pack`, `packed_attention`): the
layout by hand, log-probs and gradients equal to the padded path and to each sequence run alone,
attention that never crosses a sequence boundary, and the same on two FSDP ranks."""

import dataclasses
import subprocess
import sys
from contextlib import nullcontext

import pytest
import torch
from safetensors.torch import load_file

from psyrl.core.config import ModelConfig, load_config
from psyrl.core.tomlconf import FieldError
from psyrl.rl.rollout import RolloutBatch
from psyrl.rl.update import micro_batches, sequence_logprobs, update
from psyrl.runtime import model as model_module
from psyrl.runtime.distributed import ONE_PROCESS
from psyrl.runtime.model import (
    Policy,
    autocast_inputs,
    collate,
    load_model,
    load_tokenizer,
    pack,
    packed_kernel,
    token_logprobs,
    varlen_causal,
)

TINY = ModelConfig(
    tokenizer="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
)
SHAPES = [(7, 3), (5, 11), (9, 2), (6, 8), (4, 13), (8, 5)]  # (prompt, response) tokens


def untie(model):
    """The LM head as its own parameter (a copy of the embedding, shifted): an untied model."""
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight + 0.01)
    model.config.tie_word_embeddings = False
    return model


def random_sequences(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(10, 200, (p + r,), generator=g).tolist() for p, r in shapes]
    return ids, [p for p, _ in shapes]


def test_pack_lays_out_one_row_by_hand():
    packed = pack([[11, 12, 13], [21, 22]], [1, 1])
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 22]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]  # restarting per sequence
    assert packed.starts.tolist() == [0, 3, 5] and packed.starts.dtype == torch.int32
    assert packed.longest == 3
    # position 2 (13) would predict 21, the next sequence's first token: never a target
    assert packed.targets.tolist() == [[True, True, False, True]]
    assert packed.layout.tolist() == [[True, True], [True, False]]
    _, _, mask = collate([[11, 12, 13], [21, 22]], [1, 1], pad_id=0)
    assert torch.equal(packed.layout, mask)


@pytest.mark.numerics
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_equal_padded_and_each_sequence_alone(tied, temperature):
    tokenizer = load_tokenizer(TINY)
    model = load_model(TINY, tokenizer, seed=3)
    model = model if tied else untie(model)
    ids, prompts = random_sequences(SHAPES)
    input_ids, attention_mask, mask = collate(ids, prompts, tokenizer.pad_token_id)
    padded = token_logprobs(model, input_ids, attention_mask, temperature, mask)
    packed = token_logprobs(model, pack(ids, prompts), None, temperature)
    assert packed.shape == padded.shape == mask.shape
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    assert packed[~mask].abs().max() == 0 and packed[mask].abs().min() > 0
    # the independent reference: each sequence alone, no padding, plain transformers logits
    for row, (seq, p) in enumerate(zip(ids, prompts)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0].float() / temperature
        alone = logits.log_softmax(-1)[:-1].gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
        torch.testing.assert_close(
            packed[row, p - 1 : len(seq) - 1], alone[p - 1 :], atol=1e-5, rtol=0
        )


def test_a_sequence_never_sees_its_neighbours():
    tokenizer = load_tokenizer(TINY)
    model = load_model(TINY, tokenizer, seed=3)
    ids, prompts = random_sequences(SHAPES[:3])
    before = token_logprobs(model, pack(ids, prompts), None)
    ids[1] = [t + 1 for t in ids[1]]  # change the middle sequence only
    after = token_logprobs(model, pack(ids, prompts), None)
    assert torch.equal(before[0], after[0]) and torch.equal(before[2], after[2])
    assert not torch.equal(before[1], after[1])


def rollout(shapes, seed=0):
    ids, prompts = random_sequences(shapes, seed)
    return RolloutBatch(
        [tuple(s) for s in ids],
        prompts,
        [float(i % 3 - 1) for i in range(len(ids))],
        [[-1.0] * r for _, r in shapes],
        [False] * len(shapes),
    )


def tgrpo_cfg(packing: bool, **optim):
    cfg = load_config("configs/tgrpo/tiny.toml", ["model.path=", "optim.grad_clip=0"])
    cfg.model = dataclasses.replace(TINY, packing=packing)
    cfg.optim.global_batch, cfg.rollout.samples = 12, 1
    for key, value in optim.items():
        setattr(cfg.optim, key, value)
    return cfg


@pytest.mark.parametrize("tied", [True, False])
def test_one_update_packed_gives_the_padded_gradient(tied):
    """The whole update (eq. 1 with the KL term): micro-batches of 2, and by a 40-token budget."""
    tokenizer = load_tokenizer(TINY)
    batch = rollout(SHAPES)
    reference = Policy(load_model(TINY, tokenizer, seed=2))
    for optim in ({"micro_batch": 2}, {"micro_batch_tokens": 40}):
        grads, sums = [], []
        for packing in (False, True):
            cfg = tgrpo_cfg(packing, **optim)
            cfg.loss.kl_coef = 0.05
            pad = tokenizer.pad_token_id
            batch.logp_ref = sequence_logprobs(
                reference, batch, pad, cfg, ONE_PROCESS, nullcontext()
            )
            model = load_model(cfg.model, tokenizer, seed=1)
            policy = Policy(model if tied else untie(model))
            before = [p.detach().clone() for p in policy.parameters()]
            optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)  # after = before - grad
            sums.append(update(policy, optimizer, batch, pad, cfg, ONE_PROCESS, nullcontext())[2])
            grads.append([b - p.detach() for b, p in zip(before, policy.parameters())])
        assert max((a - b).abs().max().item() for a, b in zip(*grads)) < 1e-5
        assert max(a.abs().max().item() for a in grads[0]) > 1e-4  # a real gradient
        for key in set(sums[0]) - {"padded_tokens"}:  # a budget groups differently when packed
            assert float(sums[0][key]) == pytest.approx(float(sums[1][key]), rel=1e-5, abs=1e-7)


def test_a_token_budget_counts_real_tokens_when_packed():
    lengths = [5, 9, 3, 9, 2, 7]
    # padded, budget 20: [1, 3] 2 x 9 = 18; [5, 0] 2 x 7 = 14; [2, 4] 2 x 3 = 6
    assert micro_batches(lengths, 4, 20) == [[1, 3], [5, 0], [2, 4]]
    # packed, budget 20: 9 + 9 = 18, + 7 = 25 > 20; 7 + 5 + 3 = 15, + 2 = 17
    assert micro_batches(lengths, 4, 20, packed=True) == [[1, 3], [5, 0, 2, 4]]


def test_packing_with_eager_attention_is_refused():
    with pytest.raises(FieldError, match="packing"):
        dataclasses.replace(TINY, attn_implementation="eager")
    dataclasses.replace(TINY, attn_implementation="eager", packing=False)


def test_a_packed_row_on_a_padded_model_is_refused():
    tokenizer = load_tokenizer(TINY)
    model = load_model(dataclasses.replace(TINY, packing=False), tokenizer)
    ids, prompts = random_sequences(SHAPES[:2])
    with pytest.raises(ValueError, match="model.packing = true"):
        token_logprobs(model, pack(ids, prompts), None)


@pytest.mark.numerics
def test_two_fsdp_ranks_packed_equal_padded(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    subprocess.run(
        [*torchrun, "2", "tests/workers/packed_logprobs.py", str(tmp_path)],
        check=True,
        timeout=300,
    )
    for rank in range(2):
        got = load_file(str(tmp_path / f"rank-{rank}.safetensors"))
        for head in ("tied", "untied"):
            torch.testing.assert_close(
                got[f"{head}_packed"], got[f"{head}_padded"], atol=1e-5, rtol=0
            )
            torch.testing.assert_close(
                got[f"{head}_grad_packed"], got[f"{head}_grad_padded"], atol=1e-5, rtol=0
            )
            assert got[f"{head}_grad_padded"].abs().max() > 1e-4
    # the ranks scored different sequences
    assert not torch.equal(
        load_file(str(tmp_path / "rank-0.safetensors"))["tied_padded"],
        load_file(str(tmp_path / "rank-1.safetensors"))["tied_padded"],
    )


def test_the_cuda_path_calls_varlen_attention_with_the_packed_shapes():
    """No GPU here: torch's varlen op on meta tensors runs its registered shape function, which
    checks the call psyrl makes (layout, sequence starts, GQA) without computing anything."""
    query = torch.empty(1, 4, 10, 16, device="meta", dtype=torch.bfloat16)  # [1, heads, N, d]
    key = torch.empty(1, 2, 10, 16, device="meta", dtype=torch.bfloat16)  # 2 KV heads
    starts = torch.tensor([0, 3, 10], dtype=torch.int32, device="meta")
    out = varlen_causal(query, key, key, starts, 7, 0.25)
    assert out.shape == (1, 10, 4, 16) and out.dtype == torch.bfloat16  # [1, N, heads, d]


def test_autocast_over_float32_weights_reaches_the_kernel_choice_in_one_dtype(monkeypatch):
    """One process autocasts over float32 weights (recipes/tgrpo.py: `amp`). Rotary's float32
    cos/sin promote q and k to float32 while v is bf16; the kernel is chosen on q, k, v cast to
    autocast's dtype. The CPU's autocast reproduces the dtypes CUDA's gives (both run linears in
    bf16 and leave the rotary product to type promotion); the device type is the only difference,
    and `packed_kernel` takes CUDA's to varlen with that dtype, to the SDPA loop with the old
    one."""
    seen, chosen = [], []
    cast = model_module.autocast_inputs
    monkeypatch.setattr(
        model_module,
        "autocast_inputs",
        lambda device_type, *t: seen.append([x.dtype for x in t]) or cast(device_type, *t),
    )
    choose = model_module.packed_kernel
    monkeypatch.setattr(
        model_module,
        "packed_kernel",
        lambda device_type, dtype: (
            chosen.append((device_type, dtype)) or choose(device_type, dtype)
        ),
    )
    tokenizer = load_tokenizer(TINY)
    model = load_model(TINY, tokenizer, seed=3)
    ids, prompts = random_sequences(SHAPES[:2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        token_logprobs(model, pack(ids, prompts), None)
    f32, bf16 = torch.float32, torch.bfloat16
    assert seen == [[f32, f32, bf16]] * TINY.num_layers  # q, k, v as they reach attention
    assert chosen == [("cpu", bf16)] * TINY.num_layers
    assert packed_kernel("cuda", bf16) == "varlen"
    assert packed_kernel("cuda", f32) == "sdpa_loop"  # q's dtype before the cast
    assert packed_kernel("cpu", bf16) == "sdpa_loop"


@pytest.fixture
def cuda_autocast():
    """CUDA's autocast state switched on by hand, as `torch.autocast("cuda")` would on a GPU (on a
    build without CUDA the context manager disables itself); restored after the test."""
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    yield
    torch.set_autocast_enabled("cuda", enabled)
    torch.set_autocast_dtype("cuda", dtype)


def test_under_cuda_autocast_mixed_q_k_v_go_to_varlen(cuda_autocast):
    """The CUDA decision on meta tensors (no GPU here): q and k float32, v bf16 as under autocast
    -> all bf16 -> varlen, whose registered shape function accepts the call."""
    query = torch.empty(1, 4, 10, 16, device="meta")  # [1, heads, N, d] float32
    key = torch.empty(1, 2, 10, 16, device="meta")  # 2 KV heads
    value = torch.empty(1, 2, 10, 16, device="meta", dtype=torch.bfloat16)
    q, k, v = autocast_inputs("cuda", query, key, value)
    assert {q.dtype, k.dtype, v.dtype} == {torch.bfloat16}
    assert packed_kernel("cuda", q.dtype) == "varlen"
    starts = torch.tensor([0, 3, 10], dtype=torch.int32, device="meta")
    out = varlen_causal(q, k, v, starts, 7, 0.25)
    assert out.shape == (1, 10, 4, 16) and out.dtype == torch.bfloat16  # [1, N, heads, d]
    # the other device's autocast does not apply: a CPU tensor keeps its dtype
    assert autocast_inputs("cpu", query)[0].dtype == torch.float32


def test_without_autocast_the_kernel_choice_is_unchanged():
    """float32 (no autocast) stays in float32 and takes the SDPA loop, on CUDA too; FSDP2's bf16
    parameters (no autocast) reach attention in bf16 and take varlen on CUDA, as before."""
    f32 = torch.empty(1, 2, 3, 4, device="meta")
    bf16 = f32.to(torch.bfloat16)
    assert not torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu")
    for device_type in ("cuda", "cpu"):
        assert autocast_inputs(device_type, f32, bf16) == (f32, bf16)  # the same tensors
    assert packed_kernel("cuda", torch.float32) == "sdpa_loop"
    assert packed_kernel("cuda", torch.bfloat16) == "varlen"
    assert packed_kernel("cuda", torch.float16) == "varlen"

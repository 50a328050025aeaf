"""The phase offload's host side on a CPU, one process (2 ranks: tests/workers/sync_check.py): one
exact-size host block made once, every parameter and AdamW state tensor a view into it while on the
host, round trips bit-exact, training after the moves equal to training without them; and what the
CUDA-only paths do on a CPU (nothing)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from psyrl.runtime.model import Policy
from psyrl.runtime.offload import HostBlock, PhaseOffload, host_buffer


def tiny(tied: bool, seed: int = 3) -> Policy:
    config = Qwen2Config(
        vocab_size=101,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Policy(Qwen2ForCausalLM(config))


IDS = torch.arange(12).reshape(2, 6) % 101


def train_step(policy: Policy, optimizer: torch.optim.Optimizer) -> None:
    policy(IDS, torch.ones_like(IDS)).float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_block_holds_exactly_the_parameters_and_adamw_state():
    for tied in (True, False):
        policy = tiny(tied)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        offload = PhaseOffload(policy, optimizer, torch.device("cpu"), enabled=True)
        params = list(policy.parameters())  # a tied head once
        assert len(params) == len({id(p) for p in params})
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        # exp_avg and exp_avg_sq of every parameter, float32 like the parameters
        assert offload.block.param_bytes == param_bytes
        assert offload.block.state_bytes == 2 * param_bytes
        assert offload.host_bytes == 3 * param_bytes
        # the layout is reserved before AdamW has made its state: made once, at the first move
        assert not optimizer.state and offload.block.allocations == 0
        offload.to_host()
        assert offload.block.buffer.numel() == offload.host_bytes
        offload.to_device()
        train_step(policy, optimizer)
        offload.to_host()
        buffer = offload.block.buffer
        assert storage(buffer) != 0 and all(storage(p) == storage(buffer) for p in params)
        moments = [optimizer.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
        assert all(storage(m) == storage(buffer) for m in moments)
        offload.to_device()
        offload.to_host()
        assert offload.block.buffer is buffer and offload.block.allocations == 1
        assert all(storage(p) == storage(buffer) for p in policy.parameters())
    assert PhaseOffload(policy, optimizer, torch.device("cpu"), enabled=False).host_bytes == 0


def test_round_trip_is_bit_exact_and_keeps_the_parameters():
    policy = tiny(True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    train_step(policy, optimizer)
    offload = PhaseOffload(policy, optimizer, torch.device("cpu"), enabled=True)
    params = list(policy.parameters())
    values = [p.detach().clone() for p in params]
    state = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in params]
    for _ in range(2):
        offload.to_host()
        on_host = [storage(p) for p in params]
        offload.to_device()
        # each move a real copy: into the host block, then out of it into new tensors
        assert set(on_host) == {storage(offload.block.buffer)}
        assert storage(offload.block.buffer) not in {storage(p) for p in params}
    assert list(policy.parameters()) == params and all(p in optimizer.state for p in params)
    assert all(torch.equal(p.detach(), v) for p, v in zip(params, values))
    assert all(
        torch.equal(optimizer.state[p][k], v) for p, s in zip(params, state) for k, v in s.items()
    )
    assert policy.lm.lm_head.weight is policy.lm.model.embed_tokens.weight  # still tied
    assert all(p.grad is None for p in params)


def test_a_gradient_moves_too_outside_the_block():
    policy = tiny(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy(IDS, torch.ones_like(IDS)).sum().backward()
    optimizer.step()
    grads = [p.grad.clone() for p in policy.parameters()]
    before = [storage(p.grad) for p in policy.parameters()]
    offload = PhaseOffload(policy, optimizer, torch.device("cpu"), enabled=True)
    offload.to_host()
    block = storage(offload.block.buffer)
    moved = [storage(p.grad) for p in policy.parameters()]
    # each a new copy (made before the old one is let go), outside the block
    assert block not in moved and all(b != m for b, m in zip(before, moved))
    offload.to_device()
    assert all(torch.equal(p.grad, g) for p, g in zip(policy.parameters(), grads))


def test_training_after_moves_equals_training_without():
    runs = {}
    for moved in (False, True):
        policy = tiny(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        offload = PhaseOffload(policy, optimizer, torch.device("cpu"), enabled=moved)
        for _ in range(3):
            offload.to_host()  # no-op when disabled
            offload.to_device()
            train_step(policy, optimizer)
        offload.to_host()
        offload.to_device()
        runs[moved] = [p.detach().clone() for p in policy.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True]))


def test_amsgrad_state_has_its_slot_and_foreign_state_is_refused():
    policy = tiny(True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2, amsgrad=True)
    block = HostBlock(policy, optimizer, pin=False)
    assert block.state_bytes == 3 * block.param_bytes
    train_step(policy, optimizer)
    block.move(torch.device("cpu"), to_host=True)
    p = next(policy.parameters())
    optimizer.state[p]["momentum"] = torch.zeros(3)
    try:
        block.move(torch.device("cpu"), to_host=True)
    except RuntimeError as e:
        assert "momentum" in str(e)
    else:
        raise AssertionError("unknown optimiser state was moved")


def test_cpu_block_is_not_page_locked_and_cuda_paths_are_no_ops(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "cudart", lambda: calls.append("cudart"))
    buffer = host_buffer(64, pin=False)
    assert buffer.numel() == 64 and buffer.dtype == torch.uint8
    policy = tiny(True)
    offload = PhaseOffload(
        policy, torch.optim.AdamW(policy.parameters()), torch.device("cpu"), True
    )
    offload.to_host()
    offload.to_device()
    assert calls == []


def test_cuda_host_buffer_is_registered_once_at_its_exact_size(monkeypatch):
    # what a CUDA run calls, with the runtime stubbed: one cudaHostRegister of exactly the block's
    # bytes (not the pinned allocator, which rounds to a power of two), unregistered with the block
    calls = []

    class Cudart:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size, flags))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    monkeypatch.setattr(torch.cuda, "check_error", lambda res: None)
    policy = tiny(True)
    optimizer = torch.optim.AdamW(policy.parameters())
    block = HostBlock(policy, optimizer, pin=True)
    block.move(torch.device("cpu"), to_host=True)
    block.move(torch.device("cpu"), to_host=False)
    block.move(torch.device("cpu"), to_host=True)
    ptr = block.buffer.data_ptr()
    assert calls == [("register", ptr, block.nbytes, 0)]
    del block
    assert calls[-1] == ("unregister", ptr)

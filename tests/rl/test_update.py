"""The policy update of a T-GRPO step (psyrl/rl/update.py): micro-batches by count or token
budget, the experience pass that fills in the reference and old log-probs, and an update whose
gradient does not depend on how its mini-batch is cut into micro-batches."""

from contextlib import nullcontext

import pytest
import torch

from psyrl.core.config import ModelConfig, load_config
from psyrl.rl.rollout import RolloutBatch
from psyrl.rl.update import experience, micro_batches, sequence_logprobs, update
from psyrl.runtime.distributed import ONE_PROCESS
from psyrl.runtime.model import Policy, load_model, load_tokenizer

TINY = ModelConfig(
    tokenizer="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
)


def random_batch(shapes: list[tuple[int, int]], seed: int = 0) -> RolloutBatch:
    """Sequences of (prompt, response) tokens drawn at random, advantages -1, 0, 1 in turn."""
    g = torch.Generator().manual_seed(seed)
    batch = RolloutBatch([], [], [], [], [])
    for i, (prompt, response) in enumerate(shapes):
        batch.token_ids.append(
            tuple(torch.randint(10, 200, (prompt + response,), generator=g).tolist())
        )
        batch.prompt_lengths.append(prompt)
        batch.advantages.append(float(i % 3 - 1))
        batch.sampler_logprobs.append([-1.0] * response)
        batch.truncated.append(False)
    return batch


def test_micro_batches_pack_by_tokens():
    lengths = [5, 9, 3, 9, 2, 7]
    assert micro_batches(lengths, 4, 0) == [[0, 1, 2, 3], [4, 5]]  # fixed size, in order
    # by decreasing length (ties by index): 9 (1), 9 (3), 7 (5), 5 (0), 3 (2), 2 (4); budget 20:
    # [1]: 1 x 9; + 3: 2 x 9 = 18 <= 20; + 5: 3 x 9 = 27 > 20 -> new; [5, 0]: 2 x 7 = 14;
    # + 2: 3 x 7 = 21 > 20 -> new; [2, 4]: 2 x 3 = 6
    assert micro_batches(lengths, 4, 20) == [[1, 3], [5, 0], [2, 4]]
    assert micro_batches([30, 4], 4, 20) == [[0], [1]]  # longer than the budget: alone


def fake_cfg(**optim):
    cfg = load_config(
        "configs/tgrpo/tiny.toml", ["model.path=", "loss.kl_coef=0", "optim.grad_clip=0"]
    )
    for k, v in optim.items():
        setattr(cfg.optim, k, v)
    return cfg


@pytest.mark.numerics
def test_token_budget_gives_the_gradient_of_fixed_micro_batches():
    tokenizer = load_tokenizer(TINY)
    batch = random_batch([(7, 3), (5, 11), (9, 2), (6, 8), (4, 13), (8, 5)])
    grads, sums = [], []
    for optim in ({"micro_batch": 2}, {"micro_batch": 2, "micro_batch_tokens": 30}):
        cfg = fake_cfg(**optim)
        cfg.optim.global_batch, cfg.rollout.samples = 12, 1  # update's divisor: 12 sequences
        policy = Policy(load_model(TINY, tokenizer, seed=1))
        before = [p.detach().clone() for p in policy.parameters()]
        optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)  # after = before - grad
        sums.append(
            update(
                policy, optimizer, batch, tokenizer.pad_token_id, cfg, ONE_PROCESS, nullcontext()
            )[2]
        )
        grads.append([b - p.detach() for b, p in zip(before, policy.parameters())])
    assert micro_batches([len(ids) for ids in batch.token_ids], 2, 30) != micro_batches(
        [0] * 6, 2, 0
    )
    assert max((a - b).abs().max().item() for a, b in zip(*grads)) < 1e-6
    assert max(a.abs().max().item() for a in grads[0]) > 1e-4  # a real gradient
    for key in set(sums[0]) - {"padded_tokens"}:  # the padding of other micro-batches differs
        assert float(sums[0][key]) == pytest.approx(float(sums[1][key]), rel=1e-6, abs=1e-9), key


@pytest.mark.numerics
def test_experience_gives_reference_log_probs_to_all_and_old_ones_after_the_first_update():
    tokenizer = load_tokenizer(TINY)
    batch = random_batch([(7, 3), (5, 11), (9, 2), (6, 8), (4, 13), (8, 5)], seed=1)
    cfg = fake_cfg(logprob_micro_batch=4)
    policy = Policy(load_model(TINY, tokenizer, seed=1))
    reference = Policy(load_model(TINY, tokenizer, seed=2))
    pad, amp = tokenizer.pad_token_id, nullcontext()
    minibatches = experience(policy, reference, batch, 3, pad, cfg, ONE_PROCESS, amp)
    assert [len(m) for m in minibatches] == [2, 2, 2]  # 3 updates of 2 sequences, in order
    ref = sequence_logprobs(reference, batch, pad, cfg, ONE_PROCESS, amp)
    old = sequence_logprobs(policy, batch, pad, cfg, ONE_PROCESS, amp)
    for u, minibatch in enumerate(minibatches):
        assert minibatch.token_ids == batch.token_ids[2 * u : 2 * u + 2]
        # log-probs of the response tokens only: one per response token
        assert [len(lp) for lp in minibatch.logp_ref] == [
            len(s) for s in batch.sampler_logprobs[2 * u : 2 * u + 2]
        ]
        for i in range(2):
            torch.testing.assert_close(minibatch.logp_ref[i], ref[2 * u + i], rtol=0, atol=1e-6)
        # the first mini-batch updates the policy that sampled: its update takes logp_theta itself
        if u == 0:
            assert minibatch.logp_old is None
        else:
            for i in range(2):
                torch.testing.assert_close(minibatch.logp_old[i], old[2 * u + i], rtol=0, atol=1e-6)


def sgd_step(batch: RolloutBatch, divisor: int = 0, **loss) -> tuple[list[torch.Tensor], dict]:
    """The parameter change of one SGD step (lr 1, so the gradient) of a fresh seeded policy on
    `batch` with these loss keys (the update's divisor: `divisor` responses, or all of them), and
    the step's sums."""
    tokenizer = load_tokenizer(TINY)
    cfg = fake_cfg(micro_batch=2)
    cfg.optim.global_batch, cfg.rollout.samples = divisor or len(batch), 1
    for k, v in loss.items():
        setattr(cfg.loss, k, v)
    policy = Policy(load_model(TINY, tokenizer, seed=1))
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    sums = update(policy, optimizer, batch, tokenizer.pad_token_id, cfg, ONE_PROCESS, nullcontext())
    return [b - p.detach() for b, p in zip(before, policy.parameters())], sums[2]


@pytest.mark.numerics
def test_mask_truncated_trains_as_if_the_cut_responses_were_absent():
    # loss.mask_truncated: the gradient of 4 sequences, 2 of them cut, equals that of the other 2
    # with the same divisor (4 responses: seq-mean modes keep every response in the count)
    batch = random_batch([(7, 3), (5, 11), (9, 2), (6, 8)])
    batch.truncated = [False, True, False, True]
    masked, sums = sgd_step(batch, mask_truncated=True)
    alone, _ = sgd_step(batch.select([0, 2]), divisor=4)
    assert max((a - b).abs().max().item() for a, b in zip(masked, alone)) < 1e-6
    assert float(sums["tokens"]) == 3 + 2 and float(sums["all_tokens"]) == 3 + 11 + 2 + 8
    default, _ = sgd_step(batch)  # the paper: the cut ones train too
    assert max((a - b).abs().max().item() for a, b in zip(default, masked)) > 1e-4


@pytest.mark.numerics
def test_rollout_correction_is_one_when_sampler_and_trainer_agree():
    # the sampler's log-probs set to the trainer's own: every weight is exactly 1, so the
    # gradient is the uncorrected one, and nothing is capped
    tokenizer = load_tokenizer(TINY)
    batch = random_batch([(7, 3), (5, 11), (9, 2), (6, 8)])
    policy = Policy(load_model(TINY, tokenizer, seed=1))
    cfg = fake_cfg(logprob_micro_batch=4)
    own = sequence_logprobs(policy, batch, tokenizer.pad_token_id, cfg, ONE_PROCESS, nullcontext())
    batch.sampler_logprobs = [lp.tolist() for lp in own]
    plain, _ = sgd_step(batch)
    for mode in ("token-truncate", "sequence-mask"):
        corrected, sums = sgd_step(batch, rollout_correction=mode)
        assert max((a - b).abs().max().item() for a, b in zip(plain, corrected)) < 1e-6
        assert float(sums["correction"]) == pytest.approx(float(sums["all_tokens"]), abs=1e-4)
        assert float(sums["correction_capped"]) == 0

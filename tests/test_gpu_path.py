"""The GPU node path, held on a CPU (issue: 4 x A6000 made right by construction): the bucketed
weight sync equals the one-at-a-time gather bit for bit, exports gather on rank 0 only, the phase
offload keeps every value and the optimiser's keys, `none` / `phase` / `always` train identical
weights, token-budget micro-batches give the fixed micro-batches' gradient, and one T-GRPO step
calls the engine, the offload and the memory release in the order the node needs (a recording engine
with vLLM's call surface stands in for vLLM)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_train_tgrpo import TORCHRUN, run_cli, run_in_process

from psyrl.core.config import ModelConfig, load_config
from psyrl.core.runlog import read_metrics
from psyrl.recipes import tgrpo as train_tgrpo
from psyrl.rl import update as update_module
from psyrl.runtime import vllm_sampler
from psyrl.runtime.checkpoint import export_hf
from psyrl.runtime.distributed import ONE_PROCESS
from psyrl.runtime.model import Policy, load_model, load_tokenizer
from psyrl.runtime.offload import PhaseOffload
from psyrl.runtime.sampler import TorchSampler

TINY = ModelConfig(
    tokenizer="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
)


@pytest.mark.slow
def test_sync_buckets_rank0_gather_and_phase_offload_on_two_ranks(tmp_path):
    result = subprocess.run(
        [*TORCHRUN, "tests/workers/sync_check.py", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        failed = [k for k, v in got.items() if v is False]
        assert not failed, (rank, failed)
        assert (
            "lm_head.weight" not in got["names tied=True"]
            and "lm_head.weight" in got["names tied=False"]
        )


def test_export_in_bfloat16_states_its_dtype(tmp_path):
    tokenizer = load_tokenizer(TINY)
    policy = Policy(load_model(TINY, tokenizer, seed=2))
    export_hf(policy, tokenizer, tmp_path / "hf", dtype="bfloat16")
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert all(
        torch.equal(tensors[n], p.detach().bfloat16())
        for n, p in policy.lm.state_dict().items()
        if n in tensors
    )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"
    full = tmp_path / "hf32"
    export_hf(policy, tokenizer, full)
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size < 0.6 * (
        full / "model.safetensors"
    ).stat().st_size


# --------------------------------------------------------- the phase order, with a recording engine
class RecordingEngine:
    """vLLM's `LLM` call surface as psyrl uses it (sleep, wake_up, collective_rpc("reload_weights"),
    reset_prefix_cache, generate), recording each call; generation and the weights are a
    TorchSampler's."""

    def __init__(self, events, sampler: TorchSampler):
        self.events, self.sampler, self.sleeping = events, sampler, set()
        self.llm_engine = SimpleNamespace(
            engine_core=SimpleNamespace(shutdown=lambda: events.append("shutdown"))
        )

    def sleep(self, level):
        assert level == 1
        self.events.append("sleep")
        self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags):
        self.events.append(f"wake {tags[0]}")
        self.sleeping -= set(tags)
        # vLLM 0.32: whether the engine is fully awake (llm.py wake_up -> bool)
        return not self.sleeping

    def collective_rpc(self, method, kwargs):
        assert (
            method == "reload_weights"
            and kwargs["is_checkpoint_format"]
            and "weights" not in self.sleeping
        )
        self.events.append("reload")
        self.sampler.load_weights(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        self.events.append("reset prefix cache")
        return True

    def generate(self, prompts, params, use_tqdm):
        assert not self.sleeping, "generate on a sleeping engine waits forever"
        self.events.append("generate")
        out = []
        for prompt, p in zip(prompts, params):
            samples = self.sampler.generate(
                [prompt["prompt_token_ids"]], p.n, p.temperature, p.top_p, p.max_tokens, [p.seed]
            )[0]
            out.append(
                SimpleNamespace(
                    outputs=[
                        SimpleNamespace(
                            index=j,
                            token_ids=list(s.token_ids),
                            finish_reason=s.finish_reason,
                            logprobs=[
                                {t: SimpleNamespace(logprob=lp)}
                                for t, lp in zip(s.token_ids, s.logprobs)
                            ],
                        )
                        for j, s in enumerate(samples)
                    ]
                )
            )
        return out


def recording_sampler(events, policy, cfg, tokenizer):
    """A VLLMSampler as `build_sampler` makes it on a GPU (sleep mode on), on the recording
    engine."""
    sampler = vllm_sampler.VLLMSampler.__new__(vllm_sampler.VLLMSampler)
    inner = TorchSampler(
        load_model(cfg.model, tokenizer), tokenizer, torch.device("cpu"), cfg.sampler.batch
    )
    sampler.tokenizer, sampler.dist, sampler.tp, sampler.progress = tokenizer, ONE_PROCESS, 1, False
    sampler.stops, sampler.tied, sampler.sleeps = inner.stops, True, True
    sampler.dtype = torch.float32
    sampler.asleep, sampler.logprobs_mode = set(), "raw_logprobs"
    sampler.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    sampler.llm = RecordingEngine(events, inner)
    train_tgrpo.sync_weights(sampler, policy, cfg, ONE_PROCESS)
    return sampler


def test_one_step_runs_the_node_phases_in_order(start, tmp_path, monkeypatch):
    events = []

    def recorded(name, fn):
        def call(*args, **kwargs):
            events.append(name)
            return fn(*args, **kwargs)

        return call

    offload = PhaseOffload
    monkeypatch.setattr(offload, "to_host", recorded("shards to host", offload.to_host))
    monkeypatch.setattr(offload, "to_device", recorded("shards to device", offload.to_device))
    monkeypatch.setattr(vllm_sampler, "release_memory", lambda device: events.append("empty cache"))
    monkeypatch.setattr(
        update_module,
        "sequence_logprobs",
        recorded("experience", update_module.sequence_logprobs),
    )
    monkeypatch.setattr(train_tgrpo, "update", recorded("update", train_tgrpo.update))
    monkeypatch.setattr(
        train_tgrpo,
        "build_sampler",
        lambda policy, cfg, tokenizer, dist, **_: recording_sampler(events, policy, cfg, tokenizer),
    )
    # 2 steps of 2 updates
    result = run_in_process(start, tmp_path, "fsdp.offload=phase", "checkpoint.every=0")
    assert result.exit_code == 0, result.output
    start_up = [
        "shards to host",  # before the engine starts: vLLM's pool must fit in what is free
        # the first sync, engine awake
        "empty cache",
        "reload",
        "reset prefix cache",
        "empty cache",
    ]
    step = [
        "generate",
        "sleep",
        "empty cache",  # the engine's memory back to the GPU
        # phase offload: shards and AdamW state back for the experience and the update
        "shards to device",
        # reference log-probs, then logp_old of the second mini-batch only
        "experience",
        "experience",
        "update",
        "update",
        "shards to host",  # the device is the engine's again
        # the weight sync
        "empty cache",
        "wake weights",
        "reload",
        "reset prefix cache",
        "empty cache",
    ]
    # the next generate frees cached blocks before the KV cache returns
    between = ["empty cache", "wake kv_cache"]
    assert events == start_up + step + between + step + ["shutdown"], events


def test_modes_offload_train_identical_weights_on_two_ranks(start, tmp_path):
    # 3 steps of 8 prompts, 2 updates each, float32 on 2 gloo ranks: where the shards live changes
    # no number
    finals = {}
    for mode in ("none", "phase", "always"):
        run_cli(start, tmp_path / mode, f"fsdp.offload={mode}", "run.steps=3", ranks=2)
        finals[mode] = load_file(tmp_path / mode / "rl" / "hf" / "model.safetensors")
        rows = read_metrics(tmp_path / mode / "rl" / "metrics.jsonl")
        finals[mode + " rows"] = [
            {k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows
        ]
    for mode in ("phase", "always"):
        assert finals[mode].keys() == finals["none"].keys()
        assert all(torch.equal(finals[mode][k], finals["none"][k]) for k in finals["none"]), mode
        assert finals[mode + " rows"] == finals["none rows"], mode


test_modes_offload_train_identical_weights_on_two_ranks = pytest.mark.slow(
    test_modes_offload_train_identical_weights_on_two_ranks
)


@pytest.mark.slow
def test_token_budget_and_deferred_sync_on_two_ranks_give_the_same_first_update(start, tmp_path):
    # one update per step: each rank packs its 8 sequences by tokens, the ranks agree on a
    # micro-batch count
    # (fillers of weight 0 where a rank has fewer); the gradient norm is that of fixed micro-batches
    norms = {}
    for name, extra in (
        ("fixed", []),
        ("budget", ["optim.micro_batch_tokens=120", "optim.logprob_micro_batch_tokens=90"]),
        # one reduce-scatter at the last micro-batch
        ("deferred", ["fsdp.defer_grad_sync=true"]),
    ):
        run_cli(start, tmp_path / name, "rollout.prompts=4", "run.steps=1", *extra, ranks=2)
        norms[name] = read_metrics(tmp_path / name / "rl" / "metrics.jsonl")[0]["actor/grad_norm"]
    assert norms["budget"] == pytest.approx(norms["fixed"], rel=1e-5)
    assert norms["deferred"] == pytest.approx(norms["fixed"], rel=1e-5)


@pytest.mark.gpu
def test_phase_offload_frees_the_device():
    tokenizer = load_tokenizer(TINY)
    model = Policy(load_model(TINY, tokenizer, device="cuda"))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.arange(8, device="cuda")[None], torch.ones(1, 8, device="cuda")).sum().backward()
    optimizer.step()
    offload = PhaseOffload(model, optimizer, torch.device("cuda"), enabled=True)
    # the tiny model's head is tied to its embedding
    values = [p.detach().clone() for p in model.parameters()]
    moments = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]
    held = torch.cuda.memory_allocated()
    offload.to_host()
    assert torch.cuda.memory_allocated() < held / 4 and next(model.parameters()).is_pinned()
    assert all(torch.equal(p.detach().cuda(), v) for p, v in zip(model.parameters(), values))
    offload.to_device()
    assert (
        next(model.parameters()).is_cuda
        and optimizer.state[next(model.parameters())]["exp_avg"].is_cuda
    )
    assert all(torch.equal(p.detach(), v) for p, v in zip(model.parameters(), values))
    assert all(
        torch.equal(optimizer.state[p]["exp_avg"], m) for p, m in zip(model.parameters(), moments)
    )
    assert model.lm.lm_head.weight is model.lm.model.embed_tokens.weight  # still tied


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_start_up_memory_check_refuses_what_cannot_fit(monkeypatch, capsys, tmp_path):
    from psyrl.core.errors import RunError
    from psyrl.run import launch as run
    from psyrl.runtime.distributed import Dist

    # the node's RAM comes from os.sysconf below alone: no cgroup limit of the machine running this
    monkeypatch.setattr(run, "PROC_CGROUP", tmp_path / "no-cgroup")

    gib = {"value": 8}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(total_memory=gib["value"] * 2**30),
    )
    # read only by the planner here
    gpu = Dist(rank=0, world=4, local_world=4, device=torch.device("cuda", 0))
    cfg = load_config("configs/tgrpo/qwen2.5-3b.toml")
    with pytest.raises(
        RunError, match=r"memory plan: \w+ needs .* GiB of 8: set .*run.memory_check"
    ):
        run.check_memory_plan(cfg, gpu, "tgrpo")
    cfg.run.memory_check = False  # printed, not refused
    run.check_memory_plan(cfg, gpu, "tgrpo")
    assert "GiB of 8: set" in capsys.readouterr().out
    gib["value"] = 48
    cfg.run.memory_check = True
    # a node of 16 GiB: warned, not refused
    host = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 16 * 2**30 // 4096}
    monkeypatch.setattr(run.os, "sysconf", lambda name: host[name])
    run.check_memory_plan(cfg, gpu, "tgrpo")
    assert "memory plan: host RAM needs" in capsys.readouterr().out
    host["SC_PHYS_PAGES"] = 512 * 2**30 // 4096
    run.check_memory_plan(cfg, gpu, "tgrpo")
    assert "memory plan: fits 4 x 48 GiB" in capsys.readouterr().out
    run.check_memory_plan(cfg, ONE_PROCESS, "tgrpo")  # on a CPU: nothing to plan
    assert capsys.readouterr().out == ""

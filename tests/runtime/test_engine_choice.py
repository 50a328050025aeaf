"""`sampler.engine`: a CPU install never imports vLLM, and asking for it without it installed is one
clear message before anything starts; the tied LM head's alias in the weight stream
(tests/test_vllm_*.py run a real engine)."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import evaluate
import psyrl.cli.train
from psyrl.core.config import ConfigError, load_config
from psyrl.runtime.vllm_sampler import _with_tied_head

HAS_VLLM = importlib.util.find_spec("vllm") is not None
COMMANDS = {
    "train_tgrpo.py": psyrl.cli.train.train_tgrpo,
    "train_sft.py": psyrl.cli.train.train_sft,
    "evaluate.py": evaluate.evaluate,
}


def refused(script: str, args: list[str]) -> str:
    """The script's command in this process (each refusal comes before anything starts): its one
    message, with exit status 1 and no traceback."""
    result = CliRunner().invoke(COMMANDS[script], args)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result.stderr


def test_no_entry_point_imports_vllm():
    code = (
        "import sys, train_tgrpo, train_sft, evaluate, psyrl.cli, psyrl.run.directory, "
        "psyrl.runtime.vllm_sampler; print('vllm' in sys.modules or any(m.startswith('vllm.') for "
        "m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
@pytest.mark.parametrize("script", ["train_tgrpo.py", "train_sft.py"])
def test_the_vllm_engine_without_vllm_is_one_message_and_writes_nothing(script, tmp_path):
    config = "configs/tgrpo/tiny.toml" if script == "train_tgrpo.py" else "configs/sft/tiny.toml"
    args = ["--config", config, "--set", "sampler.engine=vllm"]
    args += ["--set", f"run.output_dir={json.dumps(str(tmp_path))}"]
    message = refused(script, args)
    assert "sampler.engine = 'vllm' needs vLLM 0.32.0: pip install 'psyrl[vllm]'" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_evaluate_engine_vllm_without_vllm_is_one_message(tmp_path):
    args = ["--model", "psyrl/assets/tokenizers/tiny", "--engine", "vllm"]
    assert "needs vLLM 0.32.0" in refused("evaluate.py", [*args, "--out", str(tmp_path / "eval")])
    assert not (tmp_path / "eval").exists()


def test_tensor_parallel_is_a_vllm_setting_the_torch_engine_ignores(tmp_path):
    # the Qwen configs carry A.3's tensor_parallel = 2 for vLLM; with the torch engine one process
    # must still run
    args = [
        "--config",
        "configs/tgrpo/qwen2.5-0.5b.toml",
        "--set",
        "sampler.engine=torch",
        "--set",
        "model.path=/nonexistent",
        "--set",
        "data.train_file=data/demo/train.jsonl",
        "--set",
        'data.valid_file=""',
        "--set",
        f"run.output_dir={json.dumps(str(tmp_path))}",
    ]
    message = refused("train_tgrpo.py", args)
    assert "no such model directory: /nonexistent" in message and "tensor_parallel" not in message


@pytest.mark.parametrize(
    "override, message",
    [
        ("sampler.engine=hf", "sampler.engine"),
        ("sampler.tensor_parallel=0", "expected >= 1, got 0"),
        ("sampler.gpu_memory_utilization=1.5", "expected 0 < gpu_memory_utilization <= 1, got 1.5"),
    ],
)
def test_bad_sampler_settings_are_refused(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config("configs/tgrpo/tiny.toml", [override])


def test_a_tied_head_is_sent_under_its_own_name_right_after_the_embedding():
    emb, norm = torch.ones(2), torch.zeros(2)
    stream = [("model.embed_tokens.weight", emb), ("model.norm.weight", norm)]
    sent = list(_with_tied_head(iter(stream), tied=True))
    assert [n for n, _ in sent] == [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
    ]
    assert sent[1][1] is emb  # the same tensor, no copy
    assert list(_with_tied_head(iter(stream), tied=False)) == stream

"""Validation on the whole held-out split (`data.valid_items = 0`, the Qwen T-GRPO configs): every
item is scored, generated in batches of the sampler's size, and written to validation.jsonl."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psyrl.core.config import ModelConfig, load_config
from psyrl.core.records import load_records, load_stimuliqa, write_jsonl
from psyrl.run.validation import sample_items, validate
from psyrl.runtime.model import Policy, load_model, load_tokenizer
from psyrl.runtime.sampler import TorchSampler

ITEMS = 13  # not a multiple of the batch: the last batch is short


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "test.jsonl"
    write_jsonl(path, load_stimuliqa("data/demo/test.jsonl")[:ITEMS])
    return path


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "3b"])
def test_qwen_tgrpo_configs_validate_on_every_test_item(size, held_out):
    # A.3's "validation batch size 1024" is EasyR1's val data-loader batch: the whole test split
    cfg = load_config(f"configs/tgrpo/qwen2.5-{size}.toml")
    assert cfg.data.valid_items == 0 and cfg.data.valid_file == "data/stimuliqa/test.jsonl"
    records = load_records(held_out)
    assert sample_items(records, cfg.data.valid_items, cfg.run.seed) == records


class CountingSampler(TorchSampler):
    """The torch sampler, recording how many sequences each of its forward batches holds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches = []

    def _generate_rows(self, prompts, n, *args):
        self.batches.append(len(prompts) * n)
        return super()._generate_rows(prompts, n, *args)


def test_whole_split_validation_generates_in_sampler_batches(tmp_path, held_out):
    config = tmp_path / "c.toml"
    config.write_text(
        f'[data]\nvalid_file = "{held_out}"\nvalid_items = 0\n'
        "[rollout]\nmax_new_tokens = 4\n[sampler]\nbatch = 4\n"
    )
    cfg = load_config(config)
    model_cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    tokenizer = load_tokenizer(model_cfg)
    model = load_model(model_cfg, tokenizer, seed=0)
    sampler = CountingSampler(model, tokenizer, model.device, batch=cfg.sampler.batch)
    records = sample_items(load_records(cfg.data.valid_file), cfg.data.valid_items, cfg.run.seed)
    metrics, outputs = validate(Policy(model), sampler, tokenizer, records, cfg)
    assert metrics["valid/items"] == len(outputs) == ITEMS
    assert sampler.batches == [4, 4, 4, 1]  # sampler.batch at a time, not all 13 at once


def test_train_sft_writes_a_row_per_held_out_item(tmp_path, held_out):
    # the programs' path: config -> sample_items -> validate -> checkpoints/step-N/validation.jsonl
    config = tmp_path / "sft.toml"
    config.write_text(
        Path("configs/sft/tiny.toml").read_text().replace("valid_items = 120", "valid_items = 0")
    )
    sets = [
        f"run.output_dir={json.dumps(str(tmp_path / 'runs'))}",
        f"data.valid_file={json.dumps(str(held_out))}",
        "run.steps=1",
        "checkpoint.every=1",
        "model.hidden_size=32",
        "model.num_layers=1",
        "model.intermediate_size=64",
        "optim.global_batch=2",
        "optim.micro_batch=2",
        "rollout.max_new_tokens=4",
        "sampler.batch=4",
        "log.progress=false",
    ]
    args = [sys.executable, "train_sft.py", "--config", str(config)]
    result = subprocess.run(
        args + [a for s in sets for a in ("--set", s)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{ITEMS} validation items" in result.stdout
    step = tmp_path / "runs" / "tiny-sft" / "checkpoints" / "step-1"
    rows = [json.loads(line) for line in (step / "validation.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r.id for r in load_stimuliqa(held_out)]
    assert json.loads((step / "validation.json").read_text())["valid/items"] == ITEMS

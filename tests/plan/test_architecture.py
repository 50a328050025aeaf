"""psyrl.plan.architecture: parameter counts against transformers, and where a plan's architecture
comes from (model.path's config.json, psyrl's shipped copies, the tiny model)."""

import pytest
import torch
from plan_models import architecture
from transformers import AutoModelForCausalLM

from psyrl.core.config import load_config
from psyrl.plan.architecture import load_architecture, shapes

# Qwen2.5-*-Instruct totals, tied head counted once
SIZES = {"0.5b": 494.0e6, "1.5b": 1543.7e6, "3b": 3085.9e6}


@pytest.mark.parametrize("size", SIZES)
def test_parameter_counts_equal_transformers(size):
    arch = architecture(size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(arch)
    expected = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    assert shapes(arch).params == expected
    assert expected == pytest.approx(SIZES[size], abs=0.05e6)
    assert (
        sum(s.numel() for s in [*model.model.layers[0].parameters()]) == shapes(arch).layer_params
    )


def test_architecture_sources(tmp_path):
    cfg = load_config("configs/tgrpo/qwen2.5-3b.toml")
    # models/Qwen2.5-3B-Instruct is not here: the shipped copy
    arch, source = load_architecture(cfg.model)
    assert arch.hidden_size == 2048 and "qwen2.5-3b-instruct" in source
    # any case, anywhere in the path
    cfg.model.path = "runs/QWEN2.5-1.5B-sft/checkpoints/step-35/hf"
    assert load_architecture(cfg.model)[0].hidden_size == 1536
    architecture("0.5b").save_pretrained(tmp_path / "mine")  # a directory with a config.json wins
    cfg.model.path = str(tmp_path / "mine")
    arch, source = load_architecture(cfg.model)
    assert arch.hidden_size == 896 and source == str(tmp_path / "mine" / "config.json")
    cfg.model.path = str(tmp_path / "Llama-3-8B")
    with pytest.raises(ValueError, match="Llama-3-8B"):
        load_architecture(cfg.model)
    cfg.model.path = ""  # the tiny model of [model]
    assert load_architecture(cfg.model)[0].hidden_size == cfg.model.hidden_size

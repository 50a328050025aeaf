"""Encoder directories that must not run their own code or end in a traceback: tiny BERT encoders
built in tmp_path, then given custom code (`auto_map`), no weights or a broken config.json. The
semantic signal loads without remote code and says what is wrong in one line naming the
directory; nothing reaches stdout (`psyrl reward score` prints JSON there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from psyrl.rl.accuracy import Pair
from psyrl.signals.semantic import SemanticError, SemanticSignal

WORDS = ["very", "angry", "calm", "proud", "sad"]


def tiny_encoder(directory: Path) -> Path:
    """A 1-layer, 8-wide BERT with a 10-word vocabulary: a Hugging Face encoder directory."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=32,
    )
    BertModel(config).save_pretrained(directory)
    return directory


def with_custom_code(directory: Path, model_type: str) -> Path:
    """`directory` whose config.json asks for its own code (evil.py), which would leave a marker
    file if it ever ran."""
    (directory / "evil.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(directory / 'RAN')!r}).write_text('ran')\n"
        "from transformers import BertConfig, BertModel\n"
        "class EvilConfig(BertConfig):\n    model_type = 'psyrl-evil'\n"
        "class EvilModel(BertModel):\n    config_class = EvilConfig\n"
    )
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
def encoder(tmp_path) -> Path:
    return tiny_encoder(tmp_path / "encoder")


def test_a_tiny_encoder_loads_and_scores(encoder):
    signal = SemanticSignal(encoder)
    scores = signal([Pair("very angry", "very angry"), Pair("proud", "")])
    assert scores[0] > 0.99 and scores[1] == 0


def test_an_encoder_asking_for_its_own_code_is_refused_without_a_prompt(encoder, capsys):
    # an unknown model_type with an auto_map: transformers asked "Do you wish to run the custom
    # code? [y/N]" on stdout, mixed into `psyrl reward score`'s JSON, then raised a ValueError
    with_custom_code(encoder, "psyrl-evil")
    with pytest.raises(SemanticError) as raised:
        SemanticSignal(encoder)
    message = str(raised.value)
    assert message.startswith(f"{encoder}: ") and "\n" not in message
    assert "its own code" in message and "auto_map" in message
    out, err = capsys.readouterr()
    assert out == "" and "[y/N]" not in err
    assert not (encoder / "RAN").exists()


def test_a_known_architecture_with_an_auto_map_loads_without_its_code(encoder, capsys):
    with_custom_code(encoder, "bert")
    signal = SemanticSignal(encoder)
    assert type(signal.model) is BertModel  # transformers' own class, not evil.EvilModel
    assert capsys.readouterr().out == "" and not (encoder / "RAN").exists()


@pytest.mark.parametrize("weights", ["model.safetensors"])
def test_a_directory_without_weights_is_one_line(encoder, capsys, weights):
    (encoder / weights).unlink()
    with pytest.raises(SemanticError) as raised:
        SemanticSignal(encoder)
    message = str(raised.value)
    assert message.startswith(f"{encoder}: ") and "\n" not in message
    assert "no weights" in message and "model.safetensors" in message
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_weights_are_one_line(encoder, capsys, damage):
    weights = encoder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"\x00" * 64 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(SemanticError) as raised:  # was safetensors' SafetensorError, a traceback
        SemanticSignal(encoder)
    message = str(raised.value)
    assert message.startswith(f"{encoder}: cannot load the encoder") and "\n" not in message
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{garbage", "config.json is not JSON"),
        ("[]", "config.json is not a JSON object"),
        ('{"hidden_size": 8}', "config.json names no model_type"),
        ('{"model_type": "no-such-architecture"}', "no-such-architecture"),
    ],
)
def test_a_bad_config_is_one_line(encoder, capsys, text, problem):
    (encoder / "config.json").write_text(text)
    with pytest.raises(SemanticError) as raised:
        SemanticSignal(encoder)
    message = str(raised.value)
    assert message.startswith(f"{encoder}") and "\n" not in message
    assert problem in message
    assert capsys.readouterr().out == ""


def test_a_directory_without_a_tokenizer_is_one_line(encoder, capsys):
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        (encoder / name).unlink(missing_ok=True)
    with pytest.raises(SemanticError) as raised:
        SemanticSignal(encoder)
    message = str(raised.value)
    assert message.startswith(f"{encoder}: ") and "\n" not in message
    assert "tokenizer" in message
    assert capsys.readouterr().out == ""

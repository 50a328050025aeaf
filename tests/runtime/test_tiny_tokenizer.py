"""psyrl's small tokenizer: Qwen2.5's special tokens and chat template, rebuilt byte for byte from
the demo set."""

import pytest

from psyrl.core.config import ModelConfig
from psyrl.runtime import tiny_tokenizer
from psyrl.runtime.model import load_tokenizer, shipped_tokenizer_dir


@pytest.fixture(scope="module")
def tokenizers():
    return load_tokenizer(ModelConfig(tokenizer="tiny")), load_tokenizer(
        ModelConfig(tokenizer="qwen2.5")
    )


def test_shipped_files_rebuild_identically(tmp_path):
    tiny_tokenizer.build_shipped("data/demo", tmp_path)
    shipped = shipped_tokenizer_dir("tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_same_special_tokens_and_template_as_qwen(tokenizers):
    tiny, qwen = tokenizers
    assert 2000 < len(tiny) < 5000
    specials = [qwen.convert_ids_to_tokens(i) for i in range(151643, 151665)]
    first = tiny.convert_tokens_to_ids(specials[0])
    # appended after the BPE, in order
    assert tiny.convert_tokens_to_ids(specials) == list(range(first, first + 22))
    assert (tiny.eos_token, tiny.pad_token, tiny.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    chat = [
        {"role": "user", "content": "Stimuli: I lost my keys.\nQuestion: How did I feel?"},
        {"role": "assistant", "content": "<think>keys</think><answer>annoyed</answer>"},
    ]
    assert tiny.apply_chat_template(chat, tokenize=False) == qwen.apply_chat_template(
        chat, tokenize=False
    )
    ids = tiny(tiny.apply_chat_template(chat, tokenize=False))["input_ids"]
    assert (
        ids[0] == tiny.convert_tokens_to_ids("<|im_start|>") and ids.count(tiny.eos_token_id) == 3
    )


@pytest.mark.parametrize(
    "text", ["I felt proud — “really” proud!", "naïve café 東京 🙂", "  two  spaces\n\ttab"]
)
def test_any_text_round_trips(tokenizers, text):
    tiny, _ = tokenizers
    assert tiny.decode(tiny(text)["input_ids"]) == text  # byte-level: nothing is unknown

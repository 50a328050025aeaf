"""psyrl's small tokenizer for tiny CPU models: Qwen2.5's pre-tokenizer, special tokens and chat
template with a byte-level BPE vocabulary of a few thousand tokens trained on the demo set's
training split.

Built deterministically from `data/demo/` by `psyrl tiny-tokenizer` and shipped in
`psyrl/assets/tokenizers/tiny/`; a test rebuilds it and compares the bytes.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from psyrl.core.config import ModelConfig
from psyrl.core.prompts import INSTRUCTIONS, content
from psyrl.core.records import load_stimuliqa, sft_target
from psyrl.runtime.model import load_tokenizer, shipped_tokenizer_dir

DEFAULT_VOCAB = 4096


def demo_corpus(demo_dir: str | Path) -> list[str]:
    """The training split's prompts and SFT targets plus the instructions, in file order (a stable
    result); held-out and multiple-choice items stay out, so even the vocabulary has not seen
    them."""
    texts = list(INSTRUCTIONS.values())
    for r in load_stimuliqa(Path(demo_dir) / "train.jsonl"):
        texts += [content(r), sft_target(r, "cot") or "", sft_target(r, "direct")]
    return texts


def build(texts: list[str], vocab_size: int = DEFAULT_VOCAB) -> PreTrainedTokenizerFast:
    """Train the BPE on `texts`; the 22 Qwen2.5 special tokens are appended after it, as in
    Qwen2.5."""
    qwen = load_tokenizer(ModelConfig(tokenizer="qwen2.5"))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    # Qwen2.5's own split regex then byte-level mapping, read from the shipped files rather than
    # re-typed
    tokenizer.pre_tokenizer = qwen.backend_tokenizer.pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    added = [qwen.added_tokens_decoder[i] for i in sorted(qwen.added_tokens_decoder)]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        clean_up_tokenization_spaces=False,
        model_max_length=qwen.model_max_length,
    )
    # in Qwen2.5's order, so <|endoftext|>, <|im_start|>, <|im_end|> stay consecutive
    fast.add_tokens(added)
    fast.eos_token, fast.pad_token = qwen.eos_token, qwen.pad_token
    fast.chat_template = qwen.chat_template
    return fast


def write(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))


def build_shipped(demo_dir: str | Path = "data/demo", out_dir: str | Path | None = None) -> Path:
    """Rebuild `psyrl/assets/tokenizers/tiny/` (or `out_dir`) from the demo set."""
    out = Path(out_dir) if out_dir is not None else shipped_tokenizer_dir("tiny")
    write(build(demo_corpus(demo_dir)), out)
    return out

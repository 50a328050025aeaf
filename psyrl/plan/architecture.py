"""The architecture a plan is made for: a model's config.json (model.path's, psyrl's shipped copy of
the Qwen2.5-Instruct size the path names, or the tiny model of [model]) read as the parameter shapes
FSDP2 shards (`Shapes`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from transformers import AutoConfig

from psyrl.core.config import ModelConfig
from psyrl.runtime.model import load_tokenizer, model_config

# Qwen2.5-{0.5B,1.5B,3B}-Instruct in a path
SHIPPED = re.compile(r"qwen2\.5-(0\.5|1\.5|3)b", re.IGNORECASE)


def shipped_architecture_dir(path: str) -> Path | None:
    """The shipped config.json directory of the Qwen2.5-Instruct size named anywhere in `path`, or
    None."""
    match = SHIPPED.search(path)
    if match is None:
        return None
    return Path(
        str(resources.files("psyrl") / "assets" / "models" / f"qwen2.5-{match.group(1)}b-instruct")
    )


def load_architecture(model_cfg: ModelConfig) -> tuple[object, str]:
    """(PretrainedConfig, where it came from) for a [model] table: model.path's config.json; else
    the shipped copy whose size the path names (Qwen2.5-0.5B/1.5B/3B-Instruct, any case); else, with
    an empty path, the tiny model of the table. ValueError naming the path otherwise."""
    if not model_cfg.path:
        return model_config(model_cfg, load_tokenizer(model_cfg)), "the tiny model of [model]"
    directory = Path(model_cfg.path).expanduser()
    if (directory / "config.json").is_file():
        return AutoConfig.from_pretrained(str(directory)), str(directory / "config.json")
    shipped = shipped_architecture_dir(model_cfg.path)
    if shipped is None:
        raise ValueError(
            f"model.path = {model_cfg.path!r}: no config.json there, and the path names none of "
            "the architectures psyrl ships (Qwen2.5-0.5B/1.5B/3B-Instruct); point model.path at a "
            "Hugging Face model directory"
        )
    return AutoConfig.from_pretrained(str(shipped)), f"psyrl's copy of {shipped.name}/config.json"


@dataclass(frozen=True)
class Shapes:
    """A Qwen2 causal LM as parameter shapes: one decoder layer's, and the root unit's (embedding,
    final norm and, when untied, the LM head), in the order FSDP2 shards them."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    layer: tuple[tuple[int, ...], ...]
    root: tuple[tuple[int, ...], ...]

    @property
    def layer_params(self) -> int:
        return sum(math.prod(s) for s in self.layer)

    @property
    def root_params(self) -> int:
        return sum(math.prod(s) for s in self.root)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def shard(self, world: int, unit: str = "all") -> int:
        """Elements of one rank's FSDP2 shard: each parameter's dim 0 is padded to a multiple of
        `world` and split, ceil(dim0 / world) x rest on every rank (FSDP2 `_init_sharded_param`:
        chunks[0] is the padded size). Rank 0 holds exactly this many; the last ranks hold fewer
        real elements in storage of this size."""
        per = lambda shapes: sum(-(-s[0] // world) * math.prod(s[1:]) for s in shapes)
        if unit == "layer":
            return per(self.layer)
        if unit == "root":
            return per(self.root)
        return self.layers * per(self.layer) + per(self.root)


def shapes(architecture) -> Shapes:
    """The parameter shapes of a transformers Qwen2 config (modeling_qwen2.py: q/k/v projections
    with bias, o_proj and the SiLU MLP without, two RMSNorm gains per layer, the final norm,
    embedding and LM head)."""
    if getattr(architecture, "model_type", None) != "qwen2":
        raise ValueError(
            f"psyrl plan models Qwen2 architectures (model_type 'qwen2'), not "
            f"{getattr(architecture, 'model_type', None)!r}"
        )
    H, nh = architecture.hidden_size, architecture.num_attention_heads
    nkv = architecture.num_key_value_heads
    hd = getattr(architecture, "head_dim", None) or H // nh
    ffn, V = architecture.intermediate_size, architecture.vocab_size
    # q, k, v (+ bias)
    layer = (
        (nh * hd, H),
        (nh * hd,),
        (nkv * hd, H),
        (nkv * hd,),
        (nkv * hd, H),
        (nkv * hd,),
        # o_proj, gate, up, down, the two RMSNorms
        (H, nh * hd),
        (ffn, H),
        (ffn, H),
        (H, ffn),
        (H,),
        (H,),
    )
    tied = bool(architecture.tie_word_embeddings)
    root = ((V, H), (H,)) + (() if tied else ((V, H),))  # embedding, final norm, untied LM head
    return Shapes(H, architecture.num_hidden_layers, nh, nkv, hd, ffn, V, tied, layer, root)

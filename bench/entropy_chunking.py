"""Where two chunkings of the LM head's log-prob pass differ (docs/install.md, "What holds across
machines"): the tiny model's logits over 3 rows at a time against all rows at once, and the entropy
from each. `ATEN_CPU_CAPABILITY=L python bench/entropy_chunking.py` prints, for kernel set L, the
largest logit difference, the largest entropy difference, the same with equal logits (0: the
row-wise sums do not depend on the chunk), and the largest entropy."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

TESTS = Path(__file__).parents[1] / "tests"
sys.path[:0] = [str(TESTS / "runtime"), str(TESTS)]
from test_entropy import SHAPES  # noqa: E402
from test_model_packing import TINY  # noqa: E402

from psyrl.runtime.model import collate, load_model, load_tokenizer  # noqa: E402


def entropy(z: torch.Tensor) -> torch.Tensor:
    logp = z - torch.logsumexp(z, -1, keepdim=True)  # [N, V]
    return logp.exp().mul(logp).sum(-1).neg()  # [N]


def main() -> None:
    model = load_model(TINY, load_tokenizer(TINY), seed=3)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(10, 200, (p + r,), generator=g).tolist() for p, r in SHAPES]
    input_ids, attention_mask, mask = collate(ids, [p for p, _ in SHAPES], 0)
    with torch.no_grad():
        out = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask)
        hidden = out.last_hidden_state[:, :-1][mask]  # [N, H]
        weight = model.get_output_embeddings().weight  # [V, H]
        chunks = range(0, len(hidden), 3)
        by3 = torch.cat([F.linear(hidden[i : i + 3], weight) for i in chunks])  # [N, V]
        whole = F.linear(hidden, weight)  # [N, V]
        same = torch.cat([entropy(whole[i : i + 3]) for i in chunks])
        print(f"rows {len(hidden)}, vocabulary {weight.shape[0]}")
        print(f"logits, 3 rows vs all: {(by3 - whole).abs().max().item():.3g}")
        print(f"entropy from them: {(entropy(by3) - entropy(whole)).abs().max().item():.3g}")
        print(f"entropy, equal logits, 3 rows vs all: {(same - entropy(whole)).abs().max():.3g}")
        print(f"largest entropy: {entropy(whole).max().item():.4f}")


if __name__ == "__main__":
    main()

"""psyrl.plan.phases: the update's FSDP2 shard, gradient and AdamW bytes per rank, against 2 gloo
ranks (tests/workers/fsdp_memory_probe.py) and by hand."""

import json
import os
import subprocess
import sys

import pytest
from plan_models import SETTINGS, SMALL, SMALL_PARAMS
from workers.fsdp_memory_probe import MODEL as PROBE_MODEL

from psyrl.core.config import load_config
from psyrl.plan.phases import GIB
from psyrl.plan.planner import plan
from psyrl.runtime.model import load_tokenizer, model_config


@pytest.mark.slow
def test_fsdp_shard_bytes_equal_measurement(tmp_path):
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "tests/workers/fsdp_memory_probe.py",
        str(tmp_path),
    ]
    result = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    cfg = load_config(
        None,
        [
            f"model.{k}={getattr(PROBE_MODEL, k)}"
            for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
        ],
    )
    arch = model_config(cfg.model, load_tokenizer(cfg.model))
    update = next(p for p in plan(cfg, arch, 2, 48).phases if p.name == "update")
    for part, key in (("params", "params"), ("grads", "grads"), ("adam", "adam")):
        # rank 0 holds the ceil share exactly
        assert ranks[0][key]["local"] == update.parts[part], part
    # intermediate_size 129 does not split evenly: rank 1 holds fewer real elements, in storage
    # FSDP2 padded to rank 0's size for parameters and gradients (AdamW's zeros_like state is
    # unpadded)
    assert ranks[1]["params"]["local"] < ranks[0]["params"]["local"]
    assert ranks[1]["params"]["storage"] == ranks[1]["grads"]["storage"] == update.parts["params"]
    assert ranks[1]["adam"]["storage"] == ranks[1]["adam"]["local"] < update.parts["adam"]


def test_update_parts_are_fsdp_shards():
    """The update's float32 parameter, gradient and AdamW parts are 4, 4 and 8 B per parameter of
    one rank's padded shard, and the gathered part holds the root unit and two layer units in
    bf16."""
    result = plan(load_config(None, [*SETTINGS, 'fsdp.offload="none"']), SMALL, 2, 48)
    update = next(p for p in result.phases if p.name == "update")
    assert (update.parts["params"], update.parts["grads"], update.parts["adam"]) == (
        4 * SMALL_PARAMS / 2,
        4 * SMALL_PARAMS / 2,
        8 * SMALL_PARAMS / 2,
    )
    assert update.parts["gathered"] == 2 * (67_109_888 + 2 * 15_207_936)
    assert update.total < 48 * GIB

"""The FSDP2 internals psyrl/runtime/offload.py relies on, checked on a 1-process gloo FSDP2 model.

FSDP2 has no public API that names a parameter's padded shard storage (torch 2.13
torch/distributed/fsdp/__init__.py exports fully_shard, FSDPModule and the policies; FSDPModule's
public methods reshard, unshard and set_*), so `HostBlock` reads each unit's FSDPParams and
re-points their padded shard data at its own host slots. A torch upgrade that renames or retypes
any of them fails here, naming what changed, instead of as a wrong byte count or a silent copy in a
2-rank run."""

import pytest
import torch
import torch.distributed as tdist
from test_offload import tiny  # the offload tests' tiny Qwen2 policy
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from psyrl.runtime.distributed import Dist, cleanup, shard
from psyrl.runtime.offload import HostBlock, fsdp_params

TORCH = f"torch {torch.__version__}"
FSDP = "torch/distributed/fsdp/_fully_shard/"


def need(obj, attr: str, kind: type, cited: str):
    """`obj.attr`, failing with what changed when it is missing or of another type."""
    owner = type(obj).__name__
    if not hasattr(obj, attr):
        pytest.fail(
            f"{TORCH}: {owner}.{attr} no longer exists (torch 2.13 {cited}); "
            "psyrl/runtime/offload.py HostBlock reads it: port it to this torch"
        )
    value = getattr(obj, attr)
    if not isinstance(value, kind):
        pytest.fail(
            f"{TORCH}: {owner}.{attr} is a {type(value).__name__}, not a {kind.__name__} (torch "
            f"2.13 {cited}); psyrl/runtime/offload.py HostBlock relies on it"
        )
    return value


@pytest.fixture
def dist(tmp_path):
    """A 1-rank gloo process group (a file store: no port) and its FSDP mesh. The test builds its
    model itself: a model still held at `cleanup` would keep gloo's threads alive (cleanup's
    docstring)."""
    assert not tdist.is_initialized(), "a process group was left open by an earlier test"
    tdist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    one = Dist(mesh=mesh)
    try:
        yield one
    finally:
        cleanup(one)


def test_fsdp_param_fields_exist_with_their_types(dist):
    sharded = shard(tiny(True), dist)
    units = [m for m in sharded.modules() if isinstance(m, FSDPModule)]
    assert len(units) == 3  # two decoder layers, then the root
    for unit in units:
        if not callable(getattr(unit, "_get_fsdp_state", None)):
            pytest.fail(
                f"{TORCH}: FSDPModule._get_fsdp_state() is gone (2.13: _fully_shard.py:881)"
            )
        state = unit._get_fsdp_state()
        groups = need(state, "_fsdp_param_groups", list, f"{FSDP}_fsdp_state.py:67")
        assert groups, f"{TORCH}: an FSDP2 unit's _fsdp_param_groups is empty"
        for group in groups:
            for fsdp_param in need(group, "fsdp_params", list, f"{FSDP}_fsdp_param_group.py:170"):
                param = need(
                    fsdp_param, "sharded_param", nn.Parameter, f"{FSDP}_fsdp_param.py:177, 325"
                )
                assert isinstance(param, DTensor), f"{TORCH}: FSDPParam.sharded_param not a DTensor"
                local = need(
                    param, "_local_tensor", torch.Tensor, "torch/distributed/tensor/_api.py:312"
                )
                size = need(
                    fsdp_param,
                    "padded_sharded_param_size",
                    torch.Size,
                    f"{FSDP}_fsdp_param.py:173, 305",
                )
                data = need(
                    fsdp_param, "_sharded_param_data", torch.Tensor, f"{FSDP}_fsdp_param.py:176"
                )
                # the padded shard, flat, whose first rows are the parameter's local tensor
                assert data.dim() == 1 and data.numel() == size.numel(), (
                    f"{TORCH}: FSDPParam._sharded_param_data is no longer the flat padded shard "
                    f"({tuple(data.shape)} for a padded size of {tuple(size)}; 2.13: :316)"
                )
                assert data.untyped_storage().data_ptr() == local.untyped_storage().data_ptr(), (
                    f"{TORCH}: FSDPParam._sharded_param_data no longer holds the parameter's "
                    "local shard (2.13: _fsdp_param.py:316-320)"
                )
    # every parameter of the model (a tied one once) is one FSDPParam's sharded parameter
    assert set(fsdp_params(sharded)) == {id(p) for p in sharded.parameters()}


def test_apply_keeps_the_shard_data_host_block_points_at(dist):
    sharded = shard(tiny(True), dist)
    # FSDPModule._apply -> FSDPParam.reset_sharded_param (2.13: _fully_shard.py:886-899), which
    # keeps `_sharded_param_data` when it already shares the new local tensor's storage
    FSDPParam = type(next(iter(fsdp_params(sharded).values())))
    reset, calls = FSDPParam.reset_sharded_param, []

    def counted(self):
        calls.append(id(self))
        return reset(self)

    block = HostBlock(sharded, None, pin=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FSDPParam, "reset_sharded_param", counted)
        block.move(torch.device("cpu"), to_host=True)
    assert len(calls) == len(fsdp_params(sharded)), (
        f"{TORCH}: FSDPModule._apply no longer calls FSDPParam.reset_sharded_param once per "
        f"parameter ({len(calls)} calls; 2.13: _fully_shard.py:886-899)"
    )
    start = block.buffer.data_ptr()
    for fsdp_param in fsdp_params(sharded).values():
        ptr = fsdp_param._sharded_param_data.data_ptr()
        assert start <= ptr < start + block.nbytes, (
            f"{TORCH}: after a move into the host block, FSDPParam._sharded_param_data is not in "
            "the block: reset_sharded_param re-padded it into memory of its own"
        )
        assert fsdp_param.sharded_param.to_local().data_ptr() == ptr

"""A.3's phase offload (`fsdp.offload = "phase"`): the actor's FSDP2 parameter shards and AdamW
state moved to host memory while the sampler has the device, and back before the next forward.

`PhaseOffload` decides when a move happens; `HostBlock` is where the moved tensors live: one
exact-size host allocation (page-locked on CUDA) with a view per tensor, reused by every move, so
that `psyrl plan` counts the host RAM a rank holds exactly (psyrl/plan/host_ram.py
`offload_bytes`). `load_sharded(host_block=True)` in psyrl/runtime/distributed.py also keeps a
frozen reference model's CPU shards in one.

FSDP2 has no public API that names a parameter's padded shard storage, so `HostBlock` reads and
re-points `FSDPParam._sharded_param_data` through `FSDPModule._get_fsdp_state()`; the torch lines
it relies on are cited where it does, and tests/runtime/test_fsdp_internals.py fails by name when a
torch upgrade changes them.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lives in a `HostBlock`: its bytes at `offset`, held at `shape` (FSDP2's
    padded shard for a sharded parameter, else the tensor's own), of which the tensor is the first
    `rows` rows; `fsdp` is the parameter's FSDPParam, whose padded shard data follows the move."""

    offset: int
    shape: torch.Size
    dtype: torch.dtype
    rows: int | None
    fsdp: object | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def fsdp_params(model: nn.Module) -> dict[int, object]:
    """id(sharded Parameter) -> its FSDPParam, for every FSDP2 unit of `model` (torch 2.13
    distributed/fsdp/_fully_shard/_fully_shard.py:890-898 walks them the same way)."""
    found = {}
    # no public API: torch 2.13 _fully_shard.py:881-884, _fsdp_state.py:67, _fsdp_param_group.py:170
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    found[id(fsdp_param.sharded_param)] = fsdp_param
    return found


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """`nbytes` of host memory as one uint8 tensor, page-locked when `pin` (CUDA). Not
    `torch.empty(..., pin_memory=True)`: torch's pinned allocator rounds every block up to a power
    of two and caches it (CachingHostAllocator::allocate, torch 2.13
    include/ATen/core/CachingHostAllocator.h:300-309, with `pinned_max_round_threshold` unbounded
    by default, include/c10/core/AllocatorConfig.h:361), so one 9.3 GB block would hold 16 GiB.
    A plain CPU allocation page-locked with cudaHostRegister holds its bytes, to the page (torch's
    own torch/cuda/_pin_memory_utils.py pins shared memory the same way); a non-blocking copy from
    it is a DMA like one from torch's pinned blocks (aten/src/ATen/native/cuda/Copy.cu ignores
    the host allocator's recordEvent for memory it did not allocate). Unregister it with
    `unpin_host_buffer` before it is freed."""
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    if pin and nbytes:
        # flags 0: cudaHostRegisterDefault (one device per process)
        torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), nbytes, 0))
    return buffer


def unpin_host_buffer(data_ptr: int) -> None:
    torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(data_ptr))


class HostBlock:
    """A model's parameter shards, and AdamW's state of them when given the optimiser, held in ONE
    exact-size host allocation (page-locked on CUDA, `host_buffer`) with a view per tensor, reused
    by every move: `psyrl plan` can count the host RAM a rank holds as the sum of these bytes.

    Layout: each unique parameter (a tied one once) at FSDP2's padded shard size (dim 0 rounded up
    to a multiple of the world size, what FSDP2 itself keeps, `FSDPParam._sharded_param_data`,
    torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py:304-316), then for every parameter
    AdamW trains `exp_avg` and `exp_avg_sq` (and `max_exp_avg_sq` with amsgrad) at the local
    shard's size in the parameter's dtype (zeros_like, torch 2.13
    torch/optim/adam.py:178-189),
    reserved before the optimiser has made them. Each slot starts at a multiple of its element
    size, so with one dtype (float32 master weights and state) the block holds the exact sum.
    Module buffers (rotary inv_freq, a few KiB) are not parameters and stay where they are;
    gradients, which psyrl's loop never holds at a move, are moved outside the block.

    The move goes through `nn.Module._apply`, as FSDP2 expects (`FSDPModule._apply` ->
    `FSDPParam.reset_sharded_param`, _fully_shard.py:886-899): a DTensor parameter is swapped in
    place (`torch.utils.swap_tensors`, torch/nn/modules/module.py:975-986), so the Parameter
    objects, which the optimiser's state is keyed by, stay the same. Before `_apply` returns, the
    FSDPParam's padded data is pointed at the padded slot: `reset_sharded_param` then sees the same
    storage and does not re-pad an uneven shard into a new allocation of its own
    (_fsdp_param.py:1021-1048)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, pin: bool):
        self.model, self.optimizer, self.pin = model, optimizer, pin
        fsdp = fsdp_params(model)
        self.slots: dict[tuple[int, str], _Slot] = {}
        offset = 0

        def add(key: tuple[int, str], shape, dtype, rows=None, fsdp_param=None) -> int:
            start = -(-offset // dtype.itemsize) * dtype.itemsize  # aligned to the element
            self.slots[key] = _Slot(start, torch.Size(shape), dtype, rows, fsdp_param)
            return start + self.slots[key].nbytes

        for param in model.parameters():  # tied parameters once
            local = _local(param)
            fsdp_param = fsdp.get(id(param))
            if fsdp_param is not None:
                # no public API: torch 2.13 _fsdp_param.py:173, 304-305 (test_fsdp_internals.py)
                padded = fsdp_param.padded_sharded_param_size
                offset = add((id(param), ""), padded, local.dtype, local.shape[0], fsdp_param)
            else:
                offset = add((id(param), ""), local.shape, local.dtype)
        self.param_bytes = offset
        for group in optimizer.param_groups if optimizer is not None else []:
            keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group.get("amsgrad") else ())
            for param in group["params"]:
                local = _local(param)
                for key in keys:
                    offset = add((id(param), key), local.shape, local.dtype)
        self.nbytes = offset
        self.state_bytes = offset - self.param_bytes
        self.buffer: torch.Tensor | None = None
        self.allocations = 0  # how many host buffers this block has made: 1 after the first move

    def _view(self, slot: _Slot) -> torch.Tensor:
        """The slot's bytes as a tensor of its padded shape."""
        raw = self.buffer[slot.offset : slot.offset + slot.nbytes]
        return raw.view(slot.dtype).view(slot.shape)

    def _allocate(self) -> None:
        self.buffer = host_buffer(self.nbytes, self.pin)
        self.allocations += 1
        if self.pin and self.nbytes:
            self._unpin = weakref.finalize(self, unpin_host_buffer, self.buffer.data_ptr())
        for slot in self.slots.values():  # FSDP2 keeps the padding rows of a shard at zero
            if slot.rows is not None and slot.rows < slot.shape[0]:
                self._view(slot)[slot.rows :].zero_()

    @torch.no_grad()
    def move(self, device: torch.device, to_host: bool) -> None:
        """Every parameter and AdamW state tensor into its slot (`to_host`), or out of it into new
        tensors on `device`. Host -> device copies are ordered on the stream; device -> host copies
        block: FSDP2 reads the shards' sizes right after `_apply`, and the host copy is what the
        next phase (a checkpoint) may read."""
        if to_host and self.buffer is None:
            self._allocate()
        moved: dict[int, torch.Tensor] = {}
        # psyrl's loop holds no gradient at a move (zero_grad(set_to_none=True)); one that exists
        # goes along in memory of its own, outside the block
        grads = {id(p.grad) for p in self.model.parameters() if p.grad is not None}

        def place(t: torch.Tensor) -> torch.Tensor:
            slot = self.slots.get((id(t), ""))
            if slot is None:  # a gradient, or a module buffer (which stays)
                return _copy_to(t, device) if id(t) in grads else t
            # `_apply` visits a tied parameter once per module that holds it: one move
            if id(t) not in moved:
                moved[id(t)] = self._place(t, slot, device, to_host)
            return moved[id(t)]

        self.model._apply(place)
        moved.clear()  # the new tensors only; nothing here holds an old one
        for param, state in self.optimizer.state.items() if self.optimizer is not None else []:
            for key, value in state.items():
                # AdamW's `step` stays a CPU scalar
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    slot = self.slots.get((id(param), key))
                    if slot is None:
                        raise RuntimeError(
                            f"optimiser state {key!r} has no place in the host block (it holds "
                            "AdamW's exp_avg, exp_avg_sq and max_exp_avg_sq)"
                        )
                    state[key] = self._place(value, slot, device, to_host)

    def _place(self, t: torch.Tensor, slot: _Slot, device: torch.device, to_host: bool):
        """`t` moved into its slot or out of it (a DTensor keeps its mesh and placements)."""
        local = _local(t).detach()
        expected = slot.shape if slot.rows is None else (slot.rows, *slot.shape[1:])
        if tuple(local.shape) != tuple(expected) or local.dtype != slot.dtype:
            raise RuntimeError(
                f"a tensor of {tuple(local.shape)} {local.dtype} does not fit its host slot of "
                f"{tuple(expected)} {slot.dtype} (the layout is fixed when the block is made)"
            )
        if to_host:
            padded = self._view(slot)
            out = padded if slot.rows is None else padded[: slot.rows]
            out.copy_(local)
        else:
            padded = torch.empty(slot.shape, dtype=slot.dtype, device=device)
            padded.copy_(self._view(slot), non_blocking=True)
            out = padded if slot.rows is None else padded[: slot.rows]
        if slot.fsdp is not None:
            # no public API: torch 2.13 _fsdp_param.py:176, 316, 1021-1048 (test_fsdp_internals.py)
            slot.fsdp._sharded_param_data = padded.view(-1)
        if not isinstance(t, DTensor):
            return out
        return DTensor.from_local(
            out, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
        )


def _copy_to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of `t` in a new tensor on `device` (a DTensor keeps its mesh and placements)."""
    local = _local(t).detach()
    out = torch.empty(local.shape, dtype=local.dtype, device=device)
    out.copy_(local, non_blocking=device.type != "cpu")
    if not isinstance(t, DTensor):
        return out
    return DTensor.from_local(
        out, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class PhaseOffload:
    """`fsdp.offload = "phase"` (A.3's "parameters and optimizer offloaded to CPU", as EasyR1's
    offload_params / offload_optimizer do it): the actor's parameter shards and AdamW state move to
    host memory while the sampler has the device (rollout, weight sync, validation generation) and
    back before the next forward. The host side is one `HostBlock`, allocated at the first
    `to_host` and reused by every later one: `host_bytes` is what the rank holds on the host for it
    (page-locked on CUDA). Idempotent; disabled (every call a no-op) for the other modes."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        enabled: bool,
    ):
        self.model, self.optimizer, self.device, self.enabled = model, optimizer, device, enabled
        # page-locking needs a GPU (torch's pinning raises without one)
        self.block = HostBlock(model, optimizer, device.type == "cuda") if enabled else None
        self.on_host = False

    @property
    def host_bytes(self) -> int:
        """Bytes of the host block: parameter shards (FSDP2-padded) + AdamW state; 0 disabled."""
        return self.block.nbytes if self.block is not None else 0

    def to_host(self) -> None:
        if self.enabled and not self.on_host:
            self.block.move(torch.device("cpu"), to_host=True)
            self.on_host = True
            release_device_memory(self.device)

    def to_device(self) -> None:
        if self.enabled and self.on_host:
            self.block.move(self.device, to_host=False)
            self.on_host = False

    @contextlib.contextmanager
    def on_device(self):
        """The actor on the device for the block (a loss pass between two generations), then back
        where it was."""
        was_on_host = self.on_host
        self.to_device()
        try:
            yield
        finally:
            if was_on_host:
                self.to_host()


def release_device_memory(device: torch.device) -> None:
    """The shards' device memory back to the GPU before vLLM measures what is free. Called once the
    move has returned: the old device tensors are unreferenced by then, so the caching allocator
    holds their blocks as free and `empty_cache` returns them (the move used to call it while its
    own dict still held every old tensor, so nothing of them was returned then). No-op on a CPU."""
    if device.type == "cuda":
        torch.cuda.empty_cache()

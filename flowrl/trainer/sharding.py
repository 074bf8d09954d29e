"""Sharded training (``trainer.sharding = "fsdp"`` or ``"hybrid"``): torch FSDP2 (``fully_shard``) on the
transformer, over every process or (hybrid) within each node with the copies replicated across nodes.

Every repeated block of the transformer (each entry of a ``ModuleList`` child: FLUX's double and single
blocks, SD3's joint blocks, the world model's blocks) becomes one sharding unit, and the root holds what is
left (embedders, output head). Each process keeps only its slice (dim 0) of every parameter, gradient and
Adam moment; a block's full weights exist only during its own forward and backward (all-gathered, then freed),
and gradients are reduce-scattered and averaged over processes, as DDP averages them.

flowrl applies ``fully_shard`` itself instead of going through accelerate's FSDP plugin: accelerate 1.15 only
turns FSDP on for GPU-type launches (its state ignores ``ACCELERATE_USE_FSDP`` for CPU processes), and the
same code path then serves CPU tests and GPU runs. Parameters become ``DTensor``s; the helpers below turn them
into full tensors (collectives: every process must call them) and back.

Each forward of a sharded block is a collective, so every process would have to make the same sequence of
transformer calls. Rollouts do not (AEGPO probes the reference only for prompts its process has not seen,
group sizes differ between processes), so the no-gradient phases (probes, rollouts, evaluation) run inside
:func:`whole`: each process gathers the full weights once, at the same point, and then calls the model as often
as its own data needs, with no collective; training forwards and backwards are sharded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


def check_launch(distributed_type: str) -> None:
    """Refuse accelerate's own FSDP and DeepSpeed plugins (an accelerate config with ``distributed_type: FSDP``
    or ``DEEPSPEED``): flowrl's checkpoints, reference policy and rollouts are not written for them and no test
    runs them; ``trainer.sharding = "fsdp"`` under a plain multi-process launch is the tested way to shard."""
    from flowrl.trainer.run_errors import LaunchError

    if distributed_type in ("FSDP", "DEEPSPEED"):
        raise LaunchError(
            f"accelerate was launched with its {distributed_type} plugin, which flowrl does not support; launch with a"
            ' plain multi-process configuration (--multi_gpu) and set trainer.sharding = "fsdp" to shard the model'
            " (docs/distributed.md)"
        )


def mixed_precision_policy(mixed_precision: str) -> Any:
    """FSDP2's precision policy for ``trainer.mixed_precision``: bf16/fp16 compute over fp32 sharded weights,
    gradients reduced in fp32 (accelerate's autocast is not used for a sharded model)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)


def sharding_units(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``module``: every entry of its ``ModuleList`` children (searched below plain
    containers such as peft's wrappers too)."""
    units: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.ModuleList):
            units.extend(child)
        elif not list(child.parameters(recurse=False)):
            units.extend(sharding_units(child))
    return units


def shard_group(hybrid: bool, world: int, node: int | None = None) -> int:
    """How many processes share one copy of the model: all of them, or (``hybrid``) one node's, ``node`` (default:
    the launch's ``LOCAL_WORLD_SIZE``, which torchrun and accelerate set); a one-line
    :class:`~flowrl.trainer.run_errors.LaunchError` when the processes do not split into equal nodes."""
    if not hybrid:
        return world
    if node is None:
        import os

        from flowrl.utils.cluster import process_rank

        process_rank(os.environ)  # the launch's variables checked together: one line naming a malformed one
        node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if node < 1 or world % node:
        from flowrl.trainer.run_errors import LaunchError

        raise LaunchError(f'trainer.sharding = "hybrid": {world} processes do not split into nodes of {node}'
                          " (LOCAL_WORLD_SIZE); launch the same number of processes on every node")
    return node


def shard(module: nn.Module, device: torch.device, mixed_precision: str = "no", group: int | None = None
          ) -> nn.Module:
    """Shard ``module`` in place (one unit per repeated block, then the root), starting from the main process's
    values; returns it. ``group``: the processes one copy is sharded over (default: all); with fewer, the
    copies are replicated across groups of consecutive ranks (hybrid sharding: FSDP2 on a 2-D mesh, gradients
    reduce-scattered within a group and averaged across groups)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():  # one process without a launcher: a one-member group runs the same code
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with torch.no_grad():  # every process starts from the main one's values (random LoRA init), as DDP does
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)
    world = dist.get_world_size()
    group = world if group is None else group
    if group == world:
        mesh = init_device_mesh(device.type, (world,))
    else:
        mesh = init_device_mesh(device.type, (world // group, group), mesh_dim_names=("replicate", "shard"))
    policy = mixed_precision_policy(mixed_precision)
    for unit in sharding_units(module):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    return module


@contextmanager
def whole(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Inside the block every sharded unit of ``modules`` holds its full parameters and forwards make no
    collective (every process enters and leaves together); afterwards they are sharded again."""
    from torch.distributed.fsdp import FSDPModule

    roots = [m for m in modules if isinstance(m, FSDPModule)]
    units = [(unit, unit is root) for root in roots for unit in root.modules() if isinstance(unit, FSDPModule)]
    for unit, _ in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit, is_root in units:
            unit.reshard()
            unit.set_reshard_after_forward(not is_root, recurse=False)  # fully_shard's defaults


def full(tensor: Tensor) -> Tensor:
    """The whole tensor (gathered from every process when sharded: a collective)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: Tensor) -> Tensor:
    """This process's slice of a sharded tensor (the tensor itself otherwise)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gathered(named: Iterable[tuple[str, Tensor]]) -> dict[str, Tensor]:
    """Full CPU copies of named tensors (a collective when any is sharded)."""
    return {name: full(t.detach()).contiguous().cpu() for name, t in named}


def local_part(like: Any, value: Tensor) -> Tensor:
    """This process's slice of the full tensor ``value``, cut as the sharded tensor ``like`` is cut (on its device)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(like.to_local().device), like.device_mesh, like.placements).to_local()


@torch.no_grad()
def copy_full_into(target: Tensor, value: Tensor) -> None:
    """Copy a full tensor into ``target``, keeping only this process's slice when ``target`` is sharded."""
    from torch.distributed.tensor import DTensor

    if isinstance(target, DTensor):
        target.to_local().copy_(local_part(target, value))
    else:
        target.copy_(value)


def to_local_tree(value: Any) -> Any:
    """``value`` (nested dicts, lists, tuples) with every sharded tensor replaced by this process's slice."""
    if isinstance(value, dict):
        return {k: to_local_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_local_tree(v) for v in value)
    return local(value) if isinstance(value, Tensor) else value


def load_local_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an optimizer state saved with :func:`to_local_tree` (this process's slices) and make each moment
    a sharded tensor again, laid out like its parameter."""
    from torch.distributed.tensor import DTensor

    optimizer.load_state_dict(state)
    for param, slots in optimizer.state.items():
        if not isinstance(param, DTensor):
            continue
        for key, value in list(slots.items()):
            if isinstance(value, Tensor) and not isinstance(value, DTensor) and value.shape == local(param).shape:
                mesh, placements = param.device_mesh, param.placements
                slots[key] = DTensor.from_local(
                    value, mesh, placements, shape=param.shape, stride=param.stride(), run_check=False
                )


def merge_slices(slices: list[Any]) -> Any:
    """One full state from the slices of one copy's processes (written by :func:`to_local_tree`, in process order;
    with hybrid sharding the first group's): tensors with a dimension are concatenated along dim 0, as FSDP2
    split them; everything else is the first process's."""
    first = slices[0]
    if isinstance(first, dict):
        return {k: merge_slices([s[k] for s in slices]) for k in first}
    if isinstance(first, list | tuple):
        return type(first)(merge_slices(list(parts)) for parts in zip(*slices, strict=True))
    if isinstance(first, Tensor) and first.dim() > 0:
        return torch.cat(slices, dim=0)
    return first


def slice_full_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state (unsharded, or merged) cut to this process's slices of ``optimizer``'s sharded
    parameters (the state of the others is left whole)."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    sliced: dict[Any, Any] = {}
    for index, slots in state["state"].items():
        param = params[int(index)]
        sliced[index] = {
            key: local_part(param, value)
            if isinstance(param, DTensor) and isinstance(value, Tensor) and value.shape == param.shape
            else value
            for key, value in slots.items()
        }
    return {**state, "state": sliced}

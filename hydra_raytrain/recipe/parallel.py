"""How a model is spread over the workers: DDP (Ray's ``prepare_model``) or FSDP2 (``fully_shard``), and which of
its modules recompute their activations in the backward pass (activation checkpointing).

FSDP2 as torchtitan applies it: each module whose class ``fsdp.shard_modules`` names becomes a shard unit (its
parameters gathered for its forward and backward only), then the root takes the rest. Every rank then holds
1/world of each parameter and of its optimizer state, as DTensors; gradients are reduce-scattered (averaged, as
DDP's all-reduce averages). Runs on GPU workers (nccl) and CPU workers (gloo).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# trainer.precision -> FSDP2's MixedPrecisionPolicy: low-precision parameters for compute, float32 gradient reduction
FSDP_PARAM_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def class_matches(module: nn.Module, names: Iterable[str]) -> bool:
    """Whether ``module``'s class is one of ``names``: a class name (``BasicBlock``) or its dotted path
    (``torchvision.models.resnet.BasicBlock``)."""
    cls = type(module)
    return any(name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}") for name in names)


def matching_modules(model: nn.Module, names: Iterable[str]) -> list[nn.Module]:
    """The submodules (not the root) whose class is one of ``names``, in definition order."""
    names = list(names)
    return [module for module in list(model.modules())[1:] if class_matches(module, names)]


def module_classes(model: nn.Module) -> list[str]:
    """The class names of ``model``'s submodules: what ``fsdp.shard_modules`` can name."""
    return sorted({type(module).__name__ for module in list(model.modules())[1:]})


def checkpoint_activations(model: nn.Module, names: Iterable[str]) -> int:
    """Activation checkpointing of every submodule whose class is one of ``names``: its forward keeps only its
    inputs, and runs again in the backward pass. Composable (hooks, no wrapper): the module tree, its state_dict keys
    and FSDP's units stay as they are. The recomputation leaves batch norm's running statistics as the forward left
    them (else they would be updated twice a step). Returns how many modules it applies to."""
    from torch.distributed._composable import checkpoint

    modules = matching_modules(model, names)
    for module in modules:
        checkpoint(module, context_fn=lambda module=module: (contextlib.nullcontext(), _statistics_kept(module)))
    return len(modules)


@contextlib.contextmanager
def _statistics_kept(module: nn.Module) -> Iterator[None]:
    """Batch norm's buffers (running mean and variance, batches tracked) under ``module`` as they were on entry."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]
    saved = [[buffer.clone() for buffer in norm.buffers(recurse=False)] for norm in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for norm, buffers in zip(norms, saved, strict=True):
                for buffer, value in zip(norm.buffers(recurse=False), buffers, strict=True):
                    buffer.copy_(value)


def fully_shard(
    model: nn.Module,
    device: torch.device,
    shard_modules: Iterable[str],
    reshard_after_forward: bool = True,
    precision: str = "32",
    cpu_offload: bool = False,
) -> nn.Module:
    """FSDP2 over every rank of the default process group: the named submodules' units, then the root. The model
    stays where it was built (the host): FSDP moves each unit's shard to ``device`` (kept on the host with
    ``cpu_offload``), so no device ever holds the whole model."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
    from torch.distributed.fsdp import fully_shard as shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    low = FSDP_PARAM_DTYPES.get(precision)
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    if low is not None:
        # Batch norm stays float32, in units of its own that cast their inputs (FSDP1's MixedPrecision did this by
        # default): its running statistics need the precision, and its kernels refuse float32 inputs with
        # low-precision weights.
        full = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=True)
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                shard(module, **{**options, "mp_policy": full})
    for module in matching_modules(model, shard_modules):
        if not is_sharded(module):  # a batch norm class named in shard_modules is a unit already
            shard(module, **options)
    # The root too as configured (FSDP's auto setting keeps the root's parameters gathered from one forward to the
    # next: a GAN's generator, run first under no_grad, then lost its gradients).
    shard(model, **options)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def unwrap(model: nn.Module) -> nn.Module:
    """The module a task sees outside training: DDP's inner module; FSDP2's module is the model itself."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def gathered(models: Iterable[nn.Module], reshard_after_forward: bool = True) -> Iterator[None]:
    """Every FSDP unit's full parameters on every rank, kept through forwards, for code that runs on one rank only
    (a task's ``on_epoch_end``): a collective on entry, none in between. Nothing for other models."""
    from torch.distributed.fsdp import FSDPModule

    units = [unit for model in models for unit in model.modules() if isinstance(unit, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)  # as fully_shard set it


def every_rank(ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (a collective when distributed): ranks that must take the same path agree."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor(int(ok), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds of ``tensors``: a DTensor's local shard only."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def memory(models: Iterable[nn.Module], optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int]:
    """This rank's parameter and optimizer-state bytes (with FSDP, its shards: about 1/world of DDP's)."""
    states = [value for optimizer in optimizers for state in optimizer.state.values() for value in state.values()]
    return {
        "param_bytes": local_bytes(p for model in models for p in model.parameters()),
        "optimizer_state_bytes": local_bytes(v for v in states if isinstance(v, torch.Tensor) and v.dim() > 0),
    }

"""The device-resident input path (``trainer.data_on_device``): a split held as tensors on the worker's device,
each batch one ``index_select`` per tensor by the indices of the same :class:`ShardedSampler` the DataLoader path
reads. The batches are the DataLoader's (worker-count independence and exact mid-epoch resume hold as they do
there), without a per-sample ``__getitem__``, a collate or a host-to-device copy per step. The fastest
single-GPU CIFAR-10 recipes (airbench) feed their models this way.

Data held in memory as tensors (a ``TensorDataset``, or a ``Subset`` of one: the bundled sets) takes this path by
default; ``trainer.data_on_device=true`` also loads any other map-style dataset once, up front, through a
DataLoader (its per-sample transforms then run once: random ones belong in ``trainer.augment``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.recipe.sampler import ShardedSampler

# The share of a GPU's free memory the device-resident splits may take when the path is chosen automatically.
DEVICE_MEMORY_SHARE = 0.25


def in_memory_tensors(dataset: Dataset) -> tuple[torch.Tensor, ...] | None:
    """The tensors behind a ``TensorDataset`` (or a ``Subset`` of one, indexed), None for any other dataset."""
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors)
    if isinstance(dataset, Subset):
        inner = in_memory_tensors(dataset.dataset)
        if inner is None:
            return None
        indices = torch.as_tensor(dataset.indices, dtype=torch.long)
        return tuple(tensor[indices] for tensor in inner)
    return None


def load_tensors(dataset: Dataset, num_workers: int, split: str) -> tuple[torch.Tensor, ...]:
    """Every sample of ``dataset``, in index order, stacked into one tensor per field (one pass of a DataLoader)."""
    fields: list[list[torch.Tensor]] = []
    for batch in DataLoader(dataset, batch_size=256, num_workers=num_workers):
        parts = batch if isinstance(batch, (list, tuple)) else [batch]
        if not all(isinstance(part, torch.Tensor) for part in parts):
            kinds = ", ".join(type(part).__name__ for part in parts)
            raise ConfigError(
                "trainer.data_on_device",
                True,
                f"the {split} split's samples collate into {kinds}, not tensors only: the device-resident path "
                "holds tensors.",
                "trainer.data_on_device=false (the DataLoader path), or a dataset whose samples are tensors",
            )
        fields = fields or [[] for _ in parts]
        for field, part in zip(fields, parts, strict=True):
            field.append(part)
    return tuple(torch.cat(field) for field in fields)


def nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def fits_device(size: int, device: torch.device, share: float) -> bool:
    """Whether ``size`` bytes take at most ``share`` of the GPU's free memory (host memory: always; the data is
    there already)."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return size <= share * free


class DeviceLoader:
    """A DataLoader's interface (``sampler``, ``generator``, ``len``, iteration) over tensors on ``device``:
    batches as lists of tensors, as ``default_collate`` makes them from a TensorDataset's samples."""

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        batch_size: int,
        sampler: ShardedSampler,
        device: torch.device,
        float_dtype: torch.dtype | None = None,
    ):
        self.tensors = tuple(
            tensor.to(device, dtype=float_dtype if float_dtype is not None and tensor.is_floating_point() else None)
            for tensor in tensors
        )
        self.batch_size, self.sampler, self.device = batch_size, sampler, device
        self.generator = torch.Generator()  # no loader workers to seed; the recipe reseeds it like a DataLoader's

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        indices = self.sampler.indices()
        if self.device.type == "cuda":  # from pinned memory: no host synchronisation
            indices = indices.pin_memory().to(self.device, non_blocking=True)
        for start in range(0, len(indices), self.batch_size):
            batch = indices[start : start + self.batch_size]
            yield [tensor.index_select(0, batch) for tensor in self.tensors]

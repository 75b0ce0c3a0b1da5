"""torchvision data sets: the built-in ones (MNIST, FashionMNIST, CIFAR10, ...), FakeData and ImageFolder.

torchvision is imported inside the builders: the driver validates these signatures without paying for it."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from torch.utils.data import Subset

from hydra_raytrain.config.paths import ExistingDir, LocalPath
from hydra_raytrain.data.splits import Splits, random_split_indices


def image_transform(input_shape: Sequence[int], mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None):
    """PIL image -> float tensor of exactly ``input_shape`` (channels converted, resized), optionally normalised."""
    from torchvision import transforms as T

    channels, height, width = input_shape
    steps = [
        T.Grayscale(1) if channels == 1 else T.Lambda(lambda image: image.convert("RGB")),
        T.Resize((height, width)),
        T.ToTensor(),
    ]
    if mean is not None:
        steps.append(T.Normalize(mean, std))
    return T.Compose(steps)


def torchvision_builtin(
    name: str,
    root: LocalPath,
    input_shape: Sequence[int],
    num_outputs: int,
    download: bool = False,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
) -> Splits:
    """``torchvision.datasets.<name>(root, train=True/False)``, e.g. MNIST, FashionMNIST, CIFAR10."""
    import torchvision

    dataset_cls = getattr(torchvision.datasets, name)
    transform = image_transform(input_shape, mean, std)
    try:
        return Splits(
            dataset_cls(root, train=True, download=download, transform=transform),
            dataset_cls(root, train=False, download=download, transform=transform),
        )
    except RuntimeError as error:  # torchvision: "Dataset not found. You can use download=True to download it"
        raise FileNotFoundError(
            f"dataset.name={name}: no usable data under dataset.root={root} ({error}). Set dataset.download=true "
            f"on a machine with internet access, or copy torchvision's {name} files there."
        ) from error


def fake(input_shape: Sequence[int] = (3, 32, 32), num_outputs: int = 10, train_size: int = 1024, val_size: int = 256) -> Splits:
    """Random images (torchvision.datasets.FakeData) for throughput tests; deterministic per index."""
    import torchvision
    from torchvision import transforms as T

    def make(size: int, offset: int):
        return torchvision.datasets.FakeData(size, tuple(input_shape), num_outputs, T.ToTensor(), random_offset=offset)

    return Splits(make(train_size, 0), make(val_size, train_size))


def imagefolder(
    root: ExistingDir,
    input_shape: Sequence[int],
    num_outputs: int,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
) -> Splits:
    """``root/train/<class>/*`` and ``root/val/<class>/*``; without ``val/``, a seeded ``val_fraction`` of train."""
    import torchvision

    transform = image_transform(input_shape, mean, std)
    train_dir = os.path.join(root, "train")
    if not os.path.isdir(train_dir):
        raise FileNotFoundError(f"dataset.root={root} has no train/ folder (expected root/train/<class>/<image>).")
    train = torchvision.datasets.ImageFolder(train_dir, transform=transform)
    if len(train.classes) != num_outputs:
        raise ValueError(
            f"dataset.num_outputs={num_outputs} but {train_dir} has {len(train.classes)} class folders: {train.classes}."
        )
    val_dir = os.path.join(root, "val")
    if os.path.isdir(val_dir):
        val = torchvision.datasets.ImageFolder(val_dir, transform=transform)
        if val.classes != train.classes:
            raise ValueError(f"{val_dir} has classes {val.classes}, {train_dir} has {train.classes}: they must match.")
        return Splits(train, val)
    train_idx, val_idx = random_split_indices(len(train), val_fraction, split_seed)
    return Splits(Subset(train, train_idx), Subset(train, val_idx))

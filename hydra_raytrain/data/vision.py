"""torchvision data sets: the built-in ones (MNIST, FashionMNIST, CIFAR10, ...), FakeData and ImageFolder.

torchvision is imported inside the builders: the driver validates these signatures without paying for it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torch.utils.data import Subset

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.paths import ExistingDir, LocalPath, OptionalPath
from hydra_raytrain.data.folders import LAYOUT, train_folder
from hydra_raytrain.data.splits import Splits, check_image_shape, held_out, split_indices


def image_transform(
    input_shape: Sequence[int], mean: Sequence[float] | None = None, std: Sequence[float] | None = None
):
    """PIL image -> float tensor of exactly ``input_shape`` (channels converted, resized), optionally normalised."""
    from torchvision import transforms as T

    check_image_shape(input_shape)
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
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    test_fraction: float = 0.0,
    split_seed: int = 0,
) -> Splits:
    """``torchvision.datasets.<name>(root, train=True/False)``, e.g. MNIST, FashionMNIST, CIFAR10: the official
    test set validates; ``test_fraction`` of the training set (chosen with ``split_seed``) is held out to test."""
    import torchvision

    dataset_cls = getattr(torchvision.datasets, name, None)
    if dataset_cls is None:
        known = [n for n in torchvision.datasets.__all__ if n[0].isupper()]
        raise ConfigError(
            "dataset.name",
            name,
            f"torchvision.datasets has no {name!r}{did_you_mean(name, known)}.",
            "e.g. MNIST, FashionMNIST, CIFAR10",
        )
    transform = image_transform(input_shape, mean, std)
    try:
        splits = Splits(
            dataset_cls(root, train=True, download=download, transform=transform),
            dataset_cls(root, train=False, download=download, transform=transform),
        )
    except (RuntimeError, OSError) as error:  # torchvision: "Dataset not found...", or the download failed
        raise ConfigError(
            "dataset.root",
            root,
            f"no usable {name} data there ({type(error).__name__}: {error}).",
            f"dataset.download=true on a machine with internet access, or torchvision's {name} files copied there",
        ) from error
    classes = getattr(splits.train, "classes", None)
    if classes is not None:
        check_class_count(num_outputs, classes, f"torchvision's {name}")
    train, test = held_out(splits.train, test_fraction, split_seed)
    return Splits(train, splits.val, test)


def check_class_count(num_outputs: int, classes: Sequence[str], where: str) -> None:
    if len(classes) != num_outputs:
        shown = ", ".join(classes[:10]) + (", ..." if len(classes) > 10 else "")
        raise ConfigError(
            "dataset.num_outputs",
            num_outputs,
            f"{where} has {len(classes)} classes ({shown}).",
            f"dataset.num_outputs={len(classes)}",
        )


def fake(
    input_shape: Sequence[int] = (3, 32, 32),
    num_outputs: int = 10,
    train_size: int = 1024,
    val_size: int = 256,
    test_size: int = 0,
) -> Splits:
    """Random images (torchvision.datasets.FakeData) for throughput tests; deterministic per index."""
    import torchvision
    from torchvision import transforms as T

    check_image_shape(input_shape)
    for key, size, least in (("train_size", train_size, 1), ("val_size", val_size, 1), ("test_size", test_size, 0)):
        if size < least:
            raise ConfigError(f"dataset.{key}", size, f"must be >= {least}.")

    def make(size: int, offset: int):
        return torchvision.datasets.FakeData(size, tuple(input_shape), num_outputs, T.ToTensor(), random_offset=offset)

    test = make(test_size, train_size + val_size) if test_size else None
    return Splits(make(train_size, 0), make(val_size, train_size), test)


def imagefolder(
    root: ExistingDir,
    input_shape: Sequence[int],
    num_outputs: int,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    test_fraction: float = 0.0,
    test_path: OptionalPath = None,
    folds: int | None = None,
    fold: int = 0,
) -> Splits:
    """``root/train/<class>/*`` and ``root/val/<class>/*``; without ``val/``, a seeded ``val_fraction`` of train.
    Without ``train/``, ``root/<class>/*`` (torchvision's own ImageFolder layout) split the same way. The test
    split, when asked for: ``test_path``'s class folders (e.g. ``root/test``), or a seeded ``test_fraction`` of
    train. ``folds``/``fold``: cross-validation over train (``splits.split_indices``), where there is no ``val/``."""
    transform = image_transform(input_shape, mean, std)
    train_dir = train_folder(root)
    train = _image_folder(train_dir, transform, root)
    check_class_count(num_outputs, train.classes, f"{train_dir} (class folders)")
    val = _same_classes(os.path.join(root, "val"), train, transform, root) if train_dir != root else None
    test = None
    if test_path is not None:
        if test_fraction:
            raise ConfigError(
                "dataset.test_fraction",
                test_fraction,
                f"dataset.test_path ({test_path}) is the test split already.",
                "0",
            )
        if not os.path.isdir(test_path):
            raise ConfigError("dataset.test_path", test_path, "no such folder.", "a folder of class folders of images")
        test = _same_classes(test_path, train, transform, root, "dataset.test_path")
    if val is not None:
        if folds is not None or fold:
            raise ConfigError(
                "dataset.folds" if folds is not None else "dataset.fold",
                folds if folds is not None else fold,
                f"{root}/val holds the validation images: cross-validation cuts its folds from train.",
                "null, or a root without val/",
            )
        train, held = held_out(train, test_fraction, split_seed)
        return Splits(train, val, test if test is not None else held)
    train_idx, val_idx, test_idx = split_indices(len(train), val_fraction, split_seed, test_fraction, folds, fold)
    parts = Subset(train, train_idx), Subset(train, val_idx), Subset(train, test_idx) if test_idx else test
    return Splits(*parts)


def _same_classes(folder: str, train: Any, transform: Any, root: str, key: str = "dataset.root") -> Any:
    """An image folder with the same class folders as training's (``root/val``, or the test split's), where it
    exists."""
    if not os.path.isdir(folder):
        return None
    found = _image_folder(folder, transform, root)
    if found.classes != train.classes:
        raise ConfigError(
            key,
            root if key == "dataset.root" else folder,
            f"{folder} has classes {found.classes}, {train.root} has {train.classes}.",
            f"the same class folders under train/ and {os.path.basename(folder)}/",
        )
    return found


def _image_folder(folder: str, transform: Any, root: str) -> Any:
    import torchvision

    try:
        return torchvision.datasets.ImageFolder(folder, transform=transform)
    except FileNotFoundError as error:  # torchvision: no class folder, or a class folder without images
        raise ConfigError("dataset.root", root, f"{str(error).rstrip('.')}.", LAYOUT) from None

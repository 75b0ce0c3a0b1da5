"""Small data sets written to disk in the formats the real loaders read (no download here)."""

import struct

import numpy as np
from PIL import Image


def write_idx(path, array):
    """The MNIST file format: a magic number, the dimensions, then uint8 data."""
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root, name="MNIST", sizes=(("train", 12), ("t10k", 5))):
    """torchvision's raw MNIST / FashionMNIST files under ``root/<name>/raw``."""
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in sizes:
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))


def write_images(folder, classes, per_class, size=(10, 12)):
    """``folder/<class>/<i>.png``: an ImageFolder."""
    for c in classes:
        (folder / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(np.full((*size, 3), 40 * i, dtype=np.uint8)).save(folder / c / f"{i}.png")

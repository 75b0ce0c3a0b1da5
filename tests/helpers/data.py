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


def write_digits_parquet(folder, files=5, features="features", label="label"):
    """scikit-learn's digits as Parquet, ``files`` files under ``folder``: each row a fixed-size list of the 64
    pixels (scaled to 0..1) and the integer label, as ``dataset=digits`` holds them. Returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hydra_raytrain.data.bundled import digits_arrays

    pixels, target = digits_arrays()
    values = pa.array((pixels.reshape(len(pixels), 64) / 16.0).astype(np.float32).ravel())
    table = pa.table({features: pa.FixedSizeListArray.from_arrays(values, 64), label: pa.array(target, pa.int64())})
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(table), files + 1).astype(int)
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        pq.write_table(table.slice(start, stop - start), folder / f"part-{i:03d}.parquet")
    return len(table)

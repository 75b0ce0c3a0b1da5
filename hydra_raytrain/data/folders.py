"""What an image folder tells before any image is decoded: its layout, its classes, the shape of its images.

``conf/dataset/imagefolder.yaml`` infers ``num_outputs`` and ``input_shape`` with the resolvers below, so
``dataset=imagefolder dataset.root=PATH`` needs nothing else::

    num_outputs: ${class_count:${.root}}     # the number of class folders
    input_shape: ${image_shape:${.root}}     # [channels, height, width] of the first image

They run where the config is resolved: on the driver, against its working directory (workers receive the
resolved values). No torch here: the config layer imports this module.
"""

from __future__ import annotations

import os

from hydra_raytrain.config.errors import ConfigError

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder reads.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
LAYOUT = "root/<class>/<image>, or root/train/<class>/<image> with an optional root/val/<class>/<image>"
# PIL modes with one channel; every other mode is read as RGB (image_transform converts it).
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")


def train_folder(root: str) -> str:
    """``root/train`` when it exists (then ``root/val`` may hold the validation split), else ``root`` itself."""
    train = os.path.join(root, "train")
    return train if os.path.isdir(train) else root


def class_folders(root: str) -> list[str]:
    """The class folders of the training split, sorted (ImageFolder's class order); a clear error when ``root``
    is not an image folder."""
    if not os.path.isdir(root):
        raise ConfigError("dataset.root", root, "no such folder.", "the path of an existing folder.")
    folder = train_folder(root)
    classes = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    if not classes:
        raise ConfigError("dataset.root", root, f"{folder} has no class folders.", LAYOUT)
    return classes


def class_count(root: str) -> int:
    return len(class_folders(os.path.abspath(os.path.expanduser(root))))


def image_shape(root: str) -> list[int]:
    """``[channels, height, width]`` of the first image of the first class (1 channel for grayscale modes)."""
    from PIL import Image

    root = os.path.abspath(os.path.expanduser(root))
    folder = train_folder(root)
    for name in class_folders(root):
        images = sorted(f for f in os.listdir(os.path.join(folder, name)) if f.lower().endswith(IMAGE_EXTENSIONS))
        if images:
            path = os.path.join(folder, name, images[0])
            try:
                with Image.open(path) as image:
                    width, height = image.size
                    channels = 1 if image.mode in GRAYSCALE_MODES else 3
            except OSError as error:
                raise ConfigError(
                    "dataset.input_shape",
                    None,
                    f"cannot read {path} to infer it ({error}).",
                    "dataset.input_shape=[C,H,W], e.g. [3,64,64]",
                ) from None
            return [channels, height, width]
    raise ConfigError(
        "dataset.root", root, f"no images ({', '.join(IMAGE_EXTENSIONS)}) in the class folders of {folder}.", LAYOUT
    )

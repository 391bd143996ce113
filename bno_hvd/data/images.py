"""Datasets: Fashion-MNIST and MNIST read from local IDX files, a seeded synthetic set, and image
folders (torchvision ``ImageFolder``).

Nothing is ever downloaded (cluster nodes may have no internet). Fashion-MNIST, MNIST and synthetic
come back as one in-memory ``TensorDataset(images, labels)``: images float32 ``[N, 1, 28, 28]``
normalised as ``(x / 255 - mean) / std`` with the per-dataset constants in :data:`NORMALIZATION`,
labels int64 ``[N]``. ``imagefolder`` reads ``<data_dir>/train`` and ``<data_dir>/val`` (one
sub-folder per class) from disk, with the usual ImageNet-style augmentation for training
(:func:`image_transforms`); decoding happens in the DataLoader's workers.

Where the files are looked for:

- ``fashion-mnist``: ``data_dir`` (default :data:`FASHION_MNIST_DIR`, from the Debian package
  ``dataset-fashion-mnist``), also torchvision's ``<data_dir>/FashionMNIST/raw``.
- ``mnist``: ``<data_dir>/MNIST/raw`` (torchvision's layout) or ``data_dir`` itself.

Each file may be plain (``train-images-idx3-ubyte``) or gzipped (``train-images-idx3-ubyte.gz``).

Usage::

    train = load_dataset("fashion-mnist", "train")
    test = load_dataset("mnist", "test", data_dir="~/data")
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from bno_hvd.common.atomic import atomic_write
from bno_hvd.common.errors import UsageError
from bno_hvd.common.parsing import IMAGE_SIDE, clip, show_path
from bno_hvd.data.catalog import DATASET_NAMES, SYNTHETIC_SIZE

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
SPLITS = ("train", "test")
NUM_CLASSES = 10
IMAGE_SIZE = 28

# (mean, std) of the training pixels scaled to [0, 1]; the usual published values.
# Synthetic pixels are prototypes uniform in [0, 255] plus noise, so roughly (0.5, 0.3).
NORMALIZATION = {
    "fashion-mnist": (0.2860, 0.3530),
    "mnist": (0.1307, 0.3081),
    "synthetic": (0.5, 0.3),
}

# IDX files this module reads: unsigned bytes only (type code 0x08).
_IDX_UBYTE = 0x08
_FILE_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path) -> np.ndarray:
    """Read an IDX file of unsigned bytes (plain, or gzipped if ``path`` ends in ``.gz``).

    Returns a uint8 array shaped by the header: ``[N]`` for labels (magic 0x0801),
    ``[N, rows, cols]`` for images (magic 0x0803), read-only (a view of the file's bytes; copy to
    modify). A bad magic number, a truncated file or
    trailing bytes raise :class:`UsageError` naming the file.
    """
    path = os.fspath(path)
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as err:
        # gzip raises EOFError for a cut-off stream and BadGzipFile (an OSError) for garbage.
        raise UsageError(f"cannot read IDX file {path}: {err}; replace it with an intact copy") from None
    return _decode_idx(raw, path)


def _decode_idx(raw: bytes, path: str) -> np.ndarray:
    if len(raw) < 4:
        raise UsageError(f"IDX file {path} is truncated ({len(raw)} bytes); replace it with an intact copy")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != _IDX_UBYTE or ndim not in (1, 3):
        raise UsageError(
            f"IDX file {path} has bad magic 0x{raw[:4].hex()} (expected 0x00000801 labels or "
            f"0x00000803 images); is it really an MNIST-style IDX file?"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UsageError(f"IDX file {path} is truncated inside its header; replace it with an intact copy")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "longer than its header says"
        raise UsageError(
            f"IDX file {path} is {what} ({len(raw)} bytes, header {shape} needs {expected}); "
            f"replace it with an intact copy"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def write_idx(path, array) -> None:
    """Write a uint8 array with 1 or 3 dimensions as an IDX file (gzipped if ``path`` ends in ``.gz``).

    The inverse of :func:`read_idx`; tests use it to make small datasets.
    """
    path = os.fspath(path)
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim not in (1, 3):
        raise ValueError(f"write_idx needs a uint8 array with 1 or 3 dimensions, got {array.dtype} {array.shape}")
    header = struct.pack(">HBB", 0, _IDX_UBYTE, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + np.ascontiguousarray(array).tobytes())


def load_dataset(
    name: str,
    split: str,
    data_dir: str | None = None,
    *,
    synthetic_size: int = SYNTHETIC_SIZE,
    seed: int = 0,
) -> TensorDataset:
    """Load one split of a dataset into memory as ``TensorDataset(images, labels)``.

    ``name`` is one of :data:`DATASET_NAMES`, ``split`` is ``"train"`` or ``"test"``.
    Images are float32 ``[N, 1, 28, 28]``, normalised with :data:`NORMALIZATION`; labels int64 ``[N]``.
    ``synthetic`` has ``synthetic_size`` train / ``synthetic_size // 4`` test samples and is
    deterministic for a given ``seed``; the other datasets ignore both.
    Raises :class:`UsageError` for unknown names/splits and missing or damaged files.
    """
    if name not in DATASET_NAMES:
        raise UsageError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    if name == "imagefolder":
        raise UsageError("imagefolder is read from disk sample by sample, not into memory: use load_datasets()")
    if split not in SPLITS:
        raise UsageError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if name == "synthetic":
        images, labels = _synthetic_uint8(split, synthetic_size, seed)
    else:
        images, labels = _read_split(name, split, data_dir)
    return TensorDataset(_normalise(images, *NORMALIZATION[name]), torch.from_numpy(labels.astype(np.int64)))


def _normalise(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    # In place on one float32 copy (60k Fashion-MNIST images are 188 MB): no temporaries on top.
    # The copy also makes the tensor writable; read_idx returns a read-only view of the file bytes.
    x = torch.from_numpy(images.astype(np.float32))
    return x.div_(255.0).sub_(mean).div_(std).unsqueeze_(1)


def _read_split(name: str, split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    folders = _candidate_dirs(name, data_dir)
    image_stem, label_stem = _FILE_STEMS[split]
    images = read_idx(_find_file(name, folders, image_stem))
    labels = read_idx(_find_file(name, folders, label_stem))
    if images.ndim != 3 or labels.ndim != 1:
        raise UsageError(f"{name} {split}: image file must be 3-D and label file 1-D; are the two files swapped?")
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise UsageError(f"{name} {split}: images are {images.shape[1:]}, expected 28x28; use the original IDX files")
    if len(images) != len(labels):
        raise UsageError(
            f"{name} {split}: {len(images)} images but {len(labels)} labels; the files do not belong together"
        )
    if labels.size and labels.max() >= NUM_CLASSES:
        raise UsageError(f"{name} {split}: label {labels.max()} is out of range 0..9; use the original label file")
    return images, labels


def _candidate_dirs(name: str, data_dir: str | None) -> list[str]:
    if name == "fashion-mnist":
        base = os.path.expanduser(data_dir or FASHION_MNIST_DIR)
        return [base, os.path.join(base, "FashionMNIST", "raw")]
    if data_dir is None:
        raise UsageError("dataset mnist needs a data directory holding the MNIST IDX files (e.g. <dir>/MNIST/raw)")
    base = os.path.expanduser(data_dir)
    return [os.path.join(base, "MNIST", "raw"), base]


def _find_file(name: str, folders: list[str], stem: str) -> str:
    for folder in folders:
        for filename in (stem, stem + ".gz"):
            path = os.path.join(folder, filename)
            if os.path.isfile(path):
                return path
    where = " or ".join(folders)
    if name == "fashion-mnist" and folders[0] == FASHION_MNIST_DIR:
        hint = "install it with `apt-get install dataset-fashion-mnist` or point the data directory at a copy"
    else:
        hint = f"put the {name} IDX file there (plain or .gz)"
    raise UsageError(f"{name}: missing {stem}[.gz] in {where}; {hint}")


def _synthetic_uint8(split: str, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy copies of 10 random class prototypes: learnable, yet not solved by the first batch."""
    if size < 4:
        raise UsageError(f"synthetic_size must be at least 4, got {size}")
    n = size if split == "train" else size // 4
    # Prototypes depend on the seed only, so train and test share classes; samples differ by split.
    protos = np.random.default_rng(seed).uniform(0, 255, size=(NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE))
    rng = np.random.default_rng([seed, SPLITS.index(split) + 1])
    labels = rng.integers(0, NUM_CLASSES, size=n, dtype=np.int64)
    noise = rng.normal(0.0, 96.0, size=(n, IMAGE_SIZE, IMAGE_SIZE))
    images = np.clip(protos[labels] + noise, 0, 255).astype(np.uint8)
    return images, labels


def torchvision_root(name: str = "fashion-mnist", data_dir: str | None = None, cache: str | None = None) -> str:
    """A root directory laid out the way ``torchvision.datasets.FashionMNIST``/``MNIST`` read it
    (``<root>/FashionMNIST/raw/train-images-idx3-ubyte``, ...), made once from the IDX files this
    module finds (e.g. Debian's gzipped ones) by decompressing them into ``cache`` (default
    ``~/.cache/bno-hvd/torchvision``). Use it with ``download=False``.

    Usage::

        train = torchvision.datasets.FashionMNIST(torchvision_root(), train=True, download=False)
    """
    if name not in ("fashion-mnist", "mnist"):
        raise UsageError(f"torchvision_root knows fashion-mnist and mnist, not {name!r}")
    root = os.path.expanduser(cache or os.path.join("~", ".cache", "bno-hvd", "torchvision"))
    raw = os.path.join(root, "FashionMNIST" if name == "fashion-mnist" else "MNIST", "raw")
    folders = _candidate_dirs(name, data_dir)
    for stem in [s for pair in _FILE_STEMS.values() for s in pair]:
        target = os.path.join(raw, stem)
        if not os.path.exists(target):
            source = _find_file(name, folders, stem)
            opener = gzip.open if source.endswith(".gz") else open
            with opener(source, "rb") as fh:
                payload = fh.read()
            _decode_idx(payload, source)  # an intact IDX file, or one clear error naming it
            atomic_write(target, lambda out, data=payload: out.write(data), binary=True)
    return root


# -- what a run trains on ------------------------------------------------------------------------

IMAGENET_NORMALIZATION = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass
class Datasets:
    """The splits of one dataset and what the model must fit: image shape (C, H, W) and classes."""

    train: Dataset
    test: Dataset | None
    input_shape: tuple[int, int, int]
    num_classes: int


def load_datasets(
    name: str,
    data_dir: str | None = None,
    *,
    with_test: bool = True,
    image_size: int = 64,
    synthetic_size: int = SYNTHETIC_SIZE,
    seed: int = 0,
) -> Datasets:
    """Train (and test) split of ``name`` (one of :data:`DATASET_NAMES`); :class:`UsageError` on bad input."""
    if name == "imagefolder":
        return _image_folders(data_dir, image_size, with_test)
    train = load_dataset(name, "train", data_dir, synthetic_size=synthetic_size, seed=seed)
    test = load_dataset(name, "test", data_dir, synthetic_size=synthetic_size, seed=seed) if with_test else None
    return Datasets(train, test, (1, IMAGE_SIZE, IMAGE_SIZE), NUM_CLASSES)


def image_transforms(image_size: int, train: bool):
    """Training: random resized crop + horizontal flip; evaluation: resize + centre crop. Both
    end in ImageNet normalisation. (Random choices come from generators the loader seeds per
    sample and epoch, see :mod:`bno_hvd.library.loader`.)"""
    from torchvision import transforms as T

    mean, std = IMAGENET_NORMALIZATION
    if train:
        steps = [T.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True), T.RandomHorizontalFlip()]
    else:
        steps = [T.Resize(max(image_size, round(image_size * 8 / 7)), antialias=True), T.CenterCrop(image_size)]
    return T.Compose(steps + [T.ToTensor(), T.Normalize(mean, std)])


def _image_folders(data_dir: str | None, image_size: int, with_test: bool) -> Datasets:
    if not data_dir:
        raise UsageError(
            "--dataset imagefolder needs --data-dir DIR with DIR/train/<class>/<images> "
            "(and DIR/val/<class>/<images> for the test accuracy)"
        )
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not IMAGE_SIDE.contains(image_size):
        raise UsageError(f"--image-size must be an integer {IMAGE_SIDE.describe()} (pixels), got {image_size!r}")
    root = os.path.expanduser(data_dir)
    train = _image_folder(os.path.join(root, "train"), image_transforms(image_size, True))
    test = _image_folder(os.path.join(root, "val"), image_transforms(image_size, False)) if with_test else None
    if test is not None and test.classes != train.classes:
        extra = sorted(set(test.classes) ^ set(train.classes))[:5]
        raise UsageError(
            f"imagefolder {show_path(root)}: train/ and val/ have different class folders ({extra}); "
            "give both the same classes"
        )
    return Datasets(train, test, (3, image_size, image_size), len(train.classes))


def _image_folder(path: str, transform):
    from torchvision.datasets import ImageFolder

    if not os.path.isdir(path):
        raise UsageError(
            f"imagefolder: {show_path(path)} is not a directory; put one sub-folder of images per class there"
        )
    _refuse_symlink_loops(path)
    try:
        return ImageFolder(path, transform=transform)
    except FileNotFoundError as err:  # no class folders, or no image files in them
        raise UsageError(
            f"imagefolder {show_path(path)}: {clip(str(err), 300)}; put one sub-folder of images "
            "(.jpg, .png, ...) per class there"
        ) from None


def _refuse_symlink_loops(root: str) -> None:
    """ImageFolder follows symlinks: one to a parent directory makes it walk for ever (two of them,
    exponentially). Walk the directories first (not the files: no stat per image) and refuse a loop."""
    stack = [(root, frozenset([_identity(root)]))]
    while stack:
        directory, ancestors = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # ImageFolder skips what it cannot list, too
        for entry in entries:
            try:
                if not entry.is_dir():  # follows a symlink; no stat for a plain file
                    continue
                identity = _identity(entry.path)
            except OSError:
                continue
            if identity in ancestors:
                raise UsageError(
                    f"imagefolder {show_path(root)}: {show_path(entry.path)} links back to a directory above it "
                    "(a loop); remove that symlink"
                )
            stack.append((entry.path, ancestors | {identity}))


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino

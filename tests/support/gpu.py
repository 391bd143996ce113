"""The GPU tests' helpers: their skip where there is no CUDA device, the folder a test of the GPU
check keeps its outputs in, and Fashion-MNIST-shaped IDX files made up on the spot (the GPU
machine has no data set and no network).

The GPU check (``launch/gpu-check OUT``, :mod:`bno_hvd.lab.gpucheck`) runs these tests as its
parts; what a test measures it reports with pytest's ``record_property`` (the check reads it from
the JUnit XML), so the same test is a plain test in ``launch/test`` on a GPU machine."""

import os

import numpy as np
import pytest
import torch

from bno_hvd.data.images import write_idx

NO_GPU = "no CUDA device on this machine (torch.cuda.is_available() is False)"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


def part_dir(tmp_path):
    """Where a test keeps what the report may point to: the check's part folder when the check
    runs it (``GPU_CHECK_PART_DIR``), else pytest's temporary folder."""
    return os.environ.get("GPU_CHECK_PART_DIR") or str(tmp_path)


def write_fashion_like(root, train: int, test: int, seed: int = 0) -> str:
    """IDX files where ``torchvision.datasets.FashionMNIST(root)`` reads them: 28x28 uint8 images of
    10 classes, each class a bright bar at its own place over noise (learnable in one epoch).
    Returns ``root``."""
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, count).astype(np.uint8)
        images = rng.integers(0, 96, (count, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            row = 2 + 2 * int(label)
            images[i, row : row + 3, 4:24] = 255
        write_idx(os.path.join(raw, f"{split}-images-idx3-ubyte"), images)
        write_idx(os.path.join(raw, f"{split}-labels-idx1-ubyte"), labels)
    return str(root)

"""Datasets: IDX round trips, torchvision MNIST layout, error messages, real Fashion-MNIST, synthetic."""

import gzip
import os

import numpy as np
import pytest
import torch

from bno_hvd.common.errors import UsageError
from bno_hvd.data.images import DATASET_NAMES, FASHION_MNIST_DIR, NORMALIZATION, load_dataset, read_idx, write_idx

torch.set_num_threads(1)

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"


def tiny_images(n, offset=0):
    """n distinct 28x28 uint8 images: image i holds (i + offset + pixel index) mod 256."""
    return ((np.arange(n * 28 * 28).reshape(n, 28, 28) + offset + np.arange(n)[:, None, None]) % 256).astype(np.uint8)


def make_mnist(root, gz_train=True, gz_test=False, n_train=6, n_test=3):
    """Tiny MNIST in torchvision's layout <root>/MNIST/raw, train gzipped and test plain by default."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    tr, te = (".gz" if gz_train else ""), (".gz" if gz_test else "")
    data = {
        "train": (tiny_images(n_train), np.arange(n_train, dtype=np.uint8) % 10),
        "test": (tiny_images(n_test, offset=100), np.array([9, 0, 5][:n_test], dtype=np.uint8)),
    }
    write_idx(raw / (TRAIN_IMAGES + tr), data["train"][0])
    write_idx(raw / (TRAIN_LABELS + tr), data["train"][1])
    write_idx(raw / (TEST_IMAGES + te), data["test"][0])
    write_idx(raw / (TEST_LABELS + te), data["test"][1])
    return data


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip_images_and_labels(tmp_path, suffix):
    images, labels = tiny_images(5), np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    write_idx(tmp_path / ("img" + suffix), images)
    write_idx(tmp_path / ("lab" + suffix), labels)
    got_images, got_labels = read_idx(tmp_path / ("img" + suffix)), read_idx(tmp_path / ("lab" + suffix))
    assert got_images.dtype == np.uint8 and got_images.shape == (5, 28, 28)
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)


def test_idx_header_is_the_published_format(tmp_path):
    write_idx(tmp_path / "lab", np.array([7, 2], dtype=np.uint8))
    write_idx(tmp_path / "img.gz", np.zeros((1, 2, 3), dtype=np.uint8))
    assert (tmp_path / "lab").read_bytes() == bytes.fromhex("00000801000000020702")
    with gzip.open(tmp_path / "img.gz", "rb") as f:
        assert f.read() == bytes.fromhex("00000803000000010000000200000003") + bytes(6)


def test_load_mnist_torchvision_layout_values_and_normalisation(tmp_path):
    data = make_mnist(tmp_path)
    mean, std = NORMALIZATION["mnist"]
    for split in ("train", "test"):
        images, labels = load_dataset("mnist", split, data_dir=str(tmp_path)).tensors
        raw_images, raw_labels = data[split]
        assert images.dtype == torch.float32 and images.shape == (len(raw_images), 1, 28, 28)
        assert labels.dtype == torch.int64
        assert labels.tolist() == raw_labels.tolist()
        expected = (torch.from_numpy(raw_images.astype(np.float32)) / 255 - mean) / std
        torch.testing.assert_close(images[:, 0], expected)
    # Pixel 0 of train image 0 is 0, pixel 255 is 255: the two ends of the scale.
    train_images = load_dataset("mnist", "train", data_dir=str(tmp_path)).tensors[0]
    assert train_images[0, 0, 0, 0].item() == pytest.approx(-mean / std)
    assert train_images[0, 0, 9, 3].item() == pytest.approx((1 - mean) / std)  # flat index 255 = row 9, col 3


def test_load_mnist_files_directly_in_data_dir(tmp_path):
    write_idx(tmp_path / TEST_IMAGES, tiny_images(2))
    write_idx(tmp_path / (TEST_LABELS + ".gz"), np.array([4, 2], dtype=np.uint8))
    images, labels = load_dataset("mnist", "test", data_dir=str(tmp_path)).tensors
    assert images.shape == (2, 1, 28, 28)
    assert labels.tolist() == [4, 2]


def test_bad_magic_names_the_file(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(bytes.fromhex("00000903000000010000000100000001") + b"\x00")
    with pytest.raises(UsageError, match="bad magic 0x00000903") as err:
        read_idx(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_truncated_file_names_the_file(tmp_path, suffix):
    path = tmp_path / ("cut" + suffix)
    write_idx(path, tiny_images(2))
    if suffix:
        payload = path.read_bytes()
        path.write_bytes(payload[: len(payload) // 2])  # a cut-off gzip stream
    else:
        path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(UsageError) as err:
        read_idx(path)
    assert str(path) in str(err.value)


def test_header_only_and_empty_files_are_rejected(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "header").write_bytes(bytes.fromhex("0000080300000001"))
    with pytest.raises(UsageError, match="truncated"):
        read_idx(tmp_path / "empty")
    with pytest.raises(UsageError, match="truncated"):
        read_idx(tmp_path / "header")


def test_missing_file_message_names_file_and_place(tmp_path):
    make_mnist(tmp_path)
    os.remove(tmp_path / "MNIST" / "raw" / TEST_LABELS)
    with pytest.raises(UsageError) as err:
        load_dataset("mnist", "test", data_dir=str(tmp_path))
    message = str(err.value)
    assert TEST_LABELS in message and str(tmp_path / "MNIST" / "raw") in message
    assert "\n" not in message


def test_missing_fashion_mnist_says_how_to_install(tmp_path):
    with pytest.raises(UsageError, match=TRAIN_IMAGES):
        load_dataset("fashion-mnist", "train", data_dir=str(tmp_path))


def test_mismatched_image_and_label_counts(tmp_path):
    write_idx(tmp_path / TEST_IMAGES, tiny_images(3))
    write_idx(tmp_path / TEST_LABELS, np.array([1, 2], dtype=np.uint8))
    with pytest.raises(UsageError, match="3 images but 2 labels"):
        load_dataset("mnist", "test", data_dir=str(tmp_path))


def test_unknown_names_list_the_choices(tmp_path):
    with pytest.raises(UsageError) as err:
        load_dataset("cifar10", "train")
    assert all(name in str(err.value) for name in DATASET_NAMES)
    with pytest.raises(UsageError, match="train, test"):
        load_dataset("synthetic", "validation")
    with pytest.raises(UsageError, match="data directory"):
        load_dataset("mnist", "train")


@pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR), reason=f"{FASHION_MNIST_DIR} missing: apt-get install dataset-fashion-mnist"
)
def test_real_fashion_mnist():
    train_images, train_labels = load_dataset("fashion-mnist", "train").tensors
    test_images, test_labels = load_dataset("fashion-mnist", "test").tensors
    assert train_images.shape == (60000, 1, 28, 28) and test_images.shape == (10000, 1, 28, 28)
    assert torch.bincount(train_labels).tolist() == [6000] * 10  # balanced, classes 0..9
    assert torch.bincount(test_labels).tolist() == [1000] * 10
    # The normalisation constants are right for this data: mean 0, std 1 on the training set.
    assert abs(train_images.mean().item()) < 0.01
    assert abs(train_images.std().item() - 1) < 0.01


def test_synthetic_is_deterministic_per_seed_and_sized():
    a = load_dataset("synthetic", "train", synthetic_size=64, seed=3).tensors
    b = load_dataset("synthetic", "train", synthetic_size=64, seed=3).tensors
    c = load_dataset("synthetic", "train", synthetic_size=64, seed=4).tensors
    test = load_dataset("synthetic", "test", synthetic_size=64, seed=3).tensors
    assert a[0].shape == (64, 1, 28, 28) and a[0].dtype == torch.float32 and a[1].dtype == torch.int64
    assert test[0].shape == (16, 1, 28, 28)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    # Test samples are not a copy of train samples, even when both splits have 16 of them.
    assert not torch.equal(load_dataset("synthetic", "train", synthetic_size=16, seed=3).tensors[0], test[0])
    assert set(a[1].tolist()) <= set(range(10))


def test_synthetic_labels_are_learnable_from_class_means():
    # Nearest class mean (estimated on train) must classify held-out test samples well above chance.
    images, labels = load_dataset("synthetic", "train", synthetic_size=1000, seed=0).tensors
    test_images, test_labels = load_dataset("synthetic", "test", synthetic_size=1000, seed=0).tensors
    means = torch.stack([images[labels == k].mean(0).flatten() for k in range(10)])
    predicted = torch.cdist(test_images.flatten(1), means).argmin(1)
    assert (predicted == test_labels).float().mean().item() > 0.9

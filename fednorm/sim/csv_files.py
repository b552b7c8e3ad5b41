"""A user's CSV file as a data set, with the causes a bare parse leaves implicit: the
one loader of CSV input (``fednorm simulate --dataset file.csv``, a multi-host party's
``--data``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import Dataset, load_dataset

_NON_NUMERIC = re.compile(r"holds non-numeric value '(?P<cell>[^']*)'(?P<where> \([^)]*\))?")
_FLOAT_MAX = float(np.finfo(np.float64).max)


def load_csv(name_or_path: Path | str, target: str | None = None) -> Dataset:
    """:func:`~fednorm.sim.datasets.load_dataset`, with the causes its errors leave
    implicit: a number too large for float64 is called that rather than non-numeric,
    and a file split by ';' or tabs gets a hint that fednorm reads commas."""
    try:
        return load_dataset(name_or_path, target)
    except InputError as exc:
        message = _NON_NUMERIC.sub(_explain_cell, str(exc), count=1)
        raise InputError(message + _delimiter_hint(name_or_path)) from None


def _explain_cell(match: re.Match[str]) -> str:
    cell, where = match["cell"], match["where"] or ""
    try:
        value = float(cell)
    except ValueError:
        return match[0]
    if math.isinf(value) and "inf" not in cell.lower():
        return (f"holds value {cell!r}{where}, beyond the range of float64 numbers "
                f"(about ±{_FLOAT_MAX:.3g})")
    return f"holds the non-finite value {cell!r}{where}"


def _delimiter_hint(name_or_path: Path | str) -> str:
    path = Path(name_or_path)
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as stream:
            header = stream.readline()
    except OSError:
        return ""
    for delimiter, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "'|'")):
        if "," not in header and delimiter in header:
            return (f" (the header line is separated by {name}: fednorm reads comma-"
                    "separated files; convert it, e.g. re-export it as CSV with commas)")
    return ""

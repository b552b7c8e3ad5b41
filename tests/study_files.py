"""What the study's tests share: rows of a results file, read and made."""

from __future__ import annotations

import csv
from pathlib import Path

from fednorm.training.grid import COLUMNS, KEY_COLUMNS, Cell


def read_rows(path: Path) -> list[dict[str, str]]:
    """A results file's rows, as the CSV reader gives them (every value a string)."""
    with path.open(newline="", encoding="utf-8") as stream:
        return list(csv.DictReader(stream))


def row_for(cell: Cell, **values: object) -> dict[str, object]:
    """A results row of ``cell``: every column empty but the key, a classification run
    that ended well, and ``values``."""
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    row.update(zip(KEY_COLUMNS, cell.key(), strict=True))
    row.update({"task": "classification", "status": "ok", **values})
    return row

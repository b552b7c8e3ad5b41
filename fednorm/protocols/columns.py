"""Named columns: pandas-like DataFrames read without importing pandas, and the one
message for parties whose columns differ (the library and a multi-host server say the
same)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fednorm.engine.errors import InputError, SessionRefused
from fednorm.engine.runtime import role_name


def is_table(data: object) -> bool:
    """A pandas-like DataFrame: named columns and ``to_numpy`` (pandas is not a dependency
    of the core, so it is not imported to ask)."""
    return hasattr(data, "columns") and hasattr(data, "to_numpy") and hasattr(data, "dtypes")


def table_values(frame: Any, who: str) -> np.ndarray:
    """A DataFrame's values as float64, missing values (NaN, pandas' ``<NA>`` of nullable
    dtypes) as NaN; a column that is not numbers or booleans is refused by name."""
    for name, dtype in zip(frame.columns, frame.dtypes, strict=True):
        if getattr(dtype, "kind", "O") not in "biuf":
            raise InputError(f"{who}'s column {name!r} is not numeric ({dtype})")
    return frame.astype("float64").to_numpy(dtype=np.float64, na_value=np.nan)


def column_names(frame: Any, who: str) -> tuple[str, ...]:
    """A DataFrame's column names as strings; two columns of one name are refused."""
    names = tuple(str(name) for name in frame.columns)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InputError(f"{who} has more than one column named {', '.join(map(repr, twice))}")
    return names


def column_difference(party: int, have: tuple[str, ...], expected: tuple[str, ...]) -> str:
    """Which columns a party lacks or adds against ``expected``, by name."""
    missing = [name for name in expected if name not in have]
    extra = [name for name in have if name not in expected]
    if not missing and not extra:
        return (f"party {party} has the federation's columns in another order "
                f"({', '.join(have)}; expected {', '.join(expected)})")
    parts = ([f"lacks {', '.join(map(repr, missing))}"] if missing else []) + (
        [f"has unexpected {', '.join(map(repr, extra))}"] if extra else [])
    return f"party {party}'s columns differ from the federation's: " + " and ".join(parts)


class ColumnsDiffer(InputError):
    """A party's columns are named otherwise than the federation's."""


def in_order(frame: Any, party: int, order: Sequence[str]) -> np.ndarray:
    """Party ``party``'s DataFrame as values, its columns put in ``order`` by name;
    :class:`ColumnsDiffer` (:func:`column_difference`'s words) if it holds other ones."""
    names = column_names(frame, f"party {party}")
    if sorted(names) != sorted(order):
        raise ColumnsDiffer(column_difference(party, names, tuple(order)))
    return table_values(frame[list(order)], f"party {party}")


def check_feature_names(features: Sequence[str], option: str = "--features") -> None:
    """The federation's column names as a server is given them (``option``): non-empty,
    each once."""
    if not features or not all(name.strip() for name in features):
        raise InputError(f"{option} needs non-empty names, got {list(features)}")
    duplicates = sorted({name for name in features if list(features).count(name) > 1})
    if duplicates:
        raise InputError(f"{option} names {', '.join(duplicates)} more than once")


def refuse_other_width(party: int, features: Sequence[str] | None, width: int) -> None:
    """:class:`SessionRefused` if ``party``'s data has another number of columns than
    the server names (``features``; None: the server names none)."""
    if features is not None and len(features) != width:
        raise SessionRefused(f"{role_name(party)} refused the session: its data has {width} "
                             f"columns, the ServerApp names {len(features)} "
                             f"({', '.join(features)})")

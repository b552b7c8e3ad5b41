"""Party data as people hold it — arrays, nested lists, pandas DataFrames — as the float
arrays the protocols take, with the parties' columns matched by name.

Arrays carry no names, so their columns are matched by position (the caller's
promise).  DataFrames do: the parties must hold the same set of columns, in any order;
each party's frame is reordered to one order (``features`` when given, else the first
party's), and a party that lacks or adds a column is refused, naming it — the check a
multi-host server makes at admission (:func:`~fednorm.session.column_difference`).
Without it, parties whose columns are named or ordered differently would be pooled
column by column into a wrong fit, without a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.protocols.columns import ColumnsDiffer, column_names, in_order, is_table


@dataclass(frozen=True)
class PartyTables:
    """The parties' data as arrays, and the columns' names when the data had names."""

    arrays: list[Any]
    features: tuple[str, ...] | None


def party_tables(party_data: object, features: Sequence[str] | None = None) -> PartyTables:
    """``party_data`` (one array, nested list or DataFrame per party) as arrays, columns
    matched by name when they have names; anything else is an :class:`InputError` that
    names the argument."""
    parties = _per_party(party_data)
    named = [is_table(X) for X in parties]
    if not any(named):
        return PartyTables(list(parties), None if features is None else tuple(features))
    if not all(named):
        raise InputError("party_data mixes DataFrames with unnamed arrays: give every "
                         "party's columns names, or none")
    order = tuple(features) if features is not None else column_names(parties[0], "party 1")
    arrays, differ = [], []
    for p, X in enumerate(parties, start=1):
        try:
            arrays.append(in_order(X, p, order))
        except ColumnsDiffer as exc:
            differ.append(str(exc))
    if differ:
        raise InputError("; ".join(differ))
    return PartyTables(arrays, order)


def _per_party(party_data: object) -> Sequence[Any]:
    if is_table(party_data) or isinstance(party_data, np.ndarray):
        kind = "DataFrame" if is_table(party_data) else "array"
        raise InputError(f"party_data takes one array or DataFrame per party, in a list; "
                         f"got a single {kind} (pass [data] for a federation of one party)")
    if isinstance(party_data, str | bytes) or not isinstance(party_data, Sequence):
        raise InputError(f"party_data takes one array or DataFrame per party, in a list; "
                         f"got {type(party_data).__name__}")
    return party_data

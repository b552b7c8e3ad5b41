"""Method names as users write them: one or several, each once, known to the registry."""

from __future__ import annotations

from collections.abc import Sequence

from fednorm.engine.errors import InputError
from fednorm.protocols.base import METHODS


def split_methods(text: str) -> tuple[str, ...]:
    """``"zscore, minmax"`` as names, in the order given; not checked (that is
    :func:`check_methods`, which a session plan runs once)."""
    return tuple(m.strip() for m in text.split(","))


def check_methods(methods: str | Sequence[str]) -> tuple[str, ...]:
    """``methods`` (``"zscore,minmax"`` or a sequence of names) as a tuple, if it names one
    or more known methods, each once; else an InputError that quotes them as a user
    writes them (``'zscore,zscroe'``)."""
    names = split_methods(methods) if isinstance(methods, str) else tuple(methods)
    unknown = sorted(set(names) - set(METHODS), key=repr)
    if unknown or not names or len(set(names)) != len(names):
        what = f"unknown method {', '.join(map(repr, unknown))}: " if unknown else ""
        raise InputError(f"{what}a session fits one or more of {', '.join(METHODS)}, each "
                         f"once, separated by commas; got {','.join(map(str, names))!r}")
    return names

"""Method names as users write them: one or several, each once, known to the registry."""

from __future__ import annotations

from fednorm.engine.errors import InputError
from fednorm.protocols.base import METHODS


def parse_methods(text: str) -> tuple[str, ...]:
    """``"zscore,minmax"``: methods in the order given, each once (else InputError)."""
    return check_methods(tuple(m.strip() for m in text.split(",")), text)


def check_methods(methods: tuple[str, ...], given: object) -> tuple[str, ...]:
    """``methods`` if it names one or more known methods, each once; else an InputError
    that quotes what was ``given``."""
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods or len(set(methods)) != len(methods):
        what = f"unknown method {', '.join(map(repr, unknown))}: " if unknown else ""
        raise InputError(f"{what}a session fits one or more of {', '.join(METHODS)}, each "
                         f"once, separated by commas; got {given!r}")
    return methods

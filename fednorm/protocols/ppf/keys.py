"""Joint keys for a session of PPF protocols: one collective key setup that covers every
protocol the federation will run, so that each of them reuses the keys.

Key generation does not depend on the data, and it is the costliest step of a short
protocol (most of PPF z-score's bytes are its relinearization shares). A federation that
normalizes with several methods, or runs one again, generates the keys once: the union of
what the methods need (relinearization, and each method's rotation by its slot block), in
a setup step of its own, so its time and bytes are reported apart from the protocols'
(the paper's complexity table, too, leaves one-time operations out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import METHODS, FitOptions, Protocol
from fednorm.protocols.collective import flooding_arguments, setup_party, setup_server
from fednorm.protocols.ppf import (
    extremes,
    minmax_layout,
    robust,
    yeojohnson,
    yeojohnson_sums,
    zscore,
)

KeyNeeds = Callable[[FitOptions], dict[str, object]]


def needs_of_algorithm(default: KeyNeeds, paper: KeyNeeds) -> KeyNeeds:
    """The key needs of the algorithm ``FitOptions.algorithm`` names."""
    def needs(options: FitOptions) -> dict[str, object]:
        return (paper if options.algorithm == "paper" else default)(options)
    return needs


NEEDS: dict[str, KeyNeeds] = {
    "zscore": zscore.setup_arguments,
    "minmax": needs_of_algorithm(default=extremes.setup_arguments,
                                 paper=minmax_layout.setup_arguments),
    "robust": robust.setup_arguments,
    "yeojohnson": needs_of_algorithm(default=yeojohnson_sums.setup_arguments,
                                     paper=yeojohnson.setup_arguments),
}


def key_needs(methods: Sequence[str], options: FitOptions) -> dict[str, object]:
    """The keys that cover every method: relinearization if any needs it, and the union
    of their rotations."""
    unknown = [m for m in methods if m not in NEEDS]
    if unknown or not methods:
        raise InputError(f"a key session needs methods among {', '.join(METHODS)}, "
                         f"got {list(methods)}")
    needs = [NEEDS[m](options) for m in methods]
    rotations = {rotation for n in needs for rotation in n.get("rotations", ())}
    return {"relinearize": any(bool(n.get("relinearize")) for n in needs),
            "rotations": tuple(sorted(rotations))}


def setup_protocol(methods: Sequence[str]) -> Protocol:
    """The key-setup step of a session that will run ``methods`` (each role returns
    None and keeps the keys in ``RoleContext.crypto``)."""
    methods = tuple(methods)

    async def server(rc: RoleContext, options: FitOptions) -> None:
        await setup_server(rc, options.preset, **key_needs(methods, options))

    async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> None:
        await setup_party(rc, options.preset, **key_needs(methods, options),
                          **flooding_arguments(options))

    return Protocol("keys-mhe", "keys", "mhe", server, party)

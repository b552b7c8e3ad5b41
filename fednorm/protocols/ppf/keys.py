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

from collections.abc import Sequence

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import METHODS, FitOptions, Protocol, get_protocol
from fednorm.protocols.collective import flooding_arguments, setup_party, setup_server


def key_needs(methods: Sequence[str], options: FitOptions) -> dict[str, object]:
    """The keys that cover every method, as each registered protocol's algorithm declares
    them (:class:`~fednorm.protocols.base.Kind`): relinearization if any needs it, and the
    union of their rotations."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise InputError(f"a key session needs methods among {', '.join(METHODS)}, "
                         f"got {list(methods)}")
    needs = [get_protocol(m, "mhe").kind(options).key_needs(options) for m in methods]
    rotations = {rotation for n in needs for rotation in n.get("rotations", ())}
    return {"relinearize": any(bool(n.get("relinearize")) for n in needs),
            "rotations": tuple(sorted(rotations))}


def setup_protocol(methods: Sequence[str]) -> Protocol:
    """The key-setup step of a session that will run ``methods`` (each role returns
    None and keeps the keys in ``RoleContext.held_keys``)."""
    methods = tuple(methods)

    async def server(rc: RoleContext, options: FitOptions) -> None:
        await setup_server(rc, options.preset, **key_needs(methods, options))

    async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> None:
        await setup_party(rc, options.preset, **key_needs(methods, options),
                          **flooding_arguments(options))

    return Protocol.single("keys-mhe", "keys", "mhe", server, party)

"""What every aggregation checks before OpenFHE combines shares, and the running sum they
share.

OpenFHE adds whatever it is given; a share made under a foreign key, at another level or
for another operation would give garbage, not an error.  So each ``aggregate_shares``
runs these checks first and turns a wrong share into a :class:`ProtocolError` that
names it.  Shares are passed in party order, lead first, all at once or one at a time
(:class:`RunningSum`: a server need not hold P shares to add them up).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import openfhe

from fednorm.engine import inprocess
from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys
from fednorm.engine.ckks.serial import deserialize
from fednorm.engine.errors import ProtocolError


def require_shares(shares: Sequence[Any], kind: type, joint: JointKeys | None,
                   what: str) -> None:
    """``shares`` must all be ``kind`` (what they say they are shares of) and, given the
    joint keys, one per party."""
    if not shares:
        raise ProtocolError(f"no {what}s")
    for i, share in enumerate(shares):
        if not isinstance(share, kind):
            raise ProtocolError(f"{what} #{i} is a {type(share).__name__}, "
                                f"not a {kind.__name__}")
    if joint is not None and len(shares) != joint.n_parties:
        raise ProtocolError(f"{len(shares)} {what}s for {joint.n_parties} parties")


def require_tags(objs: Sequence[Any], expected: Sequence[str], what: str) -> None:
    """OpenFHE object ``i`` must carry key tag ``expected[i]``."""
    for i, (obj, want) in enumerate(zip(objs, expected, strict=True)):
        require_tag(obj, want, f"{what} #{i}")


def require_tag(obj: Any, want: str, what: str) -> None:
    if obj.GetKeyTag() != want:
        raise ProtocolError(f"{what} has key tag {obj.GetKeyTag()!r}, expected {want!r}")


def require_like(ctx: CkksContext, ct: openfhe.Ciphertext, like: openfhe.Ciphertext,
                 what: str) -> None:
    """``ct`` must match ``like`` in context, element count, level and scale."""
    ctx.check_same_context(ct, what)
    got = (ct.NumberCiphertextElements(), ct.GetLevel(), ct.GetNoiseScaleDeg(),
           ct.GetScalingFactor())
    want = (like.NumberCiphertextElements(), like.GetLevel(), like.GetNoiseScaleDeg(),
            like.GetScalingFactor())
    if got != want:
        raise ProtocolError(f"{what}: (elements, level, noise degree, scale) = {got}, "
                            f"expected {want}")


class RunningSum:
    """A sum with OpenFHE's pairwise ``add``, one value at a time: it holds the sum so
    far, never the values (at ring 2^15 a party's key shares are ~31 MB; a server of
    P parties adding them as they arrive holds one, not P).  A single value goes through
    ``lone``.

    In a simulation every party adds the same signed shares in the same order to check
    the joint keys; a sum named by ``chain`` (the key operation, its round, the joint key
    tag) whose every value came with ``step`` — the digest its maker signed, the same for
    every party — takes each step from the party that made it first (:class:`SharedSteps`):
    P parties add P shares once, not P times, and hold one sum between them.
    """

    def __init__(self, add: Callable[[Any, Any], Any],
                 lone: Callable[[Any], Any] = lambda value: value,
                 chain: tuple[object, ...] | None = None) -> None:
        self._add = add
        self._lone = lone
        self._sum: Any = None
        self.count = 0
        self._chain = chain
        self._trail: bytes | None = b""  # digest of the steps so far; None: one was unnamed

    def add(self, value: Any, step: bytes = b"") -> None:
        """Add ``value``; ``step``: the digest its maker signed (b"": unknown)."""
        named = self._chain is not None and self._trail is not None and step
        self._trail = hashlib.sha256(self._trail + step).digest() if named else None
        if self.count == 0:
            self._sum = value
        elif self._trail is None or not inprocess.active():
            self._sum = self._add(self._sum, value)
        else:
            self._sum = _SHARED.step(self._chain, self._trail,
                                     lambda: self._add(self._sum, value))
        self.count += 1

    def result(self) -> Any:
        if self.count == 0:
            raise ProtocolError("no shares to add up")
        return self._lone(self._sum) if self.count == 1 else self._sum


KEPT_STEPS = 4
"""Steps of each running sum kept for the parties that have not reached them yet."""


class SharedSteps:
    """The latest steps of each running sum of an in-process run, by the digest trail
    that led to each: the first party to reach a step makes it, the others take it.
    Parties add the forwarded shares nearly in step; one that falls more than
    :data:`KEPT_STEPS` behind makes its own (the same sum, made again).  The last run to
    end lets them go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[object, dict[bytes, Any]] = {}
        self._making: dict[object, threading.Lock] = {}

    def step(self, chain: tuple[object, ...], trail: bytes, make: Callable[[], Any]) -> Any:
        """The sum of ``chain`` whose digest trail is ``trail`` (the steps so far, this
        one's included): taken if kept, else made and kept."""
        with self._lock:
            making = self._making.setdefault(chain, threading.Lock())
        with making:  # a party reaching the step while another makes it waits for it
            with self._lock:
                kept = self._kept.setdefault(chain, {})
                if trail in kept:
                    return kept[trail]
            made = make()
            with self._lock:
                kept[trail] = made
                while len(kept) > KEPT_STEPS:
                    kept.pop(next(iter(kept)))
            return made

    def forget_objects(self) -> None:
        with self._lock:
            self._kept.clear()
            self._making.clear()


_SHARED = SharedSteps()
inprocess.keep_for_runs(_SHARED)


def retagged_copy(obj: Any, tag: str, load: Callable[[bytes, Any], Any]) -> Any:
    """A copy of a lone share carrying the joint ``tag`` (never retag a caller's object)."""
    copied = deserialize(load, openfhe.Serialize(obj, openfhe.BINARY))
    copied.SetKeyTag(tag)
    return copied

"""What every aggregation checks before OpenFHE combines shares, and the fold they share.

OpenFHE adds whatever it is given; a share made under a foreign key, at another level or
for another operation would give garbage, not an error.  So each ``aggregate_shares``
runs these checks first and turns a wrong share into a :class:`ProtocolError` that
names it.  Shares are passed in party order, lead first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys
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


def fold(values: Sequence[Any], add: Callable[[Any, Any], Any],
         lone: Callable[[Any], Any] = lambda value: value) -> Any:
    """Sum with OpenFHE's pairwise ``add``; a single value goes through ``lone``."""
    if len(values) == 1:
        return lone(values[0])
    return reduce(add, values[1:], values[0])


def retagged_copy(obj: Any, tag: str, load: Callable[[bytes, Any], Any]) -> Any:
    """A copy of a lone share carrying the joint ``tag`` (never retag a caller's object)."""
    copied = load(openfhe.Serialize(obj, openfhe.BINARY), openfhe.BINARY)
    copied.SetKeyTag(tag)
    return copied

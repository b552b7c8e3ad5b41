"""The flooded decryptions a session makes, counted before any key is made.

One joint key serves at most τ flooded decryptions (``FitOptions.flooding_decryptions``):
the flooding is sized for τ, and a party refuses the decryption past it
(:meth:`~fednorm.protocols.collective.PartyCrypto.count_flooded_share`).  The protocols of
a session share its keys, so their decryptions add up.  Where public numbers (the
preset's slots, the number of features, the options) fix how many a protocol makes at
most (:attr:`~fednorm.protocols.base.Kind.flooded_decryptions`, the counts its parties
allow), a run that needs more than τ is refused here, by every runner, before anything
is sent: without this check it would run until a party refused, after all the work
(the default Yeo-Johnson of 100 parties stopped after 80 minutes).  Protocols that do
not declare a count (the paper's algorithms, whose rounds depend on the data) are
counted by the parties as they run.
"""

from __future__ import annotations

from collections.abc import Sequence

from fednorm.engine.errors import InputError, SessionRefused
from fednorm.engine.runtime import role_name
from fednorm.protocols.base import FitOptions, Protocol


def session_decryptions(protocols: Sequence[Protocol], options: FitOptions, width: int
                        ) -> dict[str, int]:
    """Per protocol of the session that declares it, the most flooded decryptions it makes
    on ``width`` features."""
    counts = {}
    for protocol in protocols:
        declared = protocol.kind(options).flooded_decryptions
        if declared is not None:
            counts[protocol.name] = declared(options, width)
    return counts


def require_decryptions_within(protocols: Sequence[Protocol], options: FitOptions,
                               width: int) -> None:
    """InputError, before any key, if the session may make more flooded decryptions
    than the τ its keys are declared for, naming both numbers and what each protocol
    needs; the message names no data (the number of features is the agreed schema), so
    every role may report it."""
    counts = session_decryptions(protocols, options, width)
    needed, allowed = sum(counts.values()), options.flooding_decryptions
    if needed <= allowed:
        return
    parts = ", ".join(f"{name} {count}" for name, count in counts.items())
    raise InputError(
        f"this session makes up to {needed} flooded decryptions on {width} features "
        f"({parts}), more than the τ = {allowed} its keys are declared for: declare at "
        f"least {needed} (--flooding-decryptions, FitOptions(flooding_decryptions=...))"
        + (", or run the methods in separate sessions" if len(counts) > 1 else ""))


def refuse_decryptions_beyond(party: int, protocols: Sequence[Protocol], options: FitOptions,
                              width: int) -> None:
    """:class:`SessionRefused` if ``party``'s keys would serve more flooded decryptions
    than the τ the server announced (:func:`require_decryptions_within`): a party checks
    this itself, on its own number of columns, where a server may not know them (a Flower
    ServerApp without ``features``) or may skip the check."""
    try:
        require_decryptions_within(protocols, options, width)
    except InputError as exc:
        raise SessionRefused(f"{role_name(party)} refused the session: {exc}") from None

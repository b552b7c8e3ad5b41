"""The flooded decryptions a session makes, against its keys' flooding budget, counted
before any key is made.

Flooding for τ decryptions (``FitOptions.flooding_decryptions``) gives each share noise
σ = √(12τ)·2^(s/2)·t: the divergence a decryption's noise leaks, ∝ t²/σ² = 1/(12τ·2^s),
adds up over decryptions, so τ of them stay within the bound s sets.  A share flooded for
τ_k decryptions spends 1/τ_k of that budget: the sums of a session are flooded for τ, and
a product of many parties' bits for τ_p = min(τ, the most its bits stay readable at)
(:func:`~fednorm.protocols.collective.sums.product_decryptions`), so at P = 100 a product
spends more of the budget than a sum does, and no decryption is flooded less than its
share requires.  A party refuses the share that would spend past the whole budget
(:meth:`~fednorm.protocols.collective.PartyCrypto.count_flooded_share`).

The protocols of a session share its keys, so their decryptions add up.  Where public
numbers (the preset's slots, the features, the parties, the options) fix how many a
protocol makes at most (:attr:`~fednorm.protocols.base.Kind.flooded_decryptions`, the
counts its parties allow), a run that would spend more than the budget is refused here,
by every runner, before anything is sent: without this check it ran until a party
refused, after all the work (the default Yeo-Johnson of 100 parties stopped after 80
minutes).  Protocols that declare no count (the paper's algorithms, whose rounds depend
on the data) are counted by the parties as they run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from fednorm.engine.ckks import get_preset
from fednorm.engine.errors import InputError, SessionRefused
from fednorm.engine.runtime import role_name
from fednorm.protocols.base import FitOptions, Protocol
from fednorm.protocols.ledger import Allowance
from fednorm.protocols.ppf.checks import require_product_for


def session_decryptions(protocols: Sequence[Protocol], options: FitOptions, width: int
                        ) -> dict[str, Allowance]:
    """Per protocol of the session that declares it, the most flooded decryptions (sums
    and products) it makes on ``width`` features."""
    counts = {}
    for protocol in protocols:
        declared = protocol.kind(options).flooded_decryptions
        if declared is not None:
            counts[protocol.name] = declared(options, width)
    return counts


def decryption_count(total: Allowance) -> int:
    """Flooded decryptions of every kind ``total`` declares, each counted once."""
    return total.sums + total.coefficients + total.products + total.decryptions


def budget_spent(total: Allowance, decryptions: int, readable: int) -> Fraction:
    """The share of the keys' flooding budget ``total`` spends: 1/τ per sum (and per masked
    sum and decryption of a computed ciphertext), 1/τ_p per product, τ_p = min(τ, ``readable``),
    at least 1 where there are products."""
    spent = Fraction(total.sums + total.coefficients + total.decryptions, decryptions)
    if total.products:
        spent += Fraction(total.products, min(decryptions, readable))
    return spent


def least_decryptions(total: Allowance, readable: int) -> int | None:
    """The smallest τ whose budget ``total`` fits (:func:`budget_spent` ≤ 1); None if
    its products alone spend it all, whatever τ."""
    count = decryption_count(total)
    if not total.products or count <= readable:
        return count
    if total.products >= readable:
        return None
    rest = Fraction(total.sums + total.coefficients + total.decryptions) \
        / (1 - Fraction(total.products, readable))
    return max(readable + 1, math.ceil(rest))


def require_decryptions_within(protocols: Sequence[Protocol], options: FitOptions,
                               width: int, parties: int) -> None:
    """InputError, before any key, if the session's declared decryptions on ``width``
    features and ``parties`` parties would spend more than its keys' flooding budget,
    naming the numbers and the τ that would do; the message names no data (the number
    of features is the agreed schema), so every role may report it."""
    counts = session_decryptions(protocols, options, width)
    total = sum(counts.values(), Allowance())
    readable = 0
    if total.products:  # refused here if no product of so many parties' bits can be read
        readable = require_product_for(get_preset(options.preset), parties,
                                       options.flooding_bits)
    allowed = options.flooding_decryptions
    if budget_spent(total, allowed, readable) <= 1:
        return
    parts = ", ".join(f"{name} {_kinds(count)}" for name, count in counts.items())
    weights = (f"; a product of {parties} parties' bits is flooded for at most {readable} "
               f"decryptions, so it spends 1/{readable} of the budget where a sum spends "
               f"1/{allowed}" if total.products and readable < allowed else "")
    least = least_decryptions(total, readable)
    remedy = (f"declare at least τ = {least} (--flooding-decryptions, "
              "FitOptions(flooding_decryptions=...))" if least is not None else
              "no τ fits: fewer features or parties per session, or a smaller s "
              "(flooding_bits)")
    raise InputError(
        f"this session makes up to {decryption_count(total)} "
        f"flooded decryptions on {width} features ({parts}), more than keys declared for "
        f"τ = {allowed} serve{weights}: {remedy}"
        + (", or run the methods in separate sessions" if len(counts) > 1 else ""))


def _kinds(count: Allowance) -> str:
    """"3 sums", "8 products + 18 sums", "8 masked sums + 18 sums"."""
    kinds = [f"{n} {name}" for n, name in ((count.products, "products"),
                                           (count.coefficients, "coefficient sums"),
                                           (count.sums + count.decryptions, "sums")) if n]
    return " + ".join(kinds) or "none"


def refuse_decryptions_beyond(party: int, protocols: Sequence[Protocol], options: FitOptions,
                              width: int, parties: int) -> None:
    """:class:`SessionRefused` if the session would spend more than ``party``'s keys'
    flooding budget (:func:`require_decryptions_within`): a party checks this itself, on
    its own number of columns, where a server may not know them (a Flower ServerApp
    without ``features``) or may skip the check."""
    try:
        require_decryptions_within(protocols, options, width, parties)
    except InputError as exc:
        raise SessionRefused(f"{role_name(party)} refused the session: {exc}") from None

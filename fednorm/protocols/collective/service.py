"""The party's service loop: answer the server's collective requests during a protocol.

A party answers decryption and bootstrap requests with :func:`serve_until`, which also
caps how many of each the server may ask for in each phase, binds a decryption's retry
to the request it retries, never shares one ciphertext twice, and, where the party
recomputes the server's step (:class:`RequestCheck`), answers only the requests its own
run of the step makes — so a party, not just the server, enforces the leakage ledger.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.collective.bootstrap import BOOTSTRAP, answer_bootstrap
from fednorm.protocols.collective.decryption import (
    DECRYPT,
    DECRYPT_COEFFICIENTS,
    DECRYPT_PRODUCT,
    DECRYPT_SUM,
    answer_coefficient_decryption,
    answer_decryption,
    answer_product_decryption,
    answer_sum_decryption,
    require_retry_of,
)
from fednorm.protocols.collective.messages import (
    BootRequest,
    CoefficientDecryptRequest,
    DecryptRequest,
    ProductDecryptRequest,
    SumDecryptRequest,
)
from fednorm.protocols.collective.roles import PartyCrypto

M = TypeVar("M", bound=Message)


class RequestCheck(Protocol):
    """A party's own run of the server's step (:class:`fednorm.protocols.ppf.driver.
    Replay`): it refuses a decryption or bootstrap request that is not the run's next,
    and learns each bootstrap's outcome from every party's forwarded share."""

    async def check(self, crypto: PartyCrypto, request: Message) -> None: ...

    async def answered(self, crypto: PartyCrypto, shares: list[ckks.BootstrapShare]
                       ) -> None: ...


@dataclass(frozen=True)
class _Service:
    """One kind of request a party answers: its sub-protocol, its name in a refusal,
    and the answer."""

    subprotocol: str
    noun: str  # its kind, counted: "bootstraps"
    request: str  # one request, in a refusal: "bootstrap request"
    answer: Callable[[PartyCrypto, Any], Awaitable[Any]]


_SERVICES: dict[type[Message], _Service] = {
    BootRequest: _Service(BOOTSTRAP, "bootstraps", "bootstrap request", answer_bootstrap),
    DecryptRequest: _Service(DECRYPT, "decryptions", "decryption request", answer_decryption),
    SumDecryptRequest: _Service(DECRYPT_SUM, "sum decryptions", "sum decryption request",
                                answer_sum_decryption),
    ProductDecryptRequest: _Service(DECRYPT_PRODUCT, "product decryptions",
                                    "product decryption request", answer_product_decryption),
    CoefficientDecryptRequest: _Service(DECRYPT_COEFFICIENTS, "coefficient decryptions",
                                   "coefficient decryption request", answer_coefficient_decryption),
}


async def serve_until(
    crypto: PartyCrypto, expected: type[M] | tuple[type[Message], ...], *, decryptions: int,
    bootstraps: int = 0, sums: int = 0, products: int = 0, coefficients: int = 0,
    retries: int = 0, checked: RequestCheck | None = None,
) -> M:
    """Answer the server's bootstrap and decryption requests until ``expected`` arrives
    (a message type, or a tuple of them).

    At most ``decryptions`` decryption requests, ``sums``, ``products`` and
    ``coefficients`` flooded decryptions of sum, product and coefficient uploads and
    ``bootstraps`` bootstrap requests are
    honoured in this phase: the ledger fixes what each protocol step may reveal and
    compute, and a server asking for more is refused.  Once the decryptions are spent,
    ``retries`` more are honoured, each only as the retry of the decryption request just
    before (:func:`~.decryption.require_retry_of`).  A bootstrap request must name the next
    common random element of these keys (never one used before), and no request may
    ask for a second share of a ciphertext (:meth:`PartyCrypto.claim_share`).  With
    ``checked``, every decryption and bootstrap request but a retry must be the next of
    the party's own run of the step (a bootstrap's shares are then forwarded to it).
    """
    rc = crypto.rc
    kinds = expected if isinstance(expected, tuple) else (expected,)
    left = {BootRequest: bootstraps, SumDecryptRequest: sums,
            ProductDecryptRequest: products, CoefficientDecryptRequest: coefficients,
            DecryptRequest: decryptions}
    previous = None  # the last plain decryption request answered: what a retry repeats
    while True:
        msg = await _next_request_or(rc, kinds)
        if isinstance(msg, kinds):
            return msg  # type: ignore[return-value]
        service = _SERVICES[type(msg)]
        retry = False
        if left[type(msg)] > 0:
            left[type(msg)] -= 1
        elif isinstance(msg, DecryptRequest) and retries > 0:
            await require_retry_of(crypto, previous, msg)
            retries, retry = retries - 1, True
        else:
            raise ProtocolError(f"the server asked for more {service.noun} than the "
                                "protocol step declares")
        if isinstance(msg, DecryptRequest):  # only a plain decryption may be retried
            previous = msg.ciphertext if msg.declared_noise() is None else None
        if checked is None or retry or not isinstance(msg, DecryptRequest | BootRequest):
            await service.answer(crypto, msg)  # sums and products check themselves
            continue
        repeat = msg.ciphertext if isinstance(msg, DecryptRequest) else msg.c1
        await crypto.require_unshared(service.request, repeat)  # a repeat named first
        await checked.check(crypto, msg)
        if isinstance(msg, BootRequest):
            await checked.answered(crypto, await answer_bootstrap(crypto, msg, forwarded=True))
        else:
            await service.answer(crypto, msg)
            await checked.answered(crypto, [])


async def _next_request_or(rc: RoleContext, kinds: tuple[type[Message], ...]) -> Message:
    """The next server frame: a collective request (in its sub-protocol) or one of ``kinds``.

    A request's frame carries the sub-protocol id, so which scope to read it in is known
    only from the kind; the round counter is shared, so peeking does not reorder.
    """
    accepted: dict[type[Message], str] = dict.fromkeys(kinds, rc.protocol)
    for request, service in _SERVICES.items():
        accepted[request] = f"{rc.protocol}/{service.subprotocol}"
    return await rc.receive_any(SERVER, accepted)

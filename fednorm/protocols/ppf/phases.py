"""A party's side of one phase of a PPF protocol, held to the phase's declared allowance.

Between two of its own messages a party answers the server's collective requests
(decryptions, sum decryptions, bootstraps); the ledger declares how many each phase
may ask for (:class:`~fednorm.protocols.ledger.Allowance`, listed in each protocol's
declaration), and a server asking for more is refused.
"""

from __future__ import annotations

from typing import TypeVar

from fednorm.engine.ckks.cores import Core
from fednorm.engine.messages import Message
from fednorm.protocols.collective import PartyCrypto, serve_until
from fednorm.protocols.collective.service import RequestCheck
from fednorm.protocols.ledger import Allowance
from fednorm.protocols.ppf.driver import Replay, Trusted

M = TypeVar("M", bound=Message)
T = TypeVar("T")


async def serve_phase(crypto: PartyCrypto, expected: type[M] | tuple[type[Message], ...],
                      allowance: Allowance, checked: RequestCheck | None = None) -> M:
    """Answer the server's requests within ``allowance`` (each checked by ``checked``, the
    party's own run of the step, if given) until ``expected`` arrives."""
    return await serve_until(crypto, expected, decryptions=allowance.decryptions,
                             sums=allowance.sums, products=allowance.products,
                             coefficients=allowance.coefficients,
                             bootstraps=allowance.bootstraps,
                             retries=allowance.retries, checked=checked)


async def serve_replayed(crypto: PartyCrypto, core: Core[T] | None,
                         expected: type[M] | tuple[type[Message], ...], allowance: Allowance
                         ) -> tuple[M, T | None]:
    """:func:`serve_phase`, each request checked against this party's own run of the
    server's ``core`` for the step (:class:`~.driver.Replay`); with the core's result
    (what the server goes on with), once the server has made every request it makes.
    ``core`` None: the step taken on trust (``FitOptions.replay`` off,
    :class:`~.driver.Trusted`), and the result is None."""
    checked = Trusted() if core is None else Replay(core)
    msg = await serve_phase(crypto, expected, allowance, checked)
    return msg, await checked.finish(crypto)

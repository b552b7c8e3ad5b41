"""A deviating server's bootstrap request, played through the real party roles: with
``c1 = a + K`` (``a`` the common random element every role derives), a party's share
pair sums to ``K·s_i`` plus small noise, and the server reads the party's secret-key
share from the ring.

The default protocols never bootstrap, so their parties refuse every bootstrap request
(their phases declare none): the attack gets no share.  For the paper's algorithms the
defence (a party recomputes the ciphertext it is asked to refresh from a signed
transcript, docs/LEAKAGE.md) is not built yet: that test says what must happen — every
party refuses, the server receives no share — and is expected to fail with
:class:`KeyShareRead`, raised only when the server really reads a ternary secret, until
the defence lands.  Until then a multi-host party joins a session of the paper's
algorithms only if its operator allows it (``--allow-paper-algorithms``): by default it
refuses in the handshake, before it makes any key share, and the attack gets nothing
(played over TCP below).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio
from deviating import deviating, zscore_server_start
from key_share_attack import KeyShareRead, attack
from tcp_federation import tcp_run

from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.base import FitOptions
from fednorm.sim.federation import run_federation
from fednorm.transport.memory import StarLinks, memory_star

PAPER_ZSCORE = FitOptions(algorithm="paper", preset="test")

def _run_attack(method: str, server, options: FitOptions,
                links: StarLinks = memory_star) -> ProtocolError:
    parts = [np.ones((4, 2)) * i for i in range(1, 4)]
    with pytest.raises(ProtocolError) as refusal:
        trio.run(partial(run_federation, deviating(method, server=server), parts, options,
                         timeout=60, links=links))
    return refusal.value


@pytest.mark.parametrize("method", ["zscore", "robust", "minmax", "yeojohnson"])
def test_a_default_protocol_refuses_the_bootstrap_attack(method: str, links: StarLinks
                                                         ) -> None:
    """After the parties' first upload, the server asks for a bootstrap share of
    ``c1 = a + K``: no default protocol declares a bootstrap, so every party refuses and
    the server reads nothing (with the paper's z-score, below, it reads every key share)."""
    from contextlib import nullcontext

    from fednorm.protocols.collective import setup_server
    from fednorm.protocols.ppf import extremes, kth
    from fednorm.protocols.ppf import zscore as ppf_zscore
    from fednorm.protocols.ppf.keys import key_needs

    first = {"zscore": ppf_zscore.EncryptedSums, "robust": kth.CountsAndOpening,
             "minmax": extremes.EncryptedBits, "yeojohnson": extremes.EncryptedBits}[method]
    read: dict[int, np.ndarray] = {}

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **key_needs([method], options))
        with rc.subprotocol("extremes") if first is extremes.EncryptedBits \
                else nullcontext():
            await rc.gather(first)
            await attack(read, crypto, rc, crypto.encrypt(np.ones(2)))

    refusal = _run_attack(method, server, FitOptions(preset="test"), links)
    assert not read, f"the server read the key shares of parties {sorted(read)}"
    assert "bootstrap" in str(refusal)


@pytest.mark.xfail(raises=KeyShareRead, strict=True,
                   reason="bootstrap requests are not yet bound to a recomputed ciphertext")
def test_a_bootstrap_request_on_a_plus_k_is_refused() -> None:
    read: dict[int, np.ndarray] = {}

    async def server(rc, options):
        crypto, count = await zscore_server_start(rc, options)
        await attack(read, crypto, rc, count)

    refusal = _run_attack("zscore", server, PAPER_ZSCORE)
    if read:
        raise KeyShareRead(f"the server read the secret-key shares of parties {sorted(read)} "
                           f"(ternary, {len(next(iter(read.values())))} coefficients each)")
    assert "bootstrap" in str(refusal)


def test_over_tcp_a_party_joins_the_paper_algorithms_only_when_allowed(
    certs: Path,
) -> None:
    """The attacking server above, as a multi-host server announcing the paper's z-score:
    parties 1 and 2 were started with ``--allow-paper-algorithms``, party 3 without.
    Party 3 withdraws in the handshake, every role reports its reason, and no party
    made a key share or anything the attack could read."""
    read: dict[int, np.ndarray] = {}

    async def server(rc, options):
        crypto, count = await zscore_server_start(rc, options)
        await attack(read, crypto, rc, count)

    errors, watch, outcome = tcp_run(certs, server, options=PAPER_ZSCORE,
                                     allowing={1, 2})
    cause = ("party 3 refused the session: zscore-mhe with --algorithm paper answers "
             "bootstrap or decryption requests a party cannot check")
    assert isinstance(errors[3], InputError), errors
    for error in (*errors.values(), outcome.error):
        assert cause in str(error), error
    assert not read
    assert not watch.encrypted and not any(watch.sent.values()), watch.sent

"""A deviating server's bootstrap request, played through the real party roles: with
``c1 = a + K`` (``a`` the common random element every role derives), a party's share
pair sums to ``K·s_i`` plus small noise, and the server reads the party's secret-key
share from the ring.

The default protocols never bootstrap, so their parties refuse every bootstrap request
(their phases declare none): the attack gets no share.  The paper's z-score bootstraps
its encrypted inverse: each party recomputes the ciphertext it is asked to refresh from
the relayed, signed uploads (docs/LEAKAGE.md), so every party refuses the crafted
request and the server reads nothing (:class:`KeyShareRead` is raised only when it
really reads a ternary secret; on the code before that check, it did, for every party).
The paper's MinMax and Yeo-Johnson are recomputed too (``tests/test_paper_replay.py``),
but none of the paper's algorithms floods its plain decryptions: a multi-host party joins
them only if its operator allows it
(``--allow-paper-algorithms``), and by default refuses in the handshake, before it makes
any key share (played over TCP below).
"""

from __future__ import annotations

from dataclasses import replace
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
    from fednorm.protocols.ppf import extremes, kth, pooled
    from fednorm.protocols.ppf.keys import key_needs

    first = {"zscore": pooled.EncryptedCoefficients, "robust": kth.CountsAndOpening,
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


def _attack_on_the_paper_zscore(links: StarLinks) -> ProtocolError:
    read: dict[int, np.ndarray] = {}

    async def server(rc, options):
        crypto, count = await zscore_server_start(rc, options)
        await attack(read, crypto, rc, count)

    refusal = _run_attack("zscore", server, PAPER_ZSCORE, links)
    if read:
        raise KeyShareRead(f"the server read the secret-key shares of parties {sorted(read)} "
                           f"(ternary, {len(next(iter(read.values())))} coefficients each)")
    return refusal


def test_a_bootstrap_request_on_a_plus_k_is_refused(links: StarLinks) -> None:
    """The paper's z-score, its first bootstrap request replaced by ``c1 = a + K``:
    each party's own run of the encrypted inverse asks to refresh another ciphertext."""
    refusal = _attack_on_the_paper_zscore(links)
    assert "bootstrap request refused: its ciphertext is not the one this party " \
           "computes" in str(refusal), refusal


def test_over_tcp_a_party_joins_the_paper_algorithms_only_when_allowed(
    certs: Path,
) -> None:
    """A multi-host server announcing the paper's MinMax (whose decryptions a party floods
    by a measured noise only): parties 1 and 2 were started with ``--allow-paper-algorithms``,
    party 3 without.  Party 3 withdraws in the handshake, every role reports its
    reason, and no party made a key share or anything a server could read."""
    async def server(rc, options):
        raise AssertionError("the session never starts")

    options = FitOptions(algorithm="paper", preset="test", vabs=(20.0,))
    errors, watch, outcome = tcp_run(certs, server, options=options, allowing={1, 2},
                                     method="minmax")
    cause = "party 3 refused the session: minmax-mhe with --algorithm paper decrypts " \
            "without a proven flooding bound"
    assert isinstance(errors[3], InputError), errors
    for error in (*errors.values(), outcome.error):
        assert cause in str(error), error
    assert not watch.encrypted and not any(watch.sent.values()), watch.sent


@pytest.mark.parametrize("replay", [True, False], ids=["server says replay",
                                                       "server says replay=False"])
def test_over_tcp_every_party_refuses_the_bootstrap_attack(certs: Path, replay: bool
                                                           ) -> None:
    """The paper's z-score between multi-host roles (its parties allowed to join: its
    quotients are decrypted without flooding): the ``a + K`` attack is refused by every
    party, and the server reads nothing — also from a server whose options turn the
    parties' replay off (``FitOptions.replay`` never travels: each party decides)."""
    read: dict[int, np.ndarray] = {}

    async def server(rc, options):
        crypto, count = await zscore_server_start(rc, options)
        await attack(read, crypto, rc, count)

    errors, _, _ = tcp_run(certs, server, options=replace(PAPER_ZSCORE, replay=replay),
                           allowing={1, 2, 3})
    assert not read, f"the server read the key shares of parties {sorted(read)}"
    assert sorted(errors) == [1, 2, 3], errors
    for error in errors.values():
        assert "bootstrap request refused" in str(error), error

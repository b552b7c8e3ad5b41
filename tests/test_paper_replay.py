"""The paper's z-score, MinMax and Yeo-Johnson against a server that deviates, through
the real party roles:
each party recomputes, from every party's signed uploads (relayed to it) and every
bootstrap's signed shares (forwarded to it), the ciphertext of each decryption and
bootstrap request, and refuses one that is not its own run's next (docs/LEAKAGE.md).
Each attack runs over memory channels and over TCP + TLS (the ``links`` fixture); the
wire shows that the server got no share of the refused request."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import openfhe
import pytest
from deviating import deviating, deviating_crypto, zscore_server_with
from key_share_attack import KeyShareRead, attack

from fednorm.engine import ckks
from fednorm.engine.ckks import BootstrapShare
from fednorm.engine.errors import ProtocolError
from fednorm.engine.tracing import FrameEvent, Tracer
from fednorm.protocols import FitOptions
from fednorm.protocols.base import agreed_width
from fednorm.protocols.collective import BootRequest, ServerCrypto, setup_server
from fednorm.protocols.collective.rounds import relay, request_shares
from fednorm.protocols.collective.sums import InputUpload
from fednorm.protocols.normalizers import MinMaxNormalizer
from fednorm.protocols.ppf import minmax as ppf_minmax
from fednorm.protocols.ppf import yeojohnson as ppf_yeojohnson
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.protocols.ppf.driver import run_core
from fednorm.protocols.ppf.minmax_layout import setup_arguments
from fednorm.sim.federation import run_federation
from fednorm.transport.memory import StarLinks, memory_star

PAPER = FitOptions(algorithm="paper", preset="test")


@dataclass
class SharesSent(Tracer):
    """The kinds of the frames every party sent."""

    kinds: list[str] = field(default_factory=list)

    def frame(self, event: FrameEvent) -> None:
        if event.direction == "sent":
            self.kinds.append(event.kind)

    def from_first(self, kind: str) -> list[str]:
        """The kinds sent from the first ``kind`` on."""
        return self.kinds[self.kinds.index(kind):]


async def _refused(crypto_class: type[ServerCrypto], match: str, links: StarLinks
                   ) -> SharesSent:
    async def server(rc, options):
        return await zscore_server_with(rc, options, crypto_class)

    rng = np.random.default_rng(5)
    parts = [rng.normal(3, 2, size=(5, 2)) for _ in range(3)]
    sent = SharesSent()
    with pytest.raises(ProtocolError, match=match):
        await run_federation(deviating("zscore", server=server), parts, PAPER, timeout=120,
                             party_tracer=sent, links=links)
    return sent


class OwnUploadDecrypted(ServerCrypto):
    """The first decryption of a computed ciphertext (z-score: the mean's coarse pass,
    after the inverse's bootstraps) asked for party 1's own Σx upload instead: the
    server would read that party's sums."""

    own: openfhe.Ciphertext | None = None
    swapped: bool = False

    async def add_all(self, cts):
        if self.own is None:
            self.own = cts[1].ciphertext
        return await super().add_all(cts)

    async def decrypt(self, ct: openfhe.Ciphertext, n: int,
                      noise: ckks.DecryptionNoise | None) -> np.ndarray:
        if not self.swapped:
            self.swapped, ct = True, self.own
        return await super().decrypt(ct, n, noise)


async def test_a_decryption_of_a_partys_own_upload_is_refused(links: StarLinks) -> None:
    sent = await _refused(OwnUploadDecrypted, "decryption request refused: its ciphertext "
                          "is not the one this party computes", links)
    assert "ckks.boot_share" in sent.kinds  # the inverse's bootstraps were answered
    # only the presence product's decryption shares, before the inverse's bootstraps
    assert "ckks.decrypt_share" not in sent.from_first("ckks.boot_share")


async def _presence_unflooded(crypto: ServerCrypto, options: FitOptions) -> None:
    """The z-score's presence bits as they were first decrypted: n_g ⊙ ⟨max_count/n_g⟩ /
    max_count, after the inverse's bootstraps, by a plain (not flooded) decryption,
    whose value carries the inverse's deterministic error at n_g (hidden in this mode)."""
    rc = crypto.rc
    sums = await rc.gather(ppf_zscore.EncryptedSums)
    width = agreed_width(sums)
    await crypto.add_all({p: m.total for p, m in sums.items()})
    count = await crypto.add_all({p: m.count for p, m in sums.items()})
    inverse = await run_core(crypto, ppf_zscore._inverse(crypto.ckks, count, width, options),
                             "inverse", replayed=True)
    product = crypto.ckks.mul(crypto.ckks.mul(count, inverse), 1.0 / options.max_count)
    await crypto.decrypt(product, width, None)


async def test_the_presence_bits_are_never_decrypted_unflooded(links: StarLinks) -> None:
    """The presence bits come from a flooded product of the parties' "empty here" bits;
    a server asking for them the earlier way (a plain decryption of a value that carries
    n_g's inverse error) is refused, and no party sent a share of it."""
    sent = await _paper_refused("zscore", PAPER, _presence_unflooded,
                                ppf_zscore.setup_arguments, ServerCrypto,
                                "decryption request refused: its ciphertext is not the "
                                "one this party computes", links)
    assert "ckks.boot_share" in sent.kinds  # the inverse's bootstraps were answered
    assert "ckks.decrypt_share" not in sent.kinds


class SwappedShare(ServerCrypto):
    """The first bootstrap run honestly, but party 2's share forwarded as party 1's: a
    party aggregating what it is sent would go on from a refreshed ciphertext of the
    server's making."""

    async def bootstrap(self, ct: openfhe.Ciphertext, forward: bool = False
                        ) -> openfhe.Ciphertext:
        index = self.held.boot_index
        self.held.boot_index += 1
        rnd = ckks.Bootstrap(self.ckks).prepare(self.joint, ct, index)
        replies = await request_shares(self.rc, "bootstrap",
                                       BootRequest(c1=rnd.c1, index=index), BootstrapShare)
        with self.rc.subprotocol("bootstrap"):
            for reply in [replies[1], *replies[1:]]:
                await self.rc.broadcast(reply)
        return await self.rc.receive(1, BootstrapShare)  # the parties refuse first


async def test_a_share_forwarded_in_another_partys_name_is_refused(links: StarLinks
                                                                   ) -> None:
    sent = await _refused(SwappedShare, "not made by party 1", links)
    assert sent.kinds.count("ckks.boot_share") == 3  # the one bootstrap, then nothing
    assert "ckks.decrypt_share" not in sent.from_first("ckks.boot_share")


class ForgedRelay(ServerCrypto):
    """The count's relay with party 2's upload in party 1's place, so that the parties'
    pooled count (and every request made from it) would be the server's choice."""

    async def add_all(self, cts):
        uploads = list(cts.values())
        if not isinstance(uploads[0], InputUpload) or uploads[0].index == 0:
            return await super().add_all(cts)
        await relay(self.rc, 1, [uploads[1], *uploads[1:]])
        return await self.rc.run_sync(InputUpload.combined, self.ckks,
                                      [u.ciphertext for u in uploads])


async def test_an_upload_relayed_in_another_partys_name_is_refused(links: StarLinks
                                                                   ) -> None:
    sent = await _refused(ForgedRelay, "the relay of input uploads relays",
                          links)
    assert "ckks.boot_share" not in sent.kinds
    assert "ckks.decrypt_share" not in sent.kinds


# -- the paper's MinMax: every party replays each pass's comparisons --------------------
MINMAX = FitOptions(algorithm="paper", preset="test", vabs=(20.0,), minmax_bits=4,
                    minmax_passes=1)


async def _paper_refused(method: str, options: FitOptions, serve, setup_arguments,
                         crypto_class: type[ServerCrypto], match: str, links: StarLinks
                         ) -> SharesSent:
    """The paper's ``method`` after the key setup (``serve``), its collective calls made
    by ``crypto_class``, refused with ``match``; what the parties sent."""
    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **setup_arguments(options))
        return await serve(deviating_crypto(crypto, crypto_class), options)

    rng = np.random.default_rng(6)
    sent = SharesSent()
    with pytest.raises(ProtocolError, match=match):
        await run_federation(deviating(method, server=server),
                             [rng.normal(1, 2, size=(6, 2)) for _ in range(3)], options,
                             timeout=300, party_tracer=sent, links=links)
    return sent


async def _minmax_serve(crypto: ServerCrypto, options: FitOptions) -> MinMaxNormalizer:
    return MinMaxNormalizer(*await ppf_minmax.minmax_server(crypto, None, options))


async def _minmax_refused(crypto_class: type[ServerCrypto], match: str, links: StarLinks
                          ) -> SharesSent:
    return await _paper_refused("minmax", MINMAX, _minmax_serve, setup_arguments,
                                crypto_class, match, links)


class LocalMaxDecrypted(OwnUploadDecrypted):
    """The pass's decryption asked for party 1's own upload: its local max and −min."""


async def test_minmax_refuses_to_decrypt_a_partys_own_upload(links: StarLinks) -> None:
    sent = await _minmax_refused(LocalMaxDecrypted, "decryption request refused: its "
                                 "ciphertext is not the one this party computes", links)
    assert "ckks.boot_share" in sent.kinds  # the comparisons' bootstraps were answered
    assert "ckks.decrypt_share" not in sent.kinds


class KeyShareBootstrap(ServerCrypto):
    """The first comparison's bootstrap request replaced by ``c1 = a + K``."""

    read: dict[int, np.ndarray]

    async def bootstrap(self, ct: openfhe.Ciphertext, forward: bool = False
                        ) -> openfhe.Ciphertext:
        self.read = {}
        try:
            await attack(self.read, self, self.rc, ct)
        finally:
            if self.read:
                raise KeyShareRead(f"the server read parties {sorted(self.read)}' shares")


async def test_minmax_refuses_the_bootstrap_attack(links: StarLinks) -> None:
    sent = await _minmax_refused(KeyShareBootstrap, "bootstrap request refused: its "
                                 "ciphertext is not the one this party computes", links)
    assert "ckks.boot_share" not in sent.kinds


# -- the paper's Yeo-Johnson: every party replays the flags, the inverse, each round --------
YEOJOHNSON = FitOptions(algorithm="paper", preset="test", vabs=(20.0,))


async def _yeojohnson_refused(crypto_class: type[ServerCrypto], match: str,
                              links: StarLinks) -> SharesSent:
    return await _paper_refused("yeojohnson", YEOJOHNSON, ppf_yeojohnson.yeojohnson_server,
                                ppf_yeojohnson.setup_arguments, crypto_class, match, links)


class OwnFlagsDecrypted(OwnUploadDecrypted):
    """The sign flags' decryption asked for party 1's own "absent" flags: which features
    it holds no value, no negative, no positive value of."""


async def test_yeojohnson_refuses_to_decrypt_a_partys_own_flags(links: StarLinks) -> None:
    sent = await _yeojohnson_refused(OwnFlagsDecrypted, "decryption request refused: its "
                                     "ciphertext is not the one this party computes", links)
    assert "ckks.decrypt_share" not in sent.kinds


async def test_yeojohnson_refuses_the_bootstrap_attack(links: StarLinks) -> None:
    """``c1 = a + K`` on the first of its bootstraps (the encrypted inverse's)."""
    sent = await _yeojohnson_refused(KeyShareBootstrap, "bootstrap request refused: its "
                                     "ciphertext is not the one this party computes", links)
    assert "ckks.boot_share" not in sent.kinds


# -- FitOptions.replay: a simulation may take the server's steps on trust -----------------
async def test_without_replay_the_parties_answer_on_trust() -> None:
    """``replay=False`` (every role in one process) skips the parties' recomputation: the
    crafted MinMax bootstrap is answered, so the option does switch the check off, which
    is why a party that takes its options from a server never lets it (test below and
    tests/test_bootstrap_attack.py)."""
    from dataclasses import replace

    with pytest.raises(KeyShareRead):
        await _paper_refused("minmax", replace(MINMAX, replay=False), _minmax_serve,
                             setup_arguments, KeyShareBootstrap, "never", memory_star)


@pytest.mark.parametrize("method", ["zscore", "minmax", "yeojohnson"])
def test_on_trust_or_replayed_the_paper_algorithms_fit_the_pooled_data(method: str) -> None:
    """The same fit either way: the pooled statistics (Yeo-Johnson: of the data as
    transformed with the λ's found, which the two runs agree on)."""
    from dataclasses import replace

    from fednorm.protocols import fit_local
    from fednorm.protocols.normalizers import yeo_johnson
    from fednorm.sim.federation import simulate

    options = {"zscore": PAPER, "minmax": replace(MINMAX, minmax_bits=None, minmax_passes=None),
               "yeojohnson": YEOJOHNSON}[method]  # MinMax at its own precision
    rng = np.random.default_rng(8)
    parts = [rng.normal(1, 2, size=(6, 2)) for _ in range(3)]
    pooled = np.vstack(parts)
    runs = [simulate(parts, method, "mhe", replace(options, replay=replay),
                     timeout=600).normalizer for replay in (True, False)]
    for fitted in runs:
        if method == "yeojohnson":
            np.testing.assert_allclose(fitted.lambdas, runs[0].lambdas, rtol=1e-4)
            pooled = yeo_johnson(np.vstack(parts), runs[0].lambdas)
            expected = {"mean": pooled.mean(axis=0), "var": pooled.var(axis=0)}
        else:
            expected = fit_local(method, pooled, options).params()
        for name, value in expected.items():
            np.testing.assert_allclose(fitted.params()[name], value, rtol=1e-3, atol=1e-3,
                                       err_msg=f"{method}: {name}")


def test_across_processes_each_party_replays_with_keys_of_its_own(
    spawn, certs, csvs, tmp_path
) -> None:
    """``fednorm serve`` and three ``fednorm party`` processes, the paper's MinMax: no
    role shares memory with another, so each party recomputes the server's comparisons
    (products, rotations, bootstraps) with the evaluation keys it installed itself from
    the checked joint keys; the run fits the pooled min and max."""
    import json

    from federation_processes import finish, party_arrays, start_party, start_server

    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "minmax", outs[0], "--privacy", "mhe",
                                "--preset", "test", "--algorithm", "paper", "--vabs", "100")
    parties = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p], timeout=300)
               for p in (1, 2, 3)]
    for proc in [server, *parties]:
        code, err = finish(proc, timeout=300)
        assert code == 0, err
    pooled = np.vstack(party_arrays())
    for out in outs:
        params = json.loads((out / "params.json").read_text())["params"]
        np.testing.assert_allclose(params["min"], np.nanmin(pooled, axis=0), atol=0.1)
        np.testing.assert_allclose(params["max"], np.nanmax(pooled, axis=0), atol=0.1)

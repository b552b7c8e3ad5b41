"""One party in the caller's own process against a multi-host server, with the
certificates however the caller keeps them: a certs directory, the files under any names
(:class:`fednorm.PartyFiles`), or an ``ssl.SSLContext`` of the caller's own."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import numpy as np
import pytest
import trio

import fednorm
from fednorm import FitOptions, Party, PartyConfig, PartyFiles, Server, ServerConfig, Timeouts

FEATURES = ["a", "b"]
SLOW = Timeouts(join=30.0, handshake=10.0, protocol=60.0)


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.normal(3, 2, size=(5 + p, 2)) for p in range(3)]


def renamed(certs: Path, party: int, where: Path) -> PartyFiles:
    """Party ``party``'s files copied to names a certs directory would not use."""
    where.mkdir(parents=True, exist_ok=True)
    files = PartyFiles(str(where / "federation-root.crt"), where / f"hospital-{party}.crt",
                       where / f"hospital-{party}.pem")  # str paths too
    for source, target in ((certs / "ca.pem", files.ca), (certs / f"party-{party}.pem",
                           files.cert), (certs / f"party-{party}.key", files.key)):
        shutil.copy(source, target)
    return files


def own_context(files: PartyFiles) -> ssl.SSLContext:
    """What a caller's own PKI code might build: mutual TLS from the same files."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    return context


def run(certs: Path, privacy: str, configs: dict[int, PartyConfig]
        ) -> tuple[object, dict[int, object]]:
    """A ``zscore`` session of ``privacy`` with the given party configs (their port is
    filled in): the server's outcome, and each party's run or error."""
    server = Server(ServerConfig("127.0.0.1", 0, parties=3, methods=("zscore",),
                                 certs=certs, privacy=privacy,
                                 options=FitOptions(preset="test"), timeouts=SLOW))
    results: dict[int, object] = {}

    async def party(p: int, port: int) -> None:
        from dataclasses import replace

        try:
            results[p] = await Party(replace(configs[p], port=port)).run(arrays()[p - 1],
                                                                        FEATURES)
        except fednorm.FednormError as exc:
            results[p] = exc

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(server.serve)
            for p in configs:
                nursery.start_soon(party, p, port)

    trio.run(main)
    return server.outcomes[0], results


@pytest.mark.parametrize("privacy", ["plain", "mhe"])
def test_a_party_s_certificates_under_any_names_or_in_its_own_tls_context(
    certs: Path, tmp_path: Path, privacy: str,
) -> None:
    """Party 1 from the certs directory, party 2 from renamed files, party 3 from renamed
    files and a TLS context it built itself: one session, the pooled statistics."""
    two, three = renamed(certs, 2, tmp_path / "two"), renamed(certs, 3, tmp_path / "three")
    configs = {1: PartyConfig("127.0.0.1", 0, 1, certs, SLOW),
               2: PartyConfig("127.0.0.1", 0, 2, two, SLOW),
               3: PartyConfig("127.0.0.1", 0, 3, three, SLOW, tls=own_context(three))}
    outcome, results = run(certs, privacy, configs)
    assert outcome.error is None, (outcome.error, results)
    pooled = np.vstack(arrays())
    for p in (1, 2, 3):
        mean = results[p].normalizers[0].mean
        np.testing.assert_allclose(mean, pooled.mean(axis=0), rtol=1e-9)


def test_a_tls_context_alone_serves_a_plain_session_and_a_ppf_one_asks_for_the_files(
    certs: Path, tmp_path: Path,
) -> None:
    """Key shares are signed with the certificate's key, which a TLS context does not
    give back: a PPF session stops at the key setup, naming what is missing."""
    contexts = {p: own_context(renamed(certs, p, tmp_path / str(p))) for p in (1, 2, 3)}
    configs = {p: PartyConfig("127.0.0.1", 0, p, None, SLOW, tls=contexts[p])
               for p in (1, 2, 3)}
    outcome, _ = run(certs, "plain", configs)
    assert outcome.error is None, outcome.error
    outcome, _ = run(certs, "mhe", configs)
    assert "has no signing key" in str(outcome.error), outcome.error


def test_a_party_with_neither_certificates_nor_a_context_is_refused_at_once() -> None:
    with pytest.raises(fednorm.InputError, match="needs its certificates"):
        Party(PartyConfig("127.0.0.1", 9, 1, None))
    with pytest.raises(fednorm.InputError, match="no CA certificate"):
        Party(PartyConfig("127.0.0.1", 9, 1, PartyFiles(Path("/nonexistent/ca.pem"),
                                                        Path("c"), Path("k"))))

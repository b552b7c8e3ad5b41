"""The declared ledger (fednorm.protocols.ledger) against what really crosses the wire,
for every protocol, and deviating servers refused by every party."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import trio
from deviating import deviating, zscore_server_start, zscore_server_with
from protocol_cases import CASES, CHEAP_MINMAX, PAPER, YJ_VABS, Case, normal_parts, yeojohnson_plan
from recording import KEY_SETUP_KINDS, Recorder, SecretKeySpy, plaintext_fields, session_kinds

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.runtime import SERVER
from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer
from fednorm.protocols import FitOptions, get_protocol
from fednorm.protocols.collective import ServerCrypto, serve_until, shared_context
from fednorm.protocols.ledger import PLAINTEXT, undeclared
from fednorm.protocols.ppf import minmax as ppf_minmax
from fednorm.protocols.ppf import zscore as ppf
from fednorm.protocols.ppf.minmax_layout import MinMaxSettings
from fednorm.protocols.ppf.yeojohnson_cores import planned_refreshes
from fednorm.protocols.ppf.yeojohnson_search import sign_plan
from fednorm.sim.federation import run_federation, simulate_session

DECRYPT_KINDS = ("ckks.decrypt_request", "ckks.decrypt_sum_request",
                 "ckks.decrypt_product_request", "ckks.decrypt_coefficients_request")
FLOODED_KINDS = ("ckks.decrypt_sum_request", "ckks.decrypt_product_request",
                 "ckks.decrypt_coefficients_request")
"""Decryptions whose every share is flooded."""


class DecryptionWidths(Tracer):
    """How many values each of the server's collective decryptions revealed, in order:
    its worker calls of ``Decryption.finalize`` (which ``SumDecryption`` inherits),
    ``FloodedDecryption.finalize`` and ``CoefficientSumDecryption.finalize``, and what they
    returned."""

    FINALIZE = frozenset({ckks.Decryption.finalize.__qualname__,
                          ckks.FloodedDecryption.finalize.__qualname__,
                          ckks.CoefficientSumDecryption.finalize.__qualname__})

    def __init__(self) -> None:
        self.widths: list[int] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if event.call in self.FINALIZE:
            self.widths.append(len(event.result))


class PartyPhases(Tracer):
    """Party 1's phases as the wire shows them: the collective requests it received up to
    each message of the server that ends a phase, as (that message's kind, bootstraps)."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int]] = []
        self._bootstraps = 0

    def frame(self, event: FrameEvent) -> None:
        if event.role != "party 1" or event.direction != "received":
            return
        if event.kind == "ckks.boot_request":
            self._bootstraps += 1
        elif event.kind not in (*DECRYPT_KINDS, "ckks.boot_share"):  # forwarded shares
            self.phases.append((event.kind, self._bootstraps))
            self._bootstraps = 0

    def bootstrapping(self) -> list[tuple[str, int]]:
        """The phases that bootstrapped."""
        return [(kind, n) for kind, n in self.phases if n]


def _declared_bootstraps(case: Case) -> list[tuple[str, int]]:
    """The bootstraps each phase of ``case`` declares (those with any), in order, as each
    party derives them from the public plan: (the server message ending the phase, the
    phase's bootstraps)."""
    options, parties, width = case.options, len(case.parts), case.parts[0].shape[1]
    context = shared_context(options.preset)
    if case.algorithm == "default":
        return []  # flooded sums and masked sums only
    if case.method == "zscore":
        return [] if options.reveal_counts else [
            ("ppf_zscore.scales", ppf.inverse_plan(context, options).bootstraps)]
    if case.method in ("minmax", "robust"):
        settings = MinMaxSettings.from_options(options)
        boots = ppf_minmax.pass_allowance(context, width, parties, settings).bootstraps
        return [("ppf_minmax.window", boots)] * (settings.passes - 1) + [
            ("ppf_minmax.result", boots)]
    plan = yeojohnson_plan(np.vstack(case.parts), YJ_VABS)
    planned = planned_refreshes(context, parties, plan.layout, sign_plan(options),
                                options.max_count)
    probes = [planned.pooling] + [planned.round] * (plan.rounds - 1)
    return [(kind, n) for kind, n in [("ppf_yeojohnson.flags", planned.flags)]
            + [("ppf_yeojohnson.probes", n) for n in probes]
            + [("ppf_yeojohnson.lambdas", planned.round)] if n]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_only_the_declared_ledger_crosses_the_wire(case: Case) -> None:
    """Every protocol, plain and PPF: only declared plaintext fields cross, every declared
    kind is used (the ledger is not stale), the decryptions reveal what the ledger says,
    each phase bootstraps exactly as often as it declares, and no frame carries
    secret-key bytes."""
    spy = SecretKeySpy()
    recorder, phases, decryptions = Recorder(), PartyPhases(), DecryptionWidths()
    trio.run(partial(run_federation, get_protocol(case.method, case.privacy),
                     list(case.parts), case.options, timeout=900,
                     tracer=[recorder, decryptions], party_tracer=[phases, spy]))
    secrets = spy.secrets
    widths = decryptions.widths
    if case.privacy == "mhe":
        assert phases.bootstrapping() == _declared_bootstraps(case)
    kinds, requests = set(), 0
    for header, msg in recorder.decoded():
        kinds.add(header.kind)
        extra = undeclared(case.method, case.privacy, header.kind, plaintext_fields(msg),
                           case.algorithm)
        assert not extra, (header.kind, extra)
        requests += header.kind in DECRYPT_KINDS and header.sender == SERVER
        if case.privacy == "mhe" and case.algorithm == "default":
            assert header.kind not in DECRYPT_KINDS or header.kind in FLOODED_KINDS, \
                f"an unflooded decryption ({header.kind}) in a default protocol"
    # Bootstraps, decryptions of each kind, relayed inputs and the relinearization key's
    # second round depend on the protocol and its options.
    stale = set(PLAINTEXT[case.method, case.privacy, case.algorithm]) - kinds - {
        "ckks.boot_request", "ckks.boot_share", "ckks.decrypt_request",
        "ckks.decrypt_sum_request",
        "ckks.decrypt_product_request", "ckks.decrypt_coefficients_request",
        "ckks.relayed_inputs", "ckks.relin_round2"}
    assert not stale, f"declared but never sent (the ledger is out of date): {stale}"
    parties = len(case.parts)
    assert requests == parties * len(widths)  # every decryption asks every party once
    if case.widths is not None:
        assert widths == case.widths(np.vstack(case.parts))
    if case.decryptions is not None:
        assert len(widths) == case.decryptions
    assert len(secrets) == (parties if case.privacy == "mhe" else 0)
    assert not any(secret in frame for secret in secrets for frame in recorder.frames)


# -- a deviating server ---------------------------------------------------------------------
async def _run_server(server_role, parts=None):
    cheat = deviating("zscore", server=server_role)
    parts = parts or [np.ones((4, 2)) * i for i in range(1, 4)]
    await run_federation(cheat, parts, PAPER, timeout=60)


class ReusedElement(ServerCrypto):
    """The inverse's bootstraps, honest, but the second on common element #0 again."""

    async def bootstrap(self, ct, forward: bool = False):
        if self.bootstraps == 1:
            self.held.boot_index -= 1
        return await super().bootstrap(ct, forward)


class ChosenElement(ServerCrypto):
    """The inverse's first bootstrap, honest, but on a far-off common element."""

    async def bootstrap(self, ct, forward: bool = False):
        self.held.boot_index = max(self.held.boot_index, 12345)
        return await super().bootstrap(ct, forward)


async def test_parties_refuse_a_bootstrap_on_a_reused_common_element() -> None:
    """A server that asks twice for the same common random element (so that it could
    cancel the masks of two answers) is refused: the index must advance."""
    async def server(rc, options):
        return await zscore_server_with(rc, options, ReusedElement)

    with pytest.raises(ProtocolError, match="common element #0, expected #1"):
        await _run_server(server)


async def test_parties_refuse_a_bootstrap_with_a_chosen_element() -> None:
    """The request carries no element; one that names a far-off index (to reach an
    element the server searched for) is refused like any skip."""
    async def server(rc, options):
        return await zscore_server_with(rc, options, ChosenElement)

    with pytest.raises(ProtocolError, match="#12345, expected #0"):
        await _run_server(server)


async def test_parties_refuse_more_bootstraps_than_the_phase_declares() -> None:
    async def server(rc, options):
        crypto, count = await zscore_server_start(rc, options)
        await crypto.bootstrap(count)

    async def party(rc, X, options):
        crypto = await ppf.setup_party(rc, options.preset)
        await rc.send(0, ppf.EncryptedSums(total=await crypto.encrypt(np.ones(2)),
                                           count=await crypto.encrypt(np.ones(2)), width=2))
        await serve_until(crypto, ppf.PpfZScoreResult, decryptions=9, bootstraps=0)

    cheat = deviating("zscore", server=server, party=party)
    with pytest.raises(ProtocolError, match="more bootstraps"):
        await run_federation(cheat, [np.ones((4, 2))] * 3, PAPER, timeout=60)


def test_the_leakage_document_carries_the_declared_ledger() -> None:
    from pathlib import Path

    from fednorm.protocols.ledger import markdown

    text = (Path(__file__).parent.parent / "docs" / "LEAKAGE.md").read_text()
    assert markdown() in text, "docs/LEAKAGE.md is out of date: paste ledger.markdown()"


async def test_parties_refuse_search_rounds_beyond_the_agreed_precision() -> None:
    """A PPF robust server that keeps probing past ε (to learn the pooled distribution
    ever more finely) is refused once the rounds exceed what ε and the bounds need."""
    from dataclasses import replace

    from fednorm.protocols.collective import setup_server
    from fednorm.protocols.plain.robust import QUARTILES
    from fednorm.protocols.ppf import kth
    from fednorm.protocols.ppf import minmax as ppf_minmax
    from fednorm.protocols.quantiles import plan_quantiles
    from fednorm.protocols.rank import start_search

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **ppf_minmax.setup_arguments(options))
        count = await kth.reveal_pooled_counts(crypto)
        low, high = await ppf_minmax.minmax_server(crypto, len(count), options)
        plan = plan_quantiles(count, QUARTILES, options.quantile_rule)
        finer = replace(options, epsilon=options.epsilon * 1e-6)
        await kth.kth_server(crypto, start_search(plan, count, low, high, finer), count)

    cheat = deviating("robust", server=server)
    rng = np.random.default_rng(4)
    options = FitOptions(preset="test", algorithm="paper", vabs=(16.0,), epsilon=1e-1,
                         minmax_bits=4, minmax_passes=2)
    with pytest.raises(ProtocolError, match="more search rounds"):
        await run_federation(cheat, [rng.normal(size=(6, 1)) for _ in range(3)], options,
                             timeout=120)


def test_a_session_key_setup_sends_only_the_collective_ledger() -> None:
    """A session's own key-setup step (``keys-mhe``) carries only what every PPF
    protocol's key setup declares, and each protocol after it stays within its own
    entry; no frame carries secret-key bytes."""
    spy, recorder = SecretKeySpy(), Recorder()
    options = FitOptions(preset="test", algorithm="paper", vabs=(16.0,), **CHEAP_MINMAX)
    session = simulate_session(list(normal_parts()), ["zscore", "minmax"], "mhe", options,
                               tracer=recorder, party_tracer=spy)
    secrets = spy.secrets
    assert session.setup is not None
    kinds = session_kinds(recorder, "paper")
    assert list(kinds) == ["keys-mhe", "zscore-mhe", "minmax-mhe"]
    assert {"ckks.lead_keys", "ckks.joint_round1", "ckks.relin_round2"} <= kinds["keys-mhe"]
    assert not (kinds["zscore-mhe"] | kinds["minmax-mhe"]) & KEY_SETUP_KINDS  # keys reused
    assert len(secrets) == 3
    assert not any(secret in frame for secret in secrets for frame in recorder.frames)

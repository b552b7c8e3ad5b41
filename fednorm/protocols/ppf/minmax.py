"""PPF MinMax (paper Algorithm 5): the pooled per-feature min and max under multiparty CKKS.

Step by step with Algorithm 5:

1. collective key generation, with relinearization and one rotation key
   (line 1; :func:`setup_arguments`);
2. each party computes its local min and max per feature (lines 2–7) and checks them
   against the agreed bound V_abs (line 13, ``FitOptions.vabs``) *before* encrypting
   anything: a value beyond it is an :class:`InputError`;
3. each party scales into [−1, 1] by V_abs and encrypts (lines 8–10, 15: the scaling
   happens before encryption — V_abs is public — which saves the server a level);
4. the server compares (lines 16–22) — a tree instead of the paper's chain (below);
   collective bootstrapping refreshes the comparison whenever its levels run out;
5. the server restores the scale (line 23: in plaintext after decryption, exact) and the
   parties decrypt collectively (lines 25–26); the result is broadcast and every party
   scales locally (line 27).

**Packing.** A party sends max and −min of every feature in one vector (so one max
computes both: min = −max(−min)), in block ``p mod 16`` of the slots; the server adds
the parties' ciphertexts into one that holds every party side by side. Empty blocks and
features a party has no values of hold the neutral −1.

**Tree.** ⌈log2 P⌉ rounds instead of the paper's P − 1 comparisons: round k compares the
packed ciphertext with itself rotated by 2^k blocks (:func:`~fednorm.engine.ckks.fold_maximum`),
so every pair of a round is compared at once, in SIMD. More than 16 parties fill
several packed ciphertexts, compared pairwise first. Before decryption a mask keeps
only block 0: the other blocks hold maxima over subsets of the parties, which must not
be revealed.

**Passes (precision).** One comparison errs by at most ``plan.error_bound`` of the
interval's half-width (:mod:`~fednorm.engine.ckks.compare`), so after R rounds the
decrypted max is within e = R·error_bound·V_abs *below* the true one. The next pass
zooms in: the server sends the interval [estimate − e/4, estimate + e] per slot, the
parties re-encrypt mapped onto it (values below it clipped to its bottom — they cannot
be the maximum), and the error shrinks by about the same factor again
(:func:`~.minmax_layout.error_bound`). This is what makes values that are tiny relative
to V_abs (the paper's "small-valued" case) come out precisely. Each pass reveals a
coarser copy of the result and nothing else: a value above the interval would mean the
global max lies above it, and the party refuses the pass.

Values are encrypted at magnitude :data:`~.minmax_layout.HEADROOM` instead of 1: CKKS
noise is absolute, so this buys 2^7 in precision (decryption error 1.5e-11 instead of
1.7e-9 of V_abs).
"""

from __future__ import annotations

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.ckks.compare import fold_maximum_core, tree_maximum_core
from fednorm.engine.ckks.cores import Core, decrypted
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    agreed_width,
)
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.collective.sums import InputUpload
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import MinMaxNormalizer
from fednorm.protocols.ppf import noise
from fednorm.protocols.ppf.checks import vabs_vector
from fednorm.protocols.ppf.driver import planned_requests, run_core
from fednorm.protocols.ppf.minmax_layout import (
    HEADROOM,
    Layout,
    MinMaxSettings,
    Window,
    block_position,
    comparison_rounds,
    extremes,
    flooded_sigma,
    fold_steps,
    local_top,
    party_groups,
    setup_arguments,
)
from fednorm.protocols.ppf.phases import serve_replayed


# -- messages -----------------------------------------------------------------------------
@message("ppf_minmax.encrypted_extremes")
class EncryptedExtremes(Message):
    """A party's max and −min per feature, mapped onto the pass's interval, encrypted in
    its slot block: one ciphertext per chunk of features."""

    chunks: list[InputUpload]
    width: int


@message("ppf_minmax.window")
class MinMaxWindow(Message):
    """The next pass's interval per slot (max of each feature, then −min of each)."""

    low: np.ndarray
    high: np.ndarray


@message("ppf_minmax.result")
class MinMaxExtremes(Message):
    min: np.ndarray
    max: np.ndarray


# -- the ledger ------------------------------------------------------------------------------
PLAINTEXT = {
    "ppf_minmax.encrypted_extremes": ("width",),
    "ppf_minmax.window": ("low", "high"),
    "ppf_minmax.result": ("min", "max"),
}
"""What PPF MinMax sends in the clear: widths, each pass's window (a function of the
global max, revealed anyway), and the result."""

PASS = Allowance(decryptions=1)
"""Each pass, per ciphertext chunk of features: the masked maximum of block 0, and the
comparisons' bootstraps (:func:`pass_allowance`)."""

PAPER_LEDGER = declare("minmax", "mhe", {**COLLECTIVE, **PLAINTEXT}, algorithm="paper")


# -- setup and input -------------------------------------------------------------------------
def check_minmax_input(X: np.ndarray, options: FitOptions) -> np.ndarray:
    """Reject, before any encryption, a V_abs (or its absence) or precision settings the
    search cannot run on.  The values against V_abs were checked at the session's edge
    (:func:`fednorm.session.check_within_vabs`), with the features named."""
    vabs_vector(options, X.shape[1])
    MinMaxSettings.from_options(options)
    return X


# -- server ---------------------------------------------------------------------------------
async def minmax_server(crypto: ServerCrypto, width: int | None, options: FitOptions
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The server's side of PPF MinMax after collective setup (by the caller, with
    :func:`setup_arguments`): returns and broadcasts (min, max) per feature.

    ``width`` None: the first party's number of features, which every party must match.
    """
    rc = crypto.rc
    settings = MinMaxSettings.from_options(options)
    _check_party_ids(rc.parties)
    with rc.subprotocol("minmax"):
        window = None
        for pass_ in range(settings.passes):
            replies = await rc.gather(EncryptedExtremes)
            width = agreed_width(replies, width)
            layout = Layout(crypto.ckks.slots, width)
            if window is None:
                window = Window.initial(vabs_vector(options, width))
            estimate = window.decode(await _global_top(crypto, layout, replies, settings))
            if pass_ + 1 < settings.passes:
                window = window.narrowed(estimate, comparison_rounds(len(rc.parties)),
                                         settings.plan.error_bound,
                                         flooded_sigma(crypto.ckks.preset, len(rc.parties),
                                                       options))
                await rc.broadcast(MinMaxWindow(low=window.low, high=window.high))
        low, high = extremes(estimate, vabs_vector(options, width))
        await rc.broadcast(MinMaxExtremes(min=low, max=high))
    return low, high


def pass_noise(context: ckks.CkksContext) -> ckks.DecryptionNoise:
    """What a pass's decryption declares (its maxima lie on the window's ±HEADROOM)."""
    return noise.declared(noise.MINMAX_PASS, context.preset)


def _check_party_ids(parties: list[int]) -> None:
    if parties != list(range(1, len(parties) + 1)):
        raise ProtocolError(f"PPF MinMax needs parties numbered 1..P, got {parties}")


async def _global_top(crypto: ServerCrypto, layout: Layout,
                      replies: dict[int, EncryptedExtremes], settings: MinMaxSettings
                      ) -> np.ndarray:
    """Decrypted max over the parties of every slot (scaled), chunk by chunk, once every
    chunk's uploads were relayed to the parties (who replay each chunk's core)."""
    packed = [await _packed(crypto, layout, replies, chunk) for chunk in range(layout.chunks)]
    parts = []
    for chunk in range(layout.chunks):
        parts.append(await run_core(crypto, top_of_blocks_core(
            crypto.ckks, layout, packed[chunk], chunk, len(crypto.rc.parties),
            settings.plan), "extremes", replayed=True))
    return layout.put(parts)


async def _packed(crypto: ServerCrypto, layout: Layout, replies: dict[int, EncryptedExtremes],
                  chunk: int) -> list[openfhe.Ciphertext]:
    """One ciphertext per group of :data:`~.minmax_layout.BLOCKS` parties, every party in
    its block, the rest neutral."""
    for party, reply in replies.items():
        if not isinstance(reply.chunks, list) or len(reply.chunks) != layout.chunks:
            raise ProtocolError(f"party {party} sent {_count(reply.chunks)} ciphertexts, "
                                f"expected {layout.chunks}")
    packed = []
    for group in party_groups(sorted(replies)):
        ct = await crypto.add_all({p: replies[p].chunks[chunk] for p in group})
        packed.append(padded(crypto.ckks, layout, ct, len(group)))
    return packed


def padded(context: ckks.CkksContext, layout: Layout, ct: openfhe.Ciphertext,
           members: int) -> openfhe.Ciphertext:
    """A group's packed ciphertext, its empty blocks neutral."""
    return ct if members >= layout.blocks else context.add(ct, layout.padding(members))


def _count(chunks: object) -> object:
    return len(chunks) if isinstance(chunks, list) else type(chunks).__name__


def top_of_blocks_core(context: ckks.CkksContext, layout: Layout,
                       packed: list[openfhe.Ciphertext], chunk: int, parties: int,
                       plan: ckks.ComparePlan) -> Core[np.ndarray]:
    """Block 0 gets the max over all parties — pairwise across groups, then the fold — and
    only block 0's slots of ``chunk`` are decrypted (the other blocks hold maxima over
    subsets of the parties)."""
    top = yield from tree_maximum_core(context, packed, plan, bound=HEADROOM)
    top = yield from fold_maximum_core(context, top, layout.block, fold_steps(parties), plan,
                                       bound=HEADROOM, keys=(layout.block,))
    masked = context.mul(top, layout.mask(chunk))
    return (yield from decrypted(masked, layout.chunk_slots(chunk), pass_noise(context)))


def pass_allowance(context: ckks.CkksContext, width: int, parties: int,
                   settings: MinMaxSettings) -> Allowance:
    """A pass, as a party serves it: per chunk :data:`PASS`, with the bootstraps of the
    server's own core (:func:`top_of_blocks_core`) run on level counts — on fresh
    uploads, one packed ciphertext per group of parties, all of it public."""
    levels = ckks.LevelArithmetic.like(context)
    layout = Layout(context.slots, width)
    packed = [ckks.Levels(0)] * len(party_groups(list(range(1, parties + 1))))
    allowance = Allowance()
    for chunk in range(layout.chunks):
        _, planned = planned_requests(top_of_blocks_core(
            levels, layout, packed, chunk, parties, settings.plan))
        allowance += PASS.with_bootstraps(planned.bootstraps)
    return allowance


# -- party ----------------------------------------------------------------------------------
async def minmax_party(crypto: PartyCrypto, X: np.ndarray, options: FitOptions
                       ) -> tuple[np.ndarray, np.ndarray]:
    """A party's side of PPF MinMax after collective setup: returns (min, max).  ``X`` is
    what :func:`check_minmax_input` returned, which every caller runs before the key
    setup (bad input stops a party before any work)."""
    rc = crypto.rc
    settings = MinMaxSettings.from_options(options)
    width = X.shape[1]
    layout = Layout(crypto.ckks.slots, width)
    top = local_top(X)
    window = Window.initial(vabs_vector(options, width))
    position = block_position(rc.me)
    allowance = pass_allowance(crypto.ckks, width, crypto.n_parties, settings)
    with rc.subprotocol("minmax"):
        for pass_ in range(settings.passes):
            scaled = window.encode(top)
            chunks = [await crypto.encrypt_input(layout.place(position, layout.take(scaled, c)))
                      for c in range(layout.chunks)]
            await rc.send(SERVER, EncryptedExtremes(chunks=chunks, width=width))
            packed = await _pooled(crypto, layout, chunks)
            last = pass_ + 1 == settings.passes
            core = _pass_core(crypto.ckks, layout, packed, crypto.n_parties, settings)
            reply, _ = await serve_replayed(crypto, core if options.replay else None,
                                            MinMaxExtremes if last else MinMaxWindow,
                                            allowance)
            if not last:
                window = window.received(reply.low, reply.high)
    return (as_float_vector(reply.min, width, "global min"),
            as_float_vector(reply.max, width, "global max"))


async def _pooled(crypto: PartyCrypto, layout: Layout, chunks: list[InputUpload]
                  ) -> list[list[openfhe.Ciphertext]]:
    """Per chunk, every group's packed ciphertext, as the server packs it (:func:`_packed`),
    from the relayed uploads this party checks."""
    groups, packed = party_groups(list(range(1, crypto.n_parties + 1))), []
    for chunk in chunks:
        pooled = [await crypto.pooled_input(chunk, group) for group in groups]
        packed.append([padded(crypto.ckks, layout, ct, len(group))
                       for ct, group in zip(pooled, groups, strict=True)])
    return packed


def _pass_core(context: ckks.CkksContext, layout: Layout, packed: list[list[openfhe.Ciphertext]],
               parties: int, settings: MinMaxSettings) -> Core[None]:
    """A party's run of a pass's requests: every chunk's :func:`top_of_blocks_core`."""
    for chunk, groups in enumerate(packed):
        yield from top_of_blocks_core(context, layout, groups, chunk, parties, settings.plan)


# -- the registered protocol ------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> MinMaxNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    low, high = await minmax_server(crypto, None, options)
    return MinMaxNormalizer(low, high)


async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> MinMaxNormalizer:
    X = check_minmax_input(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    low, high = await minmax_party(crypto, X, options)
    return MinMaxNormalizer(low, high)


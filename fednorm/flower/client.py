"""The node side: a ClientApp query handler that relays fednorm frames to the party worker.

The first message of a session loads the node's data (with the application's own
loader), starts the party worker (:mod:`fednorm.flower.worker`) and hands it the data
and the protocol; every message relays the server's frames to the worker and answers
with what the party sent back.  Each message runs in a fresh ClientApp process, so this
module imports no protocol code: relaying needs only the pipe.  When the party is done,
its fitted normalizer is kept in the node's Flower context state, so the application's
``train`` and ``evaluate`` handlers normalize their data with :func:`fitted_normalizer`.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import numpy as np

from fednorm.engine.errors import (
    FednormError,
    InputError,
    InputRefused,
    ProtocolError,
    SessionRefused,
)
from fednorm.flower.content import (
    ACTION,
    Answer,
    ClientApp,
    ConfigRecord,
    Context,
    Message,
    Request,
    answer_content,
    parse_request,
)
from fednorm.flower.localpipe import (
    READY,
    array_to_wire,
    exchange,
    normalizer_from_wire,
    pick_normalizer,
    pipe_path,
    wire_digest,
)

if TYPE_CHECKING:
    from fednorm.protocols import Normalizer

DataLoader = Callable[[Context], np.ndarray]
STATE_KEY = "fednorm-normalizer"
# Node config: a certs directory ('fednorm certs init') holding ca.pem and the certificate
# and key of the party this node plays, which sign its key shares in a PPF key setup.
CERTS_KEY = "fednorm-certs"
# The same directory for a node whose node config names none: on Flower's simulation
# runtime every simulated node's config holds only its partition-id and num-partitions,
# and the nodes run in the simulation's processes, with the SuperLink's environment.
CERTS_ENV = "FEDNORM_FLOWER_CERTS"
# Node config: true to let this node's party join sessions of the paper's PPF algorithms,
# whose decryptions it floods by a measured noise only, or not at all (refused by default).
ALLOW_UNFLOODED_KEY = "fednorm-allow-paper-algorithms"
WORKER_START_SECONDS = 120.0
# The worker answers once the party waits again; allow for the party's own work on top.
_RELAY_MARGIN_SECONDS = 30.0


def register_party(app: ClientApp, load_data: DataLoader) -> None:
    """Make ``app`` a fednorm party: it answers ``query.fednorm`` messages.

    ``load_data(context)`` returns this node's feature matrix (rows by features, NaN for
    missing values), as an array or a pandas DataFrame; it is called once per session,
    on the node, and the data never leaves the node.  A DataFrame's columns are matched
    by name to the names the ServerApp gives :func:`~fednorm.flower.normalize`
    (``features``), in any order; a node whose columns differ refuses the session,
    naming them (an array's columns are taken in the ServerApp's order, and only their
    number is checked).  For PPF (``mhe``) sessions the node config's ``fednorm-certs``
    names the directory with the federation's ``ca.pem`` and the certificate and key of
    the party the node plays (party i+1 is the i-th node the ServerApp names): they sign
    its key shares, and check the other parties'; without it, ``$FEDNORM_FLOWER_CERTS``
    names it (a simulation's nodes have no node config of their own).  The node's party
    refuses a session of the paper's PPF algorithms (``--algorithm paper``) unless the
    node config sets ``fednorm-allow-paper-algorithms`` to true: its requests cannot be
    checked against a deviating server (docs/LEAKAGE.md).
    """

    @app.query(ACTION)
    def fednorm_query(message: Message, context: Context) -> Message:
        return handle_message(message, context, load_data)


def handle_message(message: Message, context: Context, load_data: DataLoader) -> Message:
    """Answer one fednorm message: relay its frames to this node's party worker."""
    request = parse_request(message)
    answer = relay(request, context, load_data)
    return Message(answer_content(answer), reply_to=message)


def relay(request: Request, context: Context, load_data: DataLoader) -> Answer:
    try:
        path = pipe_path(context.node_id, context.run_id, request.session)
        packet = {"session": request.session, "party": request.party,
                  "frames": request.frames, "closing": request.closing}
        if request.start is not None:
            packet["setup"] = _setup(request, _node_data(request, load_data, context),
                                     context)
            start_worker(path, request.timeout)
        reply = _exchange(path, packet, request.timeout + _RELAY_MARGIN_SECONDS)
        return _answer(request, reply, context)
    except InputRefused as exc:  # the detail went to this node's log, not to the server
        return Answer(request.session, "failed", error=exc.cause)
    except SessionRefused as exc:  # "party N refused the session: ...", as a worker says
        return Answer(request.session, "failed", error=str(exc))
    except (FednormError, OSError) as exc:
        return Answer(request.session, "failed", error=f"{type(exc).__name__}: {exc}")


def _exchange(path: Path, packet: dict[str, object], timeout: float) -> dict[str, object]:
    try:
        return exchange(path, packet, timeout)
    except (FileNotFoundError, ConnectionError) as exc:
        # Nobody listens any more: a worker that was killed leaves its socket behind.
        with suppress(FileNotFoundError):
            path.unlink()
        raise PartyGone(f"the party worker is gone ({type(exc).__name__}: {exc})") from None


class PartyGone(FednormError):
    """The node's party worker stopped before its session ended."""


def _node_data(request: Request, load_data: DataLoader, context: Context) -> np.ndarray:
    """This node's data, checked (a DataFrame's columns matched by name, :func:`_by_name`);
    data it cannot use is refused as ``fednorm party`` refuses it: the server hears the
    kind and the remedy, this node's log the detail."""
    # Imported here, once a session: each ClientApp run is a new process, and most only
    # relay frames, so they load no protocol code.
    from fednorm.protocols.base import UNUSABLE_DATA, check_party_data
    from fednorm.protocols.columns import is_table
    from fednorm.session import check_real

    party = request.party
    try:
        X = load_data(context)
        if is_table(X):
            assert request.start is not None
            X = _by_name(party, X, request.start.features)
        check_real(X)
        return check_party_data(X)
    except SessionRefused:
        raise  # about the session's columns, not the data: it travels as it is
    except InputError as exc:
        refusal = UNUSABLE_DATA.refusal(party, exc)
        print(f"fednorm node {context.node_id}: {refusal}", file=sys.stderr, flush=True)
        raise refusal from None


def _by_name(party: int, frame: object, features: tuple[str, ...] | None) -> np.ndarray:
    """A DataFrame's values, its columns in the order the ServerApp names them (in its own
    order if the ServerApp names none); other columns than the named ones: the session
    is refused, naming them (the names are the federation's, so they travel)."""
    from fednorm.protocols.columns import ColumnsDiffer, column_names, in_order

    order = features if features is not None else column_names(frame, f"party {party}")
    try:
        return in_order(frame, party, order)
    except ColumnsDiffer as exc:
        raise SessionRefused(f"party {party} refused the session: {exc}") from None


def _setup(request: Request, X: np.ndarray, context: Context) -> dict[str, object]:
    assert request.start is not None
    certs = context.node_config.get(CERTS_KEY, os.environ.get(CERTS_ENV))
    return {"party": request.party, "parties": request.start.parties,
            "session": request.session,
            "methods": list(request.start.methods), "privacy": request.start.privacy,
            "options": request.start.options, "timeout": request.timeout,
            "X": array_to_wire(X), "certs": None if certs is None else str(certs),
            "features": request.start.features,
            "allow_unflooded": _true(context.node_config.get(ALLOW_UNFLOODED_KEY, False))}


def _true(value: object) -> bool:
    """A node config flag: Flower's TOML gives a bool, a command line a string."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _answer(request: Request, reply: dict[str, object], context: Context) -> Answer:
    status = str(reply.get("status"))
    frames = reply.get("frames", [])
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise ProtocolError("the party worker answered malformed frames")
    digest = b""
    if status == "done":
        wire = reply.get("normalizers")
        if not isinstance(wire, list) or not wire or not all(isinstance(w, dict) for w in wire):
            raise ProtocolError("the party worker finished without its normalizers")
        digest = wire_digest(wire)
        context.state[STATE_KEY] = ConfigRecord({
            "session": request.session,
            "normalizers": msgpack.packb(wire, use_bin_type=True),
        })
    return Answer(request.session, status, frames, str(reply.get("error", "")), digest)


def fitted_normalizer(context: Context, method: str | None = None) -> Normalizer:
    """The normalizer this node's party fitted in the run's latest fednorm session: the
    session's only one, or the one of ``method`` (needed if it fitted several)."""
    record = context.state.get(STATE_KEY)
    if not isinstance(record, ConfigRecord):
        raise InputError("this node has not finished a fednorm normalization in this run")
    fitted = {n.METHOD: n for n in map(normalizer_from_wire,
                                       msgpack.unpackb(record["normalizers"], raw=False))}
    return pick_normalizer(fitted, method)


def start_worker(path: Path, timeout: float) -> None:
    """Start the party worker listening on ``path`` and wait until it is ready.

    It watches this process's parent (Flower's SuperExec, which outlives each ClientApp
    run but not the SuperNode), so a node that goes away takes its workers with it.
    """
    if path.exists():
        raise ProtocolError(f"a party worker already serves this session ({path})")
    command = [sys.executable, "-m", "fednorm.flower.worker", "--pipe", os.fspath(path),
               "--watch-pid", str(os.getppid()), "--timeout", repr(float(timeout))]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], WORKER_START_SECONDS)
        line = proc.stdout.readline() if ready else b""
    finally:
        proc.stdout.close()
    if line != READY:
        proc.kill()
        proc.wait()
        raise FednormError(f"the party worker did not start (exit code {proc.returncode})")

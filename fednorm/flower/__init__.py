"""fednorm inside Flower: any fednorm protocol, plain or MHE, over Flower's Message API.

Needs the ``flower`` extra (``pip install 'fednorm[flower]'``); the core install does not.

Server side, in a ServerApp's ``main``::

    nodes = wait_for_nodes(grid, 3)
    fitted = normalize(grid, nodes, "robust", "plain")   # fitted.normalizer

Node side, in the ClientApp module::

    register_party(app, load_data)       # answers ``query.fednorm`` messages
    ...
    Z = fitted_normalizer(context).transform(X)   # in the train/evaluate handlers

How a protocol runs.  The ServerApp runs the fednorm server role unchanged; its links
(:mod:`fednorm.flower.server`) queue the frames it sends and, when it waits for a party,
send one Flower message per party with frames queued and wait for the answers, so a
protocol round is a Flower round.  Frames are the same msgpack frames a TCP run sends,
carried as arrays in the message's RecordDict (:mod:`fednorm.flower.content`).

Where party state lives.  A party is a coroutine that keeps state between messages, for
MHE its secret key share, but Flower's SuperNode starts a fresh ClientApp process for
every message (in both its ``subprocess`` and ``process`` isolation modes; only the
node's Context state is carried over, as data).  So the first message of a session
starts a party worker on the node (:mod:`fednorm.flower.worker`): a process that runs the
party role for that session and listens on a Unix socket in a directory private to the
user (:mod:`fednorm.flower.localpipe`), keyed by node, run and session.  Each ClientApp
run relays the server's frames to it and answers with what the party sent before it
waited again.  The secret key, like the rest of the party's state and its data, never
leaves the worker: not in a message, not in the Context, not on the server.  What the
node keeps in its Context is only the fitted (public) normalizer, for its training.

No orphans.  The worker ends with its role (result, error, or the server's Abort, which
the server delivers when it fails), when no ClientApp run comes within the protocol
timeout, when the SuperExec that runs the node's ClientApps exits (it watches that
process), or on SIGTERM/SIGINT, and it removes its socket.  On the server side the role
runs in one trio run inside ``normalize``; Grid calls run in worker threads that end with
each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fednorm.flower.client import fitted_normalizer, register_party
    from fednorm.flower.server import FlowerNormalization, normalize, wait_for_nodes

__all__ = [
    "FlowerNormalization",
    "fitted_normalizer",
    "normalize",
    "register_party",
    "wait_for_nodes",
]

_HOMES = {
    "fitted_normalizer": "fednorm.flower.client",
    "register_party": "fednorm.flower.client",
    "FlowerNormalization": "fednorm.flower.server",
    "normalize": "fednorm.flower.server",
    "wait_for_nodes": "fednorm.flower.server",
}


def __getattr__(name: str) -> Any:
    """Import lazily, so the party worker (which needs no Flower) starts without it."""
    if name not in _HOMES:
        raise AttributeError(f"module 'fednorm.flower' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value

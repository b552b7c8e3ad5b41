"""``fednorm certs init``, ``fednorm serve`` and ``fednorm party``: a federation over TCP.

Everything a user can get wrong (data, certificates, ids, addresses, method, the
server's V_abs and columns, output directories) is checked before the first
connection, so bad input exits 2 without bothering the peers; failures of the run
itself exit 1 with the cause (e.g. "party 2 dropped").  A server of several sessions
exits 0 if all succeeded, 1 if none did, 3 if some did, and prints a line per session.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import TypeVar

import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.cli.options import add_fit_options, fit_options
from fednorm.cli.progress import TerminalProgress, add_quiet_option, progress_for
from fednorm.engine.clock import run_trio
from fednorm.engine.errors import InputError, root_cause
from fednorm.multihost.config import PartyConfig, ServerConfig, Timeouts
from fednorm.multihost.files import (
    check_data_path,
    check_out_dir,
    load_party_data,
    party_outputs,
    replace_outputs,
)
from fednorm.multihost.party import Party
from fednorm.multihost.server import Server, SessionOutcome
from fednorm.protocols import METHODS
from fednorm.protocols.base import ALLOW_UNFLOODED, UNUSABLE_DATA
from fednorm.protocols.methods import split_methods
from fednorm.transport.tcp import DEFAULT_MAX_FRAME, parse_address
from fednorm.transport.tls import init_certs

T = TypeVar("T")


def _logger(role: str, progress: TerminalProgress | None = None) -> Callable[[str], None]:
    def log(message: str) -> None:
        line = f"fednorm {role}: {message}"
        if progress is not None:
            progress.log(line)
        else:
            print(line, file=sys.stderr, flush=True)

    return log


def certs_init_command(args: argparse.Namespace) -> int:
    written = init_certs(args.out, args.parties, args.host, days=args.days, force=args.force)
    print(f"wrote {len(written)} files to {args.out}: ca.pem (for every host), "
          f"server.pem/.key, party-1..{args.parties}.pem/.key (keys are 0600; "
          "ca.key only issues certificates: keep it offline)")
    return 0


def _timeouts(args: argparse.Namespace) -> Timeouts:
    return Timeouts(join=args.join_timeout, protocol=args.timeout)


def _features(text: str | None) -> tuple[str, ...] | None:
    """``--features a,b,c``: the federation's columns, in order."""
    if text is None:
        return None
    return tuple(name.strip() for name in text.split(","))


# Exit status of `fednorm serve`: every session succeeded, none did, or some did.
ALL_SESSIONS_DONE, NO_SESSION_DONE, SOME_SESSIONS_FAILED = 0, 1, 3


def serve_status(outcomes: Sequence[SessionOutcome]) -> int:
    failed = sum(outcome.error is not None for outcome in outcomes)
    if failed == 0:
        return ALL_SESSIONS_DONE
    return NO_SESSION_DONE if failed == len(outcomes) else SOME_SESSIONS_FAILED


def session_line(outcome: SessionOutcome) -> str:
    """One stdout line per session, as it ends: its number, id and how it ended."""
    head = f"session {outcome.number} ({outcome.session}):"
    if outcome.error is not None:
        return f"{head} failed: {outcome.error}"
    wrote = f"; wrote {', '.join(map(str, outcome.written))}" if outcome.written else ""
    return f"{head} done in {outcome.seconds:.1f} s{wrote}"


def serve_command(args: argparse.Namespace) -> int:
    host, port = parse_address(args.bind)
    config = ServerConfig(
        host, port, parties=args.parties, methods=args.method, certs=args.certs,
        privacy=args.privacy, options=fit_options(args),
        timeouts=_timeouts(args), sessions=None if args.keep_serving else args.sessions,
        out=args.out, features=_features(args.features), force=args.force,
        max_frame=args.max_frame,
    )
    progress = progress_for(args, "fednorm serve")
    server = Server(config, log=_logger("serve", progress), tracer=progress,
                    on_session=lambda outcome: print(session_line(outcome), flush=True))

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            bound_host, bound_port = await nursery.start(server.serve)
            print(f"listening on {bound_host}:{bound_port}", flush=True)

    with progress or nullcontext():
        _run(serve)
    return serve_status(server.outcomes)


def party_command(args: argparse.Namespace) -> int:
    host, port = parse_address(args.connect)
    check_out_dir(args.out, force=args.force)
    check_data_path(args.data)
    progress = progress_for(args, f"fednorm party {args.id}")
    party = Party(PartyConfig(host, port, args.id, args.certs, _timeouts(args),
                              max_frame=args.max_frame,
                              allow_unflooded=args.allow_paper_algorithms),
                  log=_logger(f"party {args.id}", progress), tracer=progress)
    try:
        data = load_party_data(args.data, args.target)
    except InputError as exc:  # the others need not wait for a party that cannot come
        raise _run(partial(party.refuse, UNUSABLE_DATA, exc)) from None
    with progress or nullcontext():
        run = _run(lambda: party.run(data.X, data.features))
    written = replace_outputs(args.out, party_outputs(args.out, data, run))
    print(f"party {args.id}: {run.plan.name} session {run.welcome.session} done; "
          f"wrote {', '.join(map(str, written))}")
    return 0


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """trio.run, with a nursery's exception group reduced to its real cause (an
    interrupt is reported by :func:`fednorm.cli.main`)."""
    try:
        return run_trio(main)
    except BaseExceptionGroup as group:
        raise root_cause(group) from None


def _add_link_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds the server waits for each party's protocol message "
                        "(default 60); a party waits 2×S+5 for the server's, so that a "
                        "stalled party is named by the server")
    p.add_argument("--join-timeout", type=float, default=120.0, metavar="S",
                   help="seconds to wait for the other parties to join (default 120)")
    p.add_argument("--max-frame", type=_mebibytes, default=DEFAULT_MAX_FRAME, metavar="MIB",
                   help=f"largest frame this role sends or accepts, in MiB (default "
                        f"{DEFAULT_MAX_FRAME >> 20}); the largest frames, one party's key "
                        "shares, are 30-54 MiB at the paper preset whatever the number "
                        "of parties")


def _mebibytes(text: str) -> int:
    """``--max-frame``: a positive whole number of MiB, in bytes."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of MiB, got {text!r}")
    return value << 20


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The multi-host commands: ``certs init``, ``serve`` and ``party``."""
    _add_certs_parser(subparsers)
    _add_serve_parser(subparsers)
    _add_party_parser(subparsers)


def _add_certs_parser(subparsers: argparse._SubParsersAction) -> None:
    certs = subparsers.add_parser("certs", help="certificates for multi-host runs")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True)
    init = certs_commands.add_parser("init", help="a CA, a server and N party certificates")
    init.add_argument("--parties", type=int, required=True)
    init.add_argument("--out", type=Path, required=True, help="directory to write to")
    init.add_argument("--host", action="append", default=[],
                      help="a name or address the server is reached by (repeatable)")
    init.add_argument("--days", type=int, default=365, help="validity (default 365)")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.set_defaults(handler=certs_init_command)


def _add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run the server of a multi-host federation")
    serve.add_argument("--bind", required=True, metavar="HOST:PORT")
    serve.add_argument("--parties", type=int, required=True)
    serve.add_argument("--method", type=split_methods, required=True, metavar="M[,M...]",
                       help=f"what each session fits: one or more of {', '.join(METHODS)}, "
                            "in order; with --privacy mhe several share one key setup, and "
                            "every --out gets a directory per method")
    serve.add_argument("--privacy", choices=("plain", "mhe"), default="plain")
    add_fit_options(serve)
    serve.add_argument("--certs", type=Path, required=True, metavar="DIR")
    serve.add_argument("--features", metavar="A,B,...",
                       help="the federation's columns, in order: a party holding others is "
                            "refused, naming them (default: the columns most parties hold, "
                            "once all have joined); with --vabs checked before listening")
    serve.add_argument("--out", type=Path, metavar="DIR",
                       help="write params.json here (with --sessions K > 1 or "
                            "--keep-serving: session-<k>/params.json; several methods: "
                            "<method>/params.json in each); must be empty")
    serve.add_argument("--force", action="store_true",
                       help="write into a non-empty --out, replacing its files")
    add_quiet_option(serve)
    sessions = serve.add_mutually_exclusive_group()
    sessions.add_argument("--sessions", type=int, default=1, metavar="K",
                          help="serve K sessions, then exit (default 1)")
    sessions.add_argument("--keep-serving", action="store_true",
                          help="serve sessions until interrupted")
    _add_link_options(serve)
    serve.set_defaults(handler=serve_command)


def _add_party_parser(subparsers: argparse._SubParsersAction) -> None:
    party = subparsers.add_parser("party", help="run one party of a multi-host federation")
    party.add_argument("--connect", required=True, metavar="HOST:PORT")
    party.add_argument("--id", type=int, required=True, help="this party's id, 1..N")
    party.add_argument("--data", type=Path, required=True, metavar="FILE.csv")
    party.add_argument("--target", help="target column (kept, not normalized)")
    party.add_argument("--certs", type=Path, required=True, metavar="DIR")
    party.add_argument(ALLOW_UNFLOODED, action="store_true",
                       help="join a session running the paper's PPF algorithms "
                            "(--algorithm paper), some of whose decryptions this party "
                            "floods by a measured noise only, others not at all (it "
                            "checks every request, docs/LEAKAGE.md); refused by default")
    party.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="write normalized.csv and params.json here (a session of "
                            "several methods: <method>/normalized.csv, ...); must be empty")
    party.add_argument("--force", action="store_true",
                       help="write into a non-empty --out, replacing its files")
    add_quiet_option(party)
    _add_link_options(party)
    party.set_defaults(handler=party_command)

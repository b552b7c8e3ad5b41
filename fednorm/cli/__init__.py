"""The ``fednorm`` command: one module per group of subcommands, each adding its parsers."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata

from exceptiongroup import BaseExceptionGroup

from fednorm.cli import bench, demo, net, simulate, study
from fednorm.engine.errors import FednormError, InputError, root_cause

INTERRUPTED = 130  # the shell's status for a process stopped by SIGINT

SUBCOMMAND_MODULES = [simulate, demo, net, study, bench]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fednorm",
        description="Federated and privacy-preserving data normalization for federated learning.",
    )
    parser.add_argument("--version", action="version", version=f"fednorm {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def _version() -> str:
    """The installed distribution's version (the checkout's, for an editable install)."""
    try:
        return metadata.version("fednorm")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; bad input exits 2, any other fednorm failure exits 1, and an
    interrupt (SIGINT or SIGTERM) exits 130 saying so, without a traceback."""
    args = build_parser().parse_args(argv)
    try:
        with terminate_as_interrupt():
            try:
                return args.handler(args)
            except BaseExceptionGroup as group:  # a trio nursery's: its first cause
                raise root_cause(group) from None
    except KeyboardInterrupt:
        print("fednorm: interrupted", file=sys.stderr)
        return INTERRUPTED
    except InputError as exc:
        print(f"fednorm: error: {exc}", file=sys.stderr)
        return 2
    except FednormError as exc:
        print(f"fednorm: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def run() -> None:
    """The ``fednorm`` command's entry point: :func:`main`, then exit with its status.

    After an interrupt or a failure a crypto call may still be running in an abandoned
    worker thread (a role does not wait for it, to tell its peers at once; a party that
    sends its key shares while it reads the others' abandons one branch when the other
    fails); finalizing the interpreter underneath native code would abort the process
    (SIGABRT) instead of exiting with the status, so then the process ends at once, its
    output flushed (nothing is half-written: outputs are written only after a whole run
    succeeded)."""
    status = main()
    if status != 0 and threading.active_count() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a service manager's stop, ``kill``) does what SIGINT does: inside a trio
    run, trio delivers it where it is safe, each role tells its peers it was interrupted.
    Python's default for SIGTERM is to die on the spot, peers learning nothing."""
    def forward(signum: int, frame: object) -> None:
        signal.raise_signal(signal.SIGINT)

    try:
        previous = signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread (an embedding application's worker)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

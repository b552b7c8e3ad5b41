"""The ``fednorm`` command: one module per group of subcommands, each adding its parsers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from fednorm.cli import bench, demo, net, simulate, study
from fednorm.engine.errors import FednormError, InputError

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
    """Run one subcommand; bad input exits 2, any other fednorm failure exits 1."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except InputError as exc:
        print(f"fednorm: error: {exc}", file=sys.stderr)
        return 2
    except FednormError as exc:
        print(f"fednorm: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

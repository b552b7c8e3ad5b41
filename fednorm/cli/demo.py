"""``fednorm demo``: every normalization, plain then PPF, on one dataset, then a summary.

What ``make demo`` runs: per privacy mode one ``simulate`` session of every method (in
PPF mode on one joint key setup, reported as its own "(keys)" line), each with its
report (the federated parameters beside the pooled ones), and at the end one screen that answers
"did it work and what did it cost": per method and privacy the worst relative error
against the pooled fit, the protocol rounds, the bytes on the wire and the seconds.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fednorm.cli.progress import add_quiet_option
from fednorm.cli.simulate import human_session_report, run_simulation
from fednorm.engine.ckks.flooding import DEFAULT_DECRYPTIONS
from fednorm.protocols import METHODS
from fednorm.protocols.methods import split_methods
from fednorm.protocols.progress import human_bytes


@dataclass(frozen=True)
class DemoRow:
    """One run of the demo, as its summary line shows it."""

    method: str
    privacy: str
    worst_absolute_error: float | None  # None: the key setup, which fits nothing
    worst_relative_error: float | None
    rounds: int
    bytes_total: int
    seconds: float


def demo_command(args: argparse.Namespace) -> int:
    rows = []
    for privacy in ("plain", "mhe"):  # the methods are checked as the first session starts
        session = _simulate_args(args, split_methods(args.methods), privacy)
        outcome = run_simulation(session)
        print(human_session_report(session, outcome), end="\n\n", flush=True)
        if outcome.setup is not None:
            rows.append(DemoRow("(keys)", privacy, None, None, outcome.setup.rounds,
                                outcome.setup.bytes_total, outcome.setup.seconds))
        for run in outcome.runs:
            report, comparison = run.result.report, run.comparison
            rows.append(DemoRow(run.method, privacy, comparison.max_abs_error,
                                comparison.max_rel_error, report.rounds,
                                report.bytes_total, report.seconds))
    print(summary(rows, args))
    return 0


def _simulate_args(args: argparse.Namespace, methods: tuple[str, ...], privacy: str
                   ) -> argparse.Namespace:
    return argparse.Namespace(
        dataset=args.dataset, target=None, parties=args.parties, split="iid", seed=0,
        method=methods, privacy=privacy, algorithm="default", epsilon=None,
        ckks_preset=args.preset,
        rank_probes=None, reveal_counts=False, vabs=None, no_replay=False, json=False,
        flooding_decryptions=DEFAULT_DECRYPTIONS,
        quiet=args.quiet,
        command="demo")


def summary(rows: list[DemoRow], args: argparse.Namespace) -> str:
    """The closing screen: one line per method and privacy."""
    lines = [f"Summary: {args.dataset}, {args.parties} parties, IID split; PPF with the "
             f"{args.preset} preset; worst errors against the pooled fit",
             f"{'method':<11} {'privacy':<8} {'abs error':>10} {'rel error':>10} "
             f"{'rounds':>6} {'bytes':>10} {'seconds':>8}"]
    for row in rows:
        lines.append(f"{row.method:<11} {row.privacy:<8} {_error(row.worst_absolute_error)} "
                     f"{_error(row.worst_relative_error)} {row.rounds:>6} "
                     f"{human_bytes(row.bytes_total):>10} {row.seconds:>8.2f}")
    return "\n".join(lines)


def _error(value: float | None) -> str:
    return f"{'-':>10}" if value is None else f"{value:>10.2e}"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="every normalization, plain then PPF, and a summary",
                              description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="bcw", help="'bcw' (built in) or a CSV path")
    p.add_argument("--parties", type=int, default=10, help="number of parties (default 10)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    p.add_argument("--preset", choices=("test", "paper"), default="paper",
                   help="CKKS parameters of the PPF runs (default paper)")
    add_quiet_option(p)
    p.set_defaults(handler=demo_command)

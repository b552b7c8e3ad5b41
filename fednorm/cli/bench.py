"""``fednorm bench``: the PPF benchmarks beside the paper's Section VI, as a report.

Runs the sections of :mod:`fednorm.bench.report` (Table IV primitives, Table V totals,
Table VI precision, runtime vs ε, totals vs P, communication, noise) under one progress
bar on stderr, then writes the Markdown report, PNG plots and, optionally, every row as
JSON. ``--quick`` is a smoke run at the (insecure) test preset.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from fednorm.engine.errors import InputError

T = TypeVar("T")


def _list_of(convert: Callable[[str], T], what: str) -> Callable[[str], tuple[T, ...]]:
    def parse(text: str) -> tuple[T, ...]:
        try:
            return tuple(convert(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: comma-separated values, not {text!r}"
                                             ) from None
    return parse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from fednorm.bench.cases import CASES  # light: the protocols it names are loaded

    p = subparsers.add_parser("bench", help="PPF benchmarks beside the paper (Tables IV-VI)",
                              description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: test preset, small grids, one repeat (a few minutes)")
    p.add_argument("--sections", type=_list_of(str, "--sections"),
                   help="comma-separated subset of micro,totals,epsilon,scaling,precision,"
                        "zscore,noise,flooding,plain,threads,study (default: all; study runs the "
                        "tabular study grid, about 1.5 h, and needs torch)")
    p.add_argument("--preset", help="CKKS preset: paper (default) or test (--quick)")
    p.add_argument("--repeats", type=int,
                   help="runs per Table V case and z-score mode (default 2)")
    p.add_argument("--cases", type=_list_of(str, "--cases"),
                   help="Table V (totals) benchmark cases, each run beside the "
                        "--algorithm paper case it is compared with: "
                        + ",".join(CASES) + " (default: all)")
    p.add_argument("--parties", type=int, help="P of Table V / VI and runtime vs ε (10)")
    p.add_argument("--micro-parties", type=_list_of(int, "--micro-parties"),
                   help="Table IV party counts (default 10,20,30,50)")
    p.add_argument("--scaling-parties", type=_list_of(int, "--scaling-parties"),
                   help="P grid of the totals vs P (default 3,10,25,50)")
    p.add_argument("--scaling-methods", type=_list_of(str, "--scaling-methods"),
                   help="benchmark cases of the totals vs P, as --cases (default "
                        "zscore,zscore_paper_on_trust)")
    p.add_argument("--epsilons", type=_list_of(float, "--epsilons"),
                   help="ε grid of the k-th search (default 1e-1,...,1e-6)")
    p.add_argument("--results", help="write the report here as the project's results "
                                     "(bench/RESULTS.md; refused with --quick)")
    p.add_argument("--out", help="write the generated report here (default: stdout, "
                                 "unless --results is given)")
    p.add_argument("--plots", help="directory of the PNG plots (default: plots/ beside "
                                   "--results or --out; none if both are absent)")
    p.add_argument("--json", help="also write every row as JSON here")
    p.add_argument("--quiet-below", type=float, default=0.5,
                   help="before each section wait until other processes keep fewer than "
                        "this many cores busy (default 0.5)")
    p.add_argument("--max-wait", type=float, default=0.0,
                   help="longest wait for --quiet-below, seconds (default 0: no wait)")
    p.set_defaults(handler=bench_command)


_PLAN_FIELDS = {"sections": "sections", "preset": "preset", "repeats": "repeats",
                "parties": "parties", "cases": "cases", "micro_parties": "micro_parties",
                "scaling_parties": "scaling_parties", "scaling_methods": "scaling_methods",
                "epsilons": "epsilons"}


def plan_from(args: argparse.Namespace, command: str) -> Any:
    from fednorm.bench.report import BenchPlan

    changes: dict[str, object] = {field: getattr(args, arg) for arg, field in
                                  _PLAN_FIELDS.items() if getattr(args, arg) is not None}
    changes |= {"quiet_below": args.quiet_below, "max_wait": args.max_wait,
                "command": command}
    if args.quick:
        return BenchPlan.quick_plan(**changes)
    return replace(BenchPlan(), **changes)


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before hours of work if an output cannot be written."""
    if args.quick and args.results:
        raise InputError("--quick numbers (insecure test preset, one run) are not results: "
                         "write them with --out, not --results")
    for path in (args.results, args.out, args.json):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(f"no directory for {path}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if args.plots or args.results or args.out:
            raise InputError("plots need matplotlib: pip install 'matplotlib>=3.7' (make bench "
                             "installs it)") from None


def bench_command(args: argparse.Namespace) -> int:
    from fednorm.bench import plots, report

    command = "fednorm " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else (
        "fednorm bench")
    plan = plan_from(args, command)
    _check_outputs(args)
    target = args.results or args.out
    plot_dir = args.plots or (os.path.join(os.path.dirname(os.path.abspath(target)), "plots")
                              if target else None)
    written: dict[str, str] = {}

    def write(run: report.BenchRun) -> None:
        """The report so far, rewritten after every section."""
        written.update(plots.write_plots(run.sections, plot_dir) if plot_dir else {})
        base = os.path.dirname(os.path.abspath(target)) if target else "."
        text = report.render(run, written, relative_to=base)
        for path in (args.results, args.out):
            if path:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
        if not target and run.complete:
            print(text)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({k: s.rows for k, s in run.sections.items()}, f, indent=1,
                          default=str)

    report.run_plan(plan, after_section=write)
    for path in [args.results, args.out, *written.values()]:
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0

"""``fednorm tune``: choose a dataset's training settings on the tuning view of its
partitions (:mod:`fednorm.training.tuning`), never on its test rows.

Every combination of the given choices runs the selected grid into its own resumable
file, ``<out-dir>/<dataset>/<candidate>.csv``; the ranking (best first) is printed and
written to ``<out-dir>/<dataset>/ranking.csv``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from fednorm.cli.options import fit_options
from fednorm.cli.study import (
    _integers,
    _names,
    _numbers,
    _on_off,
    add_grid_flags,
    grid_cells,
    run_into,
    run_settings,
)
from fednorm.engine.errors import InputError
from fednorm.training.tuning import Candidate, TuningScore, candidates, tuning_scores


def _floats(text: str) -> list[float]:
    return _numbers(text, float)


def tune_command(args: argparse.Namespace) -> int:
    cells = grid_cells(args)
    choices = _choices(args)
    options = fit_options(args)
    for dataset in dict.fromkeys(cell.dataset for cell in cells):
        mine = [cell for cell in cells if cell.dataset == dataset]
        files = {}
        for candidate in choices:
            files[candidate.name] = args.out_dir / dataset / f"{candidate.name}.csv"
            settings = run_settings(args, options, tuning=True, **candidate.overrides())
            run_into(mine, files[candidate.name], settings, args.jobs)
        ranking = tuning_scores(files)
        _write_ranking(args.out_dir / dataset / "ranking.csv", ranking)
        print(f"{dataset}: " + "; ".join(f"{s.candidate} {s.score:.4f} ({s.runs} runs, "
                                         f"{s.single_class} single-class)"
                                         for s in ranking))
    return 0


def _choices(args: argparse.Namespace) -> list[Candidate]:
    if any(not 0 < lr < 1 for lr in args.lr or ()):
        raise InputError("--lr values must be in (0, 1)")
    if any(p < 1 for p in args.patience or ()) or any(m < 0 for m in args.min_rounds or ()):
        raise InputError("--patience values must be ≥ 1 and --min-rounds values ≥ 0")
    if not set(args.regression_loss or ()) <= {"mae", "mse"}:
        raise InputError("--regression-loss takes mae and/or mse")
    if not set(args.select or ()) <= {"loss", "f1", "macro_f1"}:
        raise InputError("--select takes loss, f1 and/or macro_f1")
    if not set(args.persist_optimizer or ()) <= {"on", "off"}:
        raise InputError("--persist-optimizer takes on and/or off")
    persist = [_on_off(v) for v in args.persist_optimizer] if args.persist_optimizer else None
    return candidates(lr=args.lr, regression_loss=args.regression_loss,
                      min_rounds=args.min_rounds, patience=args.patience,
                      persist_optimizer=persist, select=args.select)


def _write_ranking(path: Path, ranking: list[TuningScore]) -> None:
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(["candidate", "tuning_score", "runs", "single_class"])
        writer.writerows([s.candidate, f"{s.score:.4f}", s.runs, s.single_class]
                         for s in ranking)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune", help="choose training settings on tuning rows carved from the training rows",
        description="Run the grid once per combination of the given choices, scoring each "
        "run on tuning rows taken from the clients' training rows (the test rows are "
        "dropped unread), and rank the combinations by the mean macro-F1 (R² for "
        "regression) of all their runs, references included; the ranking also counts "
        "the runs that predicted a single class.")
    add_grid_flags(p)
    p.add_argument("--out-dir", type=Path, default=Path("results") / "tuning",
                   help="one folder per dataset, one CSV per candidate (resumable)")
    p.add_argument("--lr", type=_floats, help="Adam steps to try, e.g. 1e-3,3e-3,1e-2")
    p.add_argument("--patience", type=_integers, help="e.g. 10,30")
    p.add_argument("--min-rounds", type=_integers, help="e.g. 0,150,300")
    p.add_argument("--regression-loss", type=_names, help="mae and/or mse")
    p.add_argument("--persist-optimizer", type=_names, help="on and/or off")
    p.add_argument("--select", type=_names,
                   help="checkpoint criteria to try: loss, f1 and/or macro_f1")
    p.set_defaults(handler=tune_command)

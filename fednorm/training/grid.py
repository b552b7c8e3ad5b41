"""The study's grid (datasets × skews × client counts × normalizations × seeds) and the
resumable CSV it is recorded in.

Per-dataset defaults reproduce the paper's Section IV: Table I's skews (image datasets
get weaker feature noise, σ in [0, 1] pixel units; tabular σ is in units of each
feature's standard deviation), 10/20/30 clients for tabular and 10/20/50 for image
data, the paper's normalizations (12 for tabular data: instance norm is layer norm on
an MLP; 11 for images: Yeo-Johnson was run on tabular data only) plus the centralized
references (the lookup one where a dataset has lookup columns), five seeds, and
training settings under which runs end by early stopping rather than at the round cap.

Everything here is checked before any run starts, so a typo exits with an
``InputError`` instead of surfacing hours into a grid. Torch-free.
"""

from __future__ import annotations

import csv
import fcntl
import io
import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Literal

from fednorm.engine.errors import InputError
from fednorm.protocols import get_protocol
from fednorm.sim.partition import SplitSpec
from fednorm.training.normalization import (
    IMAGE_NORMALIZATIONS,
    LOOKUP_REFERENCE,
    PRIVACY_MODES,
    REFERENCE_NORMALIZATIONS,
    TABULAR_NORMALIZATIONS,
    NormalizationSpec,
)

DataKind = Literal["tabular", "image"]

# Table I: quantity β 0.7 / 5, label β 0.5 / 5, feature σ 0.3 / 0.7 (images 0.01 / 0.1).
# (Table I prints quantity 0.5 with 0.7 for images; the authors' tabular scripts use 0.7.)
TABULAR_SKEWS = ("iid", "quantity:0.7", "quantity:5", "label:0.5", "label:5",
                 "feature:0.3", "feature:0.7")
IMAGE_SKEWS = ("iid", "quantity:0.7", "quantity:5", "label:0.5", "label:5",
               "feature:0.01", "feature:0.1")
# Five seeds: with fewer, no signed-rank p-value can fall below 0.25 (3 seeds) and a
# bootstrap interval has almost no resamples to spread over (fednorm.training.inference).
STUDY_SEEDS = (0, 1, 2, 3, 4)


RegressionLoss = Literal["mae", "mse"]
Selection = Literal["loss", "f1", "macro_f1"]


# MLP partitions a job: all of a dataset and seed in the paper grid (7 skews x 3 client
# counts), so that a step's fixed costs are paid once for all of them; a stopped grid
# loses the jobs it was running (a Parkinson's job, estimated: about half an hour).
PARTITIONS_PER_JOB = 21


@dataclass(frozen=True)
class DatasetDefaults:
    """A dataset's slice of the paper grid and its training settings.

    ``class_weighted``: cross-entropy weighted by the inverse of each class's share of
    the federation's training rows (see :mod:`fednorm.training.runner`).
    """

    kind: DataKind
    batch_size: int
    max_rounds: int
    patience: int
    min_rounds: int = 0  # early stopping may not end a run before this round
    class_weighted: bool = False
    regression_loss: RegressionLoss = "mae"
    lr: float = 1e-3  # Adam's learning rate
    select: Selection = "loss"  # kept weights: lowest validation loss or highest F1
    persist_optimizer: bool = False  # each client's Adam state kept across rounds
    lookup: bool = False  # the dataset has lookup columns: the central_lookup reference

    @property
    def partitions_per_job(self) -> int:
        """Partitions of one seed trained as one stack (:mod:`fednorm.training.jobs`), so
        that their central models and their largest clients' last batches step
        together (Parkinson's seed 0 at 20 rounds: 243.9 s as three jobs of seven, 222.2 s
        as one; bench/runs/2026-12-07-segments.md). Images keep one: torch's convolutions
        round a slot differently with the stack's size (digits seed 0: 42 of 294 rows
        moved), and on digits seven partitions a job were slower (10.0 against 8.7 min at
        --jobs 2; bench/runs/2026-12-07-partitions-stacked.md)."""
        return PARTITIONS_PER_JOB if self.kind == "tabular" else 1

    @property
    def skews(self) -> tuple[str, ...]:
        return TABULAR_SKEWS if self.kind == "tabular" else IMAGE_SKEWS

    @property
    def clients(self) -> tuple[int, ...]:
        return (10, 20, 30) if self.kind == "tabular" else (10, 20, 50)

    @property
    def normalizations(self) -> tuple[str, ...]:
        norms = TABULAR_NORMALIZATIONS if self.kind == "tabular" else IMAGE_NORMALIZATIONS
        lookup = (LOOKUP_REFERENCE,) if self.lookup else ()
        return (*norms, *REFERENCE_NORMALIZATIONS, *lookup)


# Round caps sit well above the slowest runs measured, so early stopping (not the cap)
# ends a run; classification keeps the weights of the best validation F1 (HCV's
# lowest-loss weights predict the majority class); Parkinson's learns with a larger
# step. HCV takes a step of 1e-2 and at least 300 rounds: its validation loss bottoms
# out while the network still predicts the majority class, and at 1e-3 a third of the
# runs still did after 200 rounds; keeping each client's Adam state across rounds cut
# its single-class runs from 16 % to 10 % over the whole HCV grid, and 300 rounds
# instead of 150 to 5.5 % (min-max runs separate the classes only after round 150).
# digits takes a step of 3e-3: at 1e-3, 39 % of its 20- and 50-client runs reached the
# cap of 300 rounds; so does MNIST: at 1e-3 its 50-client runs took 116-300 rounds (one
# at the cap), at 3e-3 45-153, F1 within 0.004 or higher. The measurements are in
# results/README.md. Chosen on tuning rows instead (fednorm tune, results/tuning/):
# BCW's step 1e-2 with at least 300 rounds (it was 3e-3, no minimum; 3e-2 ranked first
# but collapsed twice as many runs to one class); digits' 3e-3 stands; HCV keeps step
# 1e-2, 300 rounds and Adam's state, and selects rounds by macro-F1 (it was F1: 0.3736
# against 0.3719 on tuning rows, two seeds, a tie within any interval).
DATASETS: dict[str, DatasetDefaults] = {
    "bcw": DatasetDefaults("tabular", batch_size=8, max_rounds=500, patience=10, lr=1e-2,
                           min_rounds=300, select="f1"),
    "hcv": DatasetDefaults("tabular", batch_size=8, max_rounds=500, patience=10,
                           min_rounds=300, lr=1e-2, select="macro_f1",
                           persist_optimizer=True),
    "parkinsons": DatasetDefaults("tabular", batch_size=8, max_rounds=600, patience=15,
                                  lr=1e-3, regression_loss="mse", lookup=True),
    "digits": DatasetDefaults("image", batch_size=16, max_rounds=300, patience=10,
                              lr=3e-3, select="f1"),
    "mnist": DatasetDefaults("image", batch_size=32, max_rounds=300, patience=10,
                             lr=3e-3, select="f1"),
    "mnist_idx": DatasetDefaults("image", batch_size=64, max_rounds=300, patience=10,
                                 select="f1"),
    "cifar10": DatasetDefaults("image", batch_size=64, max_rounds=300, patience=10,
                               select="f1"),
}
# Parkinson's split by patient is the main reading, the paper's row-random split the
# "paper" one (fednorm.training.data); both were step 3e-3 with the absolute loss. On
# tuning rows the row-random split chose the squared loss at step 1e-3 (tuning R² 0.4314
# against 0.4034), the split by patient the squared loss at step 3e-3 (-0.506 against
# -0.617: every candidate scores below the tuning patients' mean).
DATASETS["parkinsons_patients"] = replace(DATASETS["parkinsons"], lr=3e-3)
PRESETS: dict[str, tuple[str, ...]] = {
    "tabular": ("bcw", "hcv", "parkinsons_patients", "parkinsons"),
    "digits": ("digits",),
    "mnist": ("mnist",),
    "images": ("mnist_idx", "cifar10"),
    "paper": ("bcw", "hcv", "parkinsons_patients", "parkinsons", "mnist", "cifar10"),
}

KEY_COLUMNS = ("dataset", "skew", "clients", "normalization", "seed", "privacy")
# test_predicted_classes: how many classes the test predictions use (1 = a run that
# predicts one class for every row); max_rounds: the run's round cap (rounds equal to
# it mean the cap, not early stopping, ended the run). Losses are in standardized
# target units for regression; test_mae and test_r2 in the target's own units.
COLUMNS = (
    *KEY_COLUMNS, "task", "status",
    "test_accuracy", "test_f1", "test_macro_f1", "test_precision", "test_recall",
    "test_predicted_classes",
    "test_mae", "test_r2", "test_loss", "best_val_loss", "rounds", "best_round",
    "max_rounds", "norm_seconds", "norm_bytes", "seconds", "error",
)


@dataclass(frozen=True)
class Cell:
    """One run of the grid; its key columns identify it in the results file."""

    dataset: str
    skew: str
    clients: int
    normalization: str
    seed: int
    privacy: str = "plain"

    def key(self) -> tuple[str, ...]:
        return tuple(str(getattr(self, column)) for column in KEY_COLUMNS)

    def label(self) -> str:
        return (f"{self.dataset} {self.skew} P={self.clients} {self.normalization} "
                f"seed {self.seed}")


@dataclass(frozen=True)
class GridRequest:
    """What the user asked for; ``None`` fields take each dataset's paper defaults."""

    preset: str | None = "tabular"
    datasets: Sequence[str] | None = None
    skews: Sequence[str] | None = None
    clients: Sequence[int] | None = None
    normalizations: Sequence[str] | None = None
    seeds: Sequence[int] | None = None
    privacy: str = "plain"


def build_grid(request: GridRequest) -> list[Cell]:
    """Every cell of the requested grid, in canonical spelling; bad names are InputErrors."""
    datasets = _datasets(request)
    if request.privacy not in PRIVACY_MODES:
        raise InputError(f"unknown privacy {request.privacy!r}; use {', '.join(PRIVACY_MODES)}")
    skews = _canonical(request.skews, lambda s: str(SplitSpec.parse(s)))
    norms = _canonical(request.normalizations, lambda n: str(NormalizationSpec.parse(n)))
    clients = _positive_ints(request.clients, "client count", lowest=1)
    seeds = _positive_ints(request.seeds, "seed", lowest=0) or STUDY_SEEDS
    cells = []
    for seed, name in itertools.product(seeds, datasets):  # seed-major: an interrupted
        defaults = DATASETS[name]                            # grid has whole seeds done
        axes = (skews or defaults.skews, clients or defaults.clients,
                norms or defaults.normalizations)
        cells += [Cell(name, s, c, n, seed, request.privacy)
                  for s, c, n in itertools.product(*axes)]
    _check_protocols({cell.normalization for cell in cells}, request.privacy)
    return list(dict.fromkeys(cells))  # drop duplicates, keep order


def _check_protocols(normalizations: set[str], privacy: str) -> None:
    """Every federated normalization must have a protocol in the chosen privacy mode."""
    for name in sorted(normalizations):
        spec = NormalizationSpec.parse(name)
        if spec.kind == "federated" and spec.method is not None:
            get_protocol(spec.method, privacy)


def _datasets(request: GridRequest) -> tuple[str, ...]:
    if request.datasets:
        names = tuple(dict.fromkeys(n.strip().lower() for n in request.datasets))
    elif request.preset in PRESETS:
        names = PRESETS[request.preset]
    else:
        raise InputError(f"unknown preset {request.preset!r}; use {', '.join(PRESETS)}")
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise InputError(f"unknown dataset {', '.join(map(repr, unknown))}; the study knows "
                         f"{', '.join(DATASETS)}")
    return names


def _canonical(
    values: Sequence[str] | None, canonical: Callable[[str], str]
) -> tuple[str, ...]:
    return tuple(dict.fromkeys(canonical(v) for v in values)) if values else ()


def _positive_ints(values: Sequence[int] | None, what: str, lowest: int) -> tuple[int, ...]:
    if not values:
        return ()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise InputError(f"{what} must be an integer ≥ {lowest}, got {value!r}")
    return tuple(dict.fromkeys(values))


class ResultStore:
    """An append-only CSV of finished runs, one flushed row per run, safe to resume.

    The file is locked while open so two experiments cannot interleave rows. A run
    killed in the middle of writing leaves at most a partial last line; it is cut off
    on reopening, so the interrupted cell simply runs again.  The header is written with
    the first row, and a file this store created but never wrote a row to is removed on
    close: an experiment that fails before any run finishes leaves nothing behind.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = not self.path.exists()
        self._file: IO[str] = self.path.open("a+", encoding="utf-8", newline="")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise InputError(f"{self.path} is in use by another experiment") from None
        self._drop_partial_line()
        self.done = {self._key(row) for row in self.rows()}

    def rows(self) -> list[dict[str, str]]:
        self._file.seek(0)
        reader = csv.DictReader(self._file)
        names = reader.fieldnames
        if names is not None and tuple(names) != COLUMNS:
            if set(KEY_COLUMNS) <= set(names):
                missing = ", ".join(c for c in COLUMNS if c not in names) or "none"
                raise InputError(f"{self.path} has the columns of another fednorm version "
                                 f"(missing: {missing}); run into a new file")
            raise InputError(f"{self.path} is not a fednorm results file (its columns differ)")
        return list(reader)

    def append(self, row: dict[str, object]) -> None:
        if self.path.stat().st_size == 0:
            self._write(dict(zip(COLUMNS, COLUMNS, strict=True)))
        self._write(row)
        self.done.add(self._key(row))

    def pending(self, cells: Iterable[Cell]) -> list[Cell]:
        return [cell for cell in cells if cell.key() not in self.done]

    def close(self) -> None:
        empty = self.path.stat().st_size == 0
        self._file.close()
        if self._created and empty:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, row: dict[str, object]) -> None:
        buffer = io.StringIO()
        csv.DictWriter(buffer, COLUMNS, lineterminator="\n").writerow(row)
        self._file.write(buffer.getvalue())  # one write per row, then straight to the OS
        self._file.flush()
        os.fsync(self._file.fileno())

    def _drop_partial_line(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            os.truncate(self.path, data.rfind(b"\n") + 1)
        self._file.seek(0, os.SEEK_END)

    @staticmethod
    def _key(row: dict) -> tuple[str, ...]:
        return tuple(str(row[column]) for column in KEY_COLUMNS)

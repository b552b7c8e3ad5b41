"""Running the grid: cells grouped into jobs, each job run in this process or in a worker.

A job is the cells of up to :attr:`~fednorm.training.grid.DatasetDefaults.partitions_per_job`
partitions of one dataset, seed and privacy (all 21 of the grid's for tabular data, whose
MLPs train as one stack: :func:`fednorm.training.runner.run_partitions`, so that the
partitions' central models, each with ten times a federation's steps a round, and their
largest clients' last batches step together; 1 for images).
Jobs are independent, so ``jobs > 1`` runs them in worker processes (spawned, one torch
thread each: the models are small, and two processes keep two cores busier than two
threads inside tiny matrix products). Only the parent writes the results file, a job's rows as
the job ends, so a stopped grid loses at most the jobs it was running.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import get_context
from typing import TextIO

import torch

from fednorm.training.grid import DATASETS, PARTITIONS_PER_JOB, Cell, ResultStore
from fednorm.training.progress import Progress
from fednorm.training.runner import (
    RunSettings,
    cached_dataset,
    partition_groups,
    run_cells,
    stacking,
)


@dataclass
class GridSummary:
    ran: int
    skipped: int
    failed: int


def run_grid(
    cells: list[Cell],
    store: ResultStore,
    settings: RunSettings,
    jobs: int = 1,
    stream: TextIO | None = None,
) -> GridSummary:
    """Run every cell not yet in ``store``, appending one row per finished run."""
    pending = store.pending(cells)
    for name in dict.fromkeys(cell.dataset for cell in pending):
        cached_dataset(name, settings.data_dir)  # a missing file fails before any training
    progress = Progress(len(pending), len(cells) - len(pending), stream or sys.stderr)
    progress.start()
    failed = 0
    for results in _results(job_groups(pending, settings), settings, jobs):
        for cell, row in results:
            store.append(row)
            failed += row["status"] != "ok"
            progress.advance(cell.label(), float(row["seconds"] or math.nan),
                             row["status"] != "ok")
    progress.close()
    return GridSummary(len(pending), len(cells) - len(pending), failed)


def job_groups(cells: list[Cell], settings: RunSettings) -> list[list[Cell]]:
    """Cells grouped into jobs (see the module doc; one partition a job when stacking is
    off), the datasets with the most rows first over all seeds (then seed after seed): a
    grid then ends on short jobs, and no worker waits long for the other's last one."""
    jobs: dict[tuple, list[list[Cell]]] = {}
    for partition in partition_groups(cells):
        first = partition[0]
        defaults = DATASETS.get(first.dataset)
        size = PARTITIONS_PER_JOB if defaults is None else defaults.partitions_per_job
        chunks = jobs.setdefault((first.dataset, first.seed, first.privacy), [[]])
        if len(chunks[-1]) == (size if stacking(settings) else 1):
            chunks.append([])
        chunks[-1].append(partition)
    seeds = list(dict.fromkeys((cell.seed, cell.privacy) for cell in cells))

    def order(key: tuple) -> tuple[int, int]:
        dataset, seed, privacy = key
        return -len(cached_dataset(dataset, settings.data_dir).X), seeds.index((seed, privacy))

    return [[cell for partition in chunk for cell in partition]
            for key in sorted(jobs, key=order) for chunk in jobs[key]]


def _results(
    groups: list[list[Cell]], settings: RunSettings, jobs: int
) -> Iterator[list[tuple[Cell, dict[str, object]]]]:
    """Each job's (cell, row) pairs as it finishes, in this process or in ``jobs``
    workers.

    Leaving early (an error, Ctrl-C, or SIGTERM turned into SystemExit by the CLI)
    terminates the workers instead of letting them finish cells nobody will record.
    """
    if jobs <= 1 or len(groups) <= 1:
        torch.set_num_threads(settings.threads)
        for cells in groups:
            yield run_cells(cells, settings)
        return
    context = get_context("spawn")
    with context.Pool(jobs, initializer=torch.set_num_threads, initargs=(settings.threads,),
                      maxtasksperchild=None) as pool:
        yield from pool.imap_unordered(_run_cells_job, [(c, settings) for c in groups])


def _run_cells_job(job: tuple[list[Cell], RunSettings]) -> list[tuple[Cell, dict[str, object]]]:
    cells, settings = job
    return run_cells(cells, settings)

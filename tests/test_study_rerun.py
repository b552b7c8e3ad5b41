"""A run's rows do not depend on how the grid ran it: a partition trained alone in this
process, in one stack with another partition of its dataset and seed, or in a
``--jobs 2`` worker gives the same scores, rounds and losses to the last digit (dropout
and a central model included: Parkinson's network has both). (Across kinds of CPU they do not:
results/README.md, "Re-runs", measures it on stored rows.)"""

from __future__ import annotations

import pytest
from study_files import read_rows

from fednorm.cli import main
from fednorm.training.grid import KEY_COLUMNS

# The stored columns a re-run must reproduce (times and byte counts aside).
REPRODUCED = ("status", "test_accuracy", "test_f1", "test_macro_f1", "test_precision",
              "test_recall", "test_predicted_classes", "test_mae", "test_r2", "test_loss",
              "best_val_loss", "rounds", "best_round", "max_rounds")
GRID = ["--datasets", "bcw,parkinsons", "--skews", "label:5", "--clients", "3,4",
        "--seeds", "2",
        "--normalizations", "none,local_robust,federated_zscore,batch_norm,central_model",
        "--min-rounds", "0", "--max-rounds", "12"]


def test_a_partition_gives_the_same_rows_alone_stacked_with_another_and_in_a_worker(tmp_path):
    pytest.importorskip("torch")
    runs = {}
    for name, flags in (("alone", ["--clients", "4"]), ("stacked", ["--jobs", "1"]),
                        ("in a worker", ["--jobs", "2"])):
        out = tmp_path / f"{name}.csv"
        assert main(["experiment", *GRID, *flags, "--out", str(out)]) == 0
        runs[name] = {tuple(row[c] for c in KEY_COLUMNS): row for row in read_rows(out)
                      if row["clients"] == "4"}
    alone = runs.pop("alone")
    assert len(alone) == 10 and all(row["status"] == "ok" for row in alone.values())
    for name, rows in runs.items():
        assert rows.keys() == alone.keys()
        for key, row in rows.items():
            differ = [c for c in REPRODUCED if row[c] != alone[key][c]]
            assert not differ, (name, key, differ)

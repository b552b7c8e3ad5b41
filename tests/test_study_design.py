"""Tests of what makes the study's readings sound: test labels read only after training,
every patient's recordings on one side, macro-F1, and the majority-class and lookup
references beside every score."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fednorm.sim.datasets import Dataset, load_dataset  # noqa: E402
from fednorm.training.baselines import lookup_scores, majority_scores  # noqa: E402
from fednorm.training.data import (  # noqa: E402
    ClientData,
    HeldOutLabels,
    group_sides,
    make_clients,
    merge_test,
)
from fednorm.training.grid import TABULAR_SKEWS, Cell  # noqa: E402
from fednorm.training.metrics import classification_metrics  # noqa: E402
from fednorm.training.runner import RunSettings, run_cells, run_partition  # noqa: E402


@pytest.fixture(scope="module")
def bcw() -> Dataset:
    return load_dataset("bcw")


# --- test labels are read once per run, after its training -------------------------------


class LabelWatch:
    """Records the runs whose training ended (the runner's ``on_trained`` hook) and the
    reads of test labels; a read beyond the runs trained so far raises: each run may
    read once, after its own training."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def trained(self, cells: list[Cell]) -> None:
        self.events += ["trained"] * len(cells)

    def read(self) -> None:
        if self.events.count("read") >= self.events.count("trained"):
            raise AssertionError("test labels read before the reading run's training ended")
        self.events.append("read")


def watched(clients: list[ClientData], watch: LabelWatch) -> list[ClientData]:
    """The clients with the first client's test labels watched (one read per run)."""
    first = replace(clients[0], y_test=clients[0].y_test.traced(watch.read))
    return [first, *clients[1:]]


@pytest.mark.parametrize("dataset_name", ["bcw", "regression"])
def test_a_run_reads_test_labels_once_and_only_after_its_training(bcw, dataset_name):
    dataset = bcw if dataset_name == "bcw" else Dataset(
        "r", bcw.X[:, 1:], bcw.X[:, 0] * 10 + 30, bcw.feature_names[1:], "radius",
        "regression")
    norms = ["none", "local_zscore", "federated_minmax", "batch_norm", "central_model",
             "central_linear", "central_majority"]
    cells = [Cell(dataset.name, "iid", 4, n, 0) for n in norms]
    watch = LabelWatch()
    clients = watched(make_clients(dataset, 4, "iid", seed=0), watch)
    rows = run_partition(dataset, clients, cells, RunSettings(max_rounds=3), watch.trained)
    assert all(row["status"] == "ok" for _, row in rows)
    assert watch.events.count("read") == len(norms)  # scored once per run
    # Every read follows the training of its own run: the trained groups come first
    # (the four MLPs as one stack, central_model alone), then each group's reads.
    assert watch.events[:4] == ["trained"] * 4
    assert watch.events.index("read") > 0


def test_the_watch_catches_a_read_before_training_and_a_second_read():
    """The watch is not vacuous: a read before any training ended, or a second read
    after one run's training, raises."""
    watch = LabelWatch()
    labels = HeldOutLabels((np.array([0, 1]),)).traced(watch.read)
    with pytest.raises(AssertionError, match="before the reading run's training ended"):
        labels.read()
    watch.trained([Cell("bcw", "iid", 2, "none", 0)])
    np.testing.assert_array_equal(labels.read(), [0, 1])
    with pytest.raises(AssertionError, match="before the reading run's training ended"):
        labels.read()


def test_pooled_and_merged_test_labels_stay_unread_until_scoring(bcw):
    reads = []
    clients = [replace(c, y_test=c.y_test.traced(lambda: reads.append(1)))
               for c in make_clients(bcw, 3, "iid", seed=0)]
    pooled = HeldOutLabels.pool([c.y_test for c in clients])
    assert reads == [] and len(pooled) == sum(len(c.y_test) for c in clients)
    merged = merge_test(clients)
    assert len(reads) == 3 and len(merged.y) == len(pooled)


# --- Parkinson's split by patient ----------------------------------------------------------


def with_group_column(dataset: Dataset, groups: np.ndarray) -> Dataset:
    """``dataset`` with each row's group as one more (categorical, so noise-free)
    feature, so the split's sides can be read off the rows."""
    column = dataset.X.shape[1]
    return replace(dataset, X=np.column_stack([dataset.X, groups]),
                   categorical=(*dataset.categorical, column))


def sides(clients: list[ClientData]) -> tuple[set, set, set]:
    """The groups on the training, validation and test side."""
    def groups(part: str) -> set:
        return {float(g) for c in clients for g in getattr(c, part)[:, -1]}
    return groups("X_train"), groups("X_val"), groups("X_test")


@pytest.mark.parametrize("skew", TABULAR_SKEWS)
@pytest.mark.parametrize("clients", [10, 30])
def test_no_patient_is_on_two_sides_of_the_split(skew, clients):
    patients = load_dataset("parkinsons_patients")
    dataset = with_group_column(patients, patients.groups)
    parts = make_clients(dataset, clients, skew, seed=1)
    train, val, test = sides(parts)
    assert not (train & val or train & test or val & test)
    assert len(train | val | test) == 42
    test_groups, val_groups = group_sides(dataset.groups, seed=1)
    assert test == set(test_groups.tolist()) and val == set(val_groups.tolist())
    assert sum(len(c.y_train) + len(c.y_val) + len(c.y_test) for c in parts) == 5875
    assert min(len(c.y_train) for c in parts) >= 10


def test_the_paper_reading_splits_rows_so_patients_are_on_both_sides():
    groups = load_dataset("parkinsons_patients").groups
    rows = with_group_column(load_dataset("parkinsons"), groups)
    train, _, test = sides(make_clients(rows, 10, "iid", seed=1))
    assert len(train & test) == 42  # every patient on both sides


def test_patient_sides_change_with_the_seed():
    groups = load_dataset("parkinsons_patients").groups
    assert set(group_sides(groups, 0)[0]) != set(group_sides(groups, 1)[0])
    assert len(group_sides(groups, 0)[0]) == round(0.2 * 42)


# --- metrics and references ---------------------------------------------------------------


def test_macro_f1_does_not_reward_the_majority_predictor():
    y = np.array([0] * 87 + [1, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4])
    majority = classification_metrics(y, np.eye(5)[np.zeros(len(y), dtype=int)])
    from sklearn.metrics import f1_score

    assert majority["test_f1"] == pytest.approx(f1_score(y, 0 * y, average="weighted"))
    assert majority["test_f1"] > 0.8
    assert majority["test_macro_f1"] == pytest.approx(f1_score(y, 0 * y, average="macro"))
    assert majority["test_macro_f1"] < 0.2


def test_the_majority_reference_predicts_the_training_majority_for_every_test_row(bcw):
    from sklearn.metrics import f1_score

    cells = [Cell("bcw", "label:0.5", 5, "central_majority", 2)]
    ((_, row),) = run_cells(cells, RunSettings())
    clients = make_clients(bcw, 5, "label:0.5", seed=2)
    majority = np.bincount(np.concatenate([c.y_train for c in clients])).argmax()
    test = merge_test(clients).y
    assert row["status"] == "ok" and row["test_predicted_classes"] == 1
    assert row["test_f1"] == pytest.approx(f1_score(test, np.full(len(test), majority)))
    assert row["test_macro_f1"] == pytest.approx(
        f1_score(test, np.full(len(test), majority), average="macro"))


def pooled_client(X_train: list, y_train: list, X_test: list, y_test: list) -> ClientData:
    """A pooled client with no validation rows (the fitted references use none)."""
    empty = np.empty((0, len(X_train[0])))
    return ClientData(np.asarray(X_train, float), np.asarray(y_train, float), empty,
                      np.empty(0), np.asarray(X_test, float),
                      HeldOutLabels((np.asarray(y_test, float),)))


def test_the_lookup_reference_predicts_the_training_mean_of_each_age_and_sex():
    dataset = Dataset("people", np.zeros((1, 3)), np.zeros(1), ["age", "sex", "voice"],
                      "score", "regression", lookup_columns=(0, 1))
    # (60, 0) -> mean 10, (70, 1) -> mean 30; an unseen (80, 0) gets the overall 20.
    train_X = [[60, 0, 1.0], [60, 0, 2.0], [70, 1, 3.0], [70, 1, 4.0]]
    train_y = [8, 12, 28, 32]
    test_X = [[60, 0, 9.0], [70, 1, 9.0], [80, 0, 9.0]]
    test_y = [10, 30, 20]
    scores = lookup_scores(dataset, pooled_client(train_X, train_y, test_X, test_y), None)
    assert scores["test_r2"] == pytest.approx(1.0) and scores["test_mae"] == pytest.approx(0)
    worse = lookup_scores(dataset, pooled_client(train_X, train_y, test_X, [12, 30, 20]),
                          None)
    assert worse["test_mae"] == pytest.approx(2 / 3)


def test_the_majority_reference_of_a_regression_is_the_training_mean():
    dataset = Dataset("people", np.zeros((1, 1)), np.zeros(1), ["x"], "score", "regression")
    scores = majority_scores(dataset, pooled_client([[0], [1]], [1.0, 3.0], [[5], [6]],
                                                    [2.0, 4.0]), None)
    assert scores["test_mae"] == pytest.approx(1.0) and scores["test_r2"] == pytest.approx(-1)


def test_a_dataset_without_lookup_columns_records_the_lookup_reference_as_failed():
    ((_, row),) = run_cells([Cell("bcw", "iid", 3, "central_lookup", 0)], RunSettings())
    assert row["status"] == "error" and "lookup columns" in row["error"]


def test_on_parkinsons_rows_the_lookup_names_the_patient_and_by_patient_it_cannot():
    """The issue's finding, as a check of the split: the (age, sex) mean scores high
    where patients are on both sides, and no better than the mean where they are not."""
    scores = {}
    for name in ("parkinsons", "parkinsons_patients"):
        ((_, row),) = run_cells([Cell(name, "iid", 10, "central_lookup", 0)], RunSettings())
        scores[name] = float(row["test_r2"])
    assert scores["parkinsons"] > 0.7
    assert scores["parkinsons_patients"] < 0.2


# --- tuning without the test rows ----------------------------------------------------------


def never_read() -> None:
    raise AssertionError("a tuning run read the test labels")


def test_tuning_rows_come_from_the_training_rows_and_the_test_labels_are_never_read(bcw):
    from fednorm.training.tuning import tuning_clients

    clients = [replace(c, y_test=c.y_test.traced(never_read))
               for c in make_clients(bcw, 4, "label:5", seed=2)]
    views = tuning_clients(clients, seed=2)
    for client, view in zip(clients, views, strict=True):
        train_rows = {tuple(row) for row in client.X_train}
        assert {tuple(row) for row in view.X_test} <= train_rows
        assert {tuple(row) for row in view.X_train} <= train_rows
        assert len(view.y_train) + len(view.y_test) == len(client.y_train)
        assert len(view.y_test) == round(0.2 * len(client.y_train))
        np.testing.assert_array_equal(view.X_val, client.X_val)
    cells = [Cell("bcw", "label:5", 4, n, 2) for n in ("local_zscore", "federated_zscore",
                                                        "central_majority")]
    rows = run_partition(bcw, views, cells, RunSettings(max_rounds=2))
    assert all(row["status"] == "ok" for _, row in rows)


def test_tuning_by_group_keeps_each_patients_training_rows_on_one_side():
    from fednorm.training.tuning import tuning_clients

    patients = load_dataset("parkinsons_patients")
    clients = make_clients(with_group_column(patients, patients.groups), 10, "iid", seed=0)
    views = tuning_clients(clients, seed=0)
    train, _, test = sides(views)
    assert train and test and not train & test
    assert train | test == sides(clients)[0]  # the training side, split in two
    assert len(test) == round(0.2 * len(train | test))


def write_tuning_file(path, scores: dict[str, float], task: str = "classification",
                      predicted_classes: dict[str, int] | None = None) -> None:
    """One run per normalization with its main score (and, for classification, how many
    classes its predictions held: two unless ``predicted_classes`` says)."""
    from fednorm.training.grid import COLUMNS, KEY_COLUMNS, ResultStore

    metric = "test_macro_f1" if task == "classification" else "test_r2"
    with ResultStore(path) as store:
        for normalization, value in scores.items():
            row = dict.fromkeys(COLUMNS, "")
            row.update(zip(KEY_COLUMNS, Cell("hcv", "iid", 10, normalization, 0).key(),
                           strict=True))
            row.update({"task": task, "status": "ok", metric: value, "test_f1": 0.9})
            if task == "classification":
                row["test_predicted_classes"] = (predicted_classes or {}).get(normalization, 2)
            store.append(row)


def test_negative_r2_still_ranks_candidates_and_a_diverged_run_counts_as_minus_one(
        tmp_path):
    from fednorm.training.tuning import tuning_scores

    files = {name: tmp_path / f"{name}.csv" for name in ("worse", "better", "diverged")}
    write_tuning_file(files["worse"], {"federated_zscore": -0.5, "local_zscore": -0.7},
                      "regression")
    write_tuning_file(files["better"], {"federated_zscore": -0.3, "local_zscore": -0.4},
                      "regression")
    write_tuning_file(files["diverged"], {"federated_zscore": 0.2, "local_zscore": -1e7},
                      "regression")
    ranking = tuning_scores(files)
    assert [s.candidate for s in ranking] == ["better", "diverged", "worse"]
    assert ranking[1].score == pytest.approx((0.2 - 1.0) / 2)


def test_the_best_candidate_has_the_highest_mean_main_score_of_all_its_runs(tmp_path):
    """The references count: a setting under which the run without normalization
    collapses into one class loses to one whose federated and local runs score a little
    lower (ranked on those alone, it had won), and the ranking says how many runs
    predicted a single class."""
    from fednorm.training.tuning import best_candidate, candidates, tuning_scores

    assert candidates(select=["f1", "macro_f1"])[1].overrides() == {"select": "macro_f1"}
    choices = candidates(lr=[1e-3, 1e-2], min_rounds=[0, 300])
    assert [c.name for c in choices] == ["lr=0.001_min_rounds=0", "lr=0.001_min_rounds=300",
                                         "lr=0.01_min_rounds=0", "lr=0.01_min_rounds=300"]
    assert candidates()[0].name == "defaults"
    files = {"steep": tmp_path / "steep.csv", "steady": tmp_path / "steady.csv"}
    write_tuning_file(files["steep"], {"federated_zscore": 0.62, "local_zscore": 0.6,
                                       "none": 0.39}, predicted_classes={"none": 1})
    write_tuning_file(files["steady"], {"federated_zscore": 0.6, "local_zscore": 0.58,
                                        "none": 0.55})
    assert best_candidate(files).candidate == "steady"
    ranking = tuning_scores(files)
    assert [(s.candidate, s.runs, s.single_class) for s in ranking] == [
        ("steady", 3, 0), ("steep", 3, 1)]
    assert ranking[1].score == pytest.approx((0.62 + 0.6 + 0.39) / 3)


def test_fednorm_tune_runs_each_candidate_on_the_tuning_view_and_ranks_them(tmp_path, capsys):
    from fednorm.cli import main

    out = tmp_path / "tuning"
    flags = ["--datasets", "bcw", "--skews", "iid", "--clients", "3", "--seeds", "0",
             "--normalizations", "local_zscore,federated_zscore", "--max-rounds", "3",
             "--lr", "1e-3,1e-2", "--out-dir", str(out)]
    assert main(["tune", *flags]) == 0
    assert sorted(p.name for p in (out / "bcw").iterdir()) == [
        "lr=0.001.csv", "lr=0.01.csv", "ranking.csv"]
    ranking = (out / "bcw" / "ranking.csv").read_text().splitlines()
    assert ranking[0] == "candidate,tuning_score,runs,single_class" and len(ranking) == 3
    assert "bcw: lr=" in capsys.readouterr().out
    assert main(["tune", *flags[:-4], "--lr", "2", "--out-dir", str(out)]) == 2
    assert main(["tune", *flags, "--select", "accuracy"]) == 2

"""The training stack's scores: metrics, class weights, selection and stopping rules,
regression targets in their own units, and the central references."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fednorm.sim.datasets import Dataset  # noqa: E402
from fednorm.training.data import (  # noqa: E402
    make_clients,
    merge_test,
)
from fednorm.training.fedavg import (  # noqa: E402
    TrainConfig,
    clone_state,
    predict,
)
from fednorm.training.metrics import classification_metrics, regression_metrics  # noqa: E402
from fednorm.training.models import (  # noqa: E402
    MLPSpec,
    build_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- metrics -----------------------------------------------------------------------------


def test_metrics_are_binary_for_two_classes_and_weighted_otherwise():
    y = np.array([0, 1, 1, 0])
    binary = classification_metrics(y, np.array([[1, 0], [0, 1], [1, 0], [1, 0]]))
    assert binary["test_accuracy"] == 0.75 and binary["test_precision"] == 1.0
    assert binary["test_recall"] == 0.5 and binary["test_f1"] == pytest.approx(2 / 3)
    multi = classification_metrics(np.array([0, 1, 2, 2]), np.eye(3)[[0, 1, 2, 0]])
    assert multi["test_f1"] == pytest.approx((2 / 3 + 1 + 2 * 2 / 3) / 4)
    assert regression_metrics(np.array([1.0, 2.0]), np.array([1.0, 3.0]))["test_mae"] == 0.5
    assert math.isnan(regression_metrics(np.array([1.0, 2.0]), np.array([np.inf, 1]))["test_r2"])


# --- losses, selection, targets and references -------------------------------------------


def test_class_weighted_cross_entropy_is_torchs_weighted_loss_per_row():
    from fednorm.training.fedavg import task_loss

    torch.manual_seed(3)
    output, target = torch.randn(9, 3), torch.tensor([0, 1, 2, 2, 1, 0, 0, 0, 1])
    weights = (0.5, 3.0, 1.25)
    expected = torch.nn.functional.cross_entropy(output, target, torch.tensor(weights),
                                                 reduction="none")
    got = task_loss(output, target, "classification", TrainConfig(class_weights=weights))
    torch.testing.assert_close(got, expected)
    plain = task_loss(output, target, "classification", TrainConfig())
    torch.testing.assert_close(plain, torch.nn.functional.cross_entropy(
        output, target, reduction="none"))


def test_class_weights_are_sklearns_balanced_weights_from_the_summed_client_counts(bcw):
    from sklearn.utils.class_weight import compute_class_weight

    from fednorm.training.tensors import class_weights

    clients = make_clients(bcw, 5, "label:0.5", seed=2)
    pooled = np.concatenate([c.y_train for c in clients])
    expected = compute_class_weight("balanced", classes=np.array([0, 1]), y=pooled)
    np.testing.assert_allclose(class_weights(clients, 2), expected)


@pytest.mark.parametrize(("select", "kept_round"), [("loss", 1), ("f1", 2)])
def test_selection_keeps_the_best_round_while_the_loss_decides_when_to_stop(select,
                                                                          kept_round):
    """Round 1 has the lowest validation loss, round 2 the best F1 (round 4 ties it,
    later): loss selection keeps round 1, F1 selection round 2; both stop after three
    rounds without a lower loss."""
    from fednorm.training.fedavg import EarlyStopping

    config = TrainConfig(patience=3, select=select)
    stopping = EarlyStopping({"w": torch.zeros(1)}, config)
    history = [(0.5, 0.4), (0.6, 0.9), (0.7, 0.8), (0.55, 0.9)]
    for round_index, (loss, score) in enumerate(history):
        assert not stopping.stopped
        stopping.record(round_index, {"w": torch.full((1,), float(round_index + 1))}, 0.0,
                        loss, score if select == "f1" else None)
    assert stopping.stopped and stopping.outcome.rounds == 4
    assert stopping.outcome.best_round == kept_round
    assert float(stopping.outcome.state["w"]) == kept_round
    assert stopping.outcome.best_val_loss == 0.5


@pytest.mark.parametrize(("min_rounds", "stopped_after"), [(0, 4), (4, 4), (9, 9)])
def test_early_stopping_does_not_end_a_run_before_min_rounds(min_rounds, stopped_after):
    """The validation loss is lowest at round 1 and the F1 best at round 7: patience 3
    alone stops after round 4 and keeps round 1; a minimum of 9 rounds trains on to
    round 9 and keeps round 7 (the loss still decides when to stop, selection is by F1)."""
    from fednorm.training.fedavg import EarlyStopping

    config = TrainConfig(patience=3, min_rounds=min_rounds, select="f1")
    stopping = EarlyStopping({"w": torch.zeros(1)}, config)
    scores = [0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.9, 0.7, 0.7, 0.7]
    for round_index, score in enumerate(scores):
        if stopping.stopped:
            break
        loss = 0.4 if round_index == 0 else 0.5 + round_index / 100
        stopping.record(round_index, {"w": torch.full((1,), float(round_index + 1))}, 0.0,
                        loss, score)
    assert stopping.stopped and stopping.outcome.rounds == stopped_after
    assert stopping.outcome.best_round == (7 if stopped_after == 9 else 1)


def test_validation_f1_is_sklearns_and_only_computed_when_selecting_by_it():
    from sklearn.metrics import f1_score

    from fednorm.training.fedavg import validate

    torch.manual_seed(1)
    model = build_model(MLPSpec(hidden=(4,)), 3, 3)
    X, y = torch.randn(30, 3), torch.randint(0, 3, (30,))
    state = clone_state(model.state_dict())
    loss, score = validate(model, state, (X, y), "classification", TrainConfig(select="f1"))
    predicted = predict(model, state, X).argmax(1).numpy()
    assert score == pytest.approx(f1_score(y.numpy(), predicted, average="weighted",
                                           labels=[0, 1, 2], zero_division=0))
    assert validate(model, state, (X, y), "classification", TrainConfig())[1] is None
    assert validate(model, state, (X, y), "classification", TrainConfig())[0] == loss
    _, macro = validate(model, state, (X, y), "classification", TrainConfig(select="macro_f1"))
    assert macro == pytest.approx(f1_score(y.numpy(), predicted, average="macro",
                                           zero_division=0))
    assert macro != pytest.approx(score)  # the two criteria differ on these rows


def test_regression_targets_are_standardized_by_the_federated_z_score(bcw):
    from fednorm.training.tensors import standardize_targets

    regression = Dataset("r", bcw.X[:, 1:], bcw.X[:, 0] * 10 + 30, bcw.feature_names[1:],
                         "radius", "regression")
    clients = make_clients(regression, 6, "label:0.5", seed=1)
    scaled, scale = standardize_targets(clients)
    pooled = np.concatenate([c.y_train for c in clients])
    assert scale.mean == pytest.approx(pooled.mean()) and scale.sd == pytest.approx(pooled.std())
    for before, after in zip(clients, scaled, strict=True):
        np.testing.assert_allclose(after.y_train, (before.y_train - pooled.mean())
                                   / pooled.std())
        assert after.y_test is before.y_test  # unread until scoring, in the target's units
        np.testing.assert_allclose(scale.invert(after.y_val), before.y_val)
        np.testing.assert_array_equal(after.X_train, before.X_train)


def test_a_regression_run_reports_its_scores_in_the_targets_own_units(bcw):
    """The same run on targets in two units (radius, and radius · 10 + 30): training sees
    the same federated z-scored targets, so R² is the same and the MAE is 10 times
    larger in the larger units — scored in standardized units, both would be equal."""
    from fednorm.training.data import make_clients
    from fednorm.training.runner import Cell, RunSettings, run_partition

    rows = {}
    for factor in (1.0, 10.0):
        dataset = Dataset("r", bcw.X[:, 1:], bcw.X[:, 0] * factor + 30 * factor,
                          bcw.feature_names[1:], "radius", "regression")
        ((_, row),) = run_partition(dataset, make_clients(dataset, 4, "iid", seed=0),
                                    [Cell("r", "iid", 4, "federated_zscore", 0)],
                                    RunSettings(max_rounds=3))
        assert row["status"] == "ok", row
        rows[factor] = row
    assert rows[10.0]["test_r2"] == pytest.approx(rows[1.0]["test_r2"], abs=1e-4)
    assert rows[10.0]["test_mae"] == pytest.approx(10 * rows[1.0]["test_mae"], rel=1e-4)


def test_central_references_train_and_fit_on_the_pooled_rows_of_the_same_split(bcw):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.preprocessing import StandardScaler

    from fednorm.training.runner import Cell, RunSettings, run_cells

    cells = [Cell("bcw", "label:0.5", 5, n, 0)
             for n in ("federated_zscore", "central_model", "central_linear")]
    rows = {c.normalization: r for c, r in run_cells(cells, RunSettings(max_rounds=4))}
    assert all(r["status"] == "ok" for r in rows.values())
    clients = make_clients(bcw, 5, "label:0.5", seed=0)
    X_train = np.concatenate([c.X_train for c in clients])
    y_train = np.concatenate([c.y_train for c in clients])
    test = merge_test(clients)
    scaler = StandardScaler().fit(X_train)
    oracle = LogisticRegression(max_iter=2000).fit(scaler.transform(X_train), y_train)
    expected = f1_score(test.y, oracle.predict(scaler.transform(test.X)))
    assert rows["central_linear"]["test_f1"] == pytest.approx(expected)
    assert rows["central_model"]["rounds"] == rows["federated_zscore"]["rounds"] == 4
    assert rows["central_model"]["test_f1"] != rows["federated_zscore"]["test_f1"]


def test_metrics_count_the_classes_the_predictions_use():
    constant = classification_metrics(np.array([0, 1, 2]), np.eye(3)[[1, 1, 1]])
    assert constant["test_predicted_classes"] == 1
    assert classification_metrics(np.array([0, 1]), np.eye(2))["test_predicted_classes"] == 2

"""Tests of the training stack: splits, normalization modes, models, FedAvg and metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from fednorm.engine.errors import InputError  # noqa: E402
from fednorm.protocols import METHODS, FitOptions  # noqa: E402
from fednorm.sim.datasets import Dataset, load_dataset  # noqa: E402
from fednorm.sim.partition import Partition  # noqa: E402
from fednorm.training import mlp_step  # noqa: E402
from fednorm.training.data import (  # noqa: E402
    make_clients,
    merge_test,
    merge_val,
    min_client_rows,
    split_client,
    split_sizes,
)
from fednorm.training.fedavg import (  # noqa: E402
    ClientTensors,
    TrainConfig,
    clone_state,
    predict,
    train_federated,
    train_stacked,
)
from fednorm.training.metrics import classification_metrics, regression_metrics  # noqa: E402
from fednorm.training.models import (  # noqa: E402
    MODEL_SPECS,
    CNNSpec,
    MLPSpec,
    build_model,
)
from fednorm.training.normalization import (  # noqa: E402
    PAPER_NORMALIZATIONS,
    NormalizationSpec,
    normalize_clients,
    study_bound,
)
from fednorm.training.rounds import BatchedRound, SequentialRound, StackedRound  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: a second torch thread only adds synchronization (and on a busy
    machine, waits of milliseconds per operation)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bcw():
    return load_dataset("bcw")


# --- splits ----------------------------------------------------------------------------


def test_clients_split_their_own_rows_20_percent_test_then_20_percent_validation(bcw):
    clients = make_clients(bcw, 4, "iid", seed=3)
    total = sum(len(c.y_train) + len(c.y_val) + len(c.y_test) for c in clients)
    assert total == 569
    for client in clients:
        n = len(client.y_train) + len(client.y_val) + len(client.y_test)
        assert len(client.y_test) == round(0.2 * n)
        assert len(client.y_val) == round(0.2 * (n - len(client.y_test)))
    val, test = merge_val(clients), merge_test(clients)
    assert len(val.y) == sum(len(c.y_val) for c in clients) and test.X.shape[1] == 30
    assert len(test.y) == sum(len(c.y_test) for c in clients)
    again = make_clients(bcw, 4, "iid", seed=3)
    np.testing.assert_array_equal(again[2].X_test, clients[2].X_test)  # a seed names a split


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=2, max_size=5), seed=st.integers(0, 99))
def test_every_split_part_holds_each_class_in_the_clients_proportions(sizes, seed):
    """Stratified: each class's rows in the test (and validation) part are its share of
    the part, up to one row."""
    y = np.repeat(np.arange(len(sizes)), sizes)
    if len(y) < 2:
        return
    part = Partition(np.arange(len(y), dtype=float)[:, None], y, np.arange(len(y)))
    client = split_client(part, np.random.default_rng(seed))
    n_test, n_val, n_train = split_sizes(len(y))
    assert (len(client.y_test), len(client.y_val), len(client.y_train)) == (n_test, n_val,
                                                                             n_train)
    rows = np.concatenate([client.X_train, client.X_val, client.X_test])[:, 0]
    assert sorted(rows.tolist()) == list(range(len(y)))  # every row exactly once
    y_test = client.y_test.read()
    for label, count in enumerate(sizes):
        assert abs(np.sum(y_test == label) - count * n_test / len(y)) < 1 + 1e-9
        rest = count - np.sum(y_test == label)
        assert abs(np.sum(client.y_val == label) - rest * n_val / (len(y) - n_test)) < 2


def test_every_client_keeps_ten_training_rows_or_the_request_is_refused(bcw):
    assert split_sizes(min_client_rows())[2] >= 10 > split_sizes(min_client_rows() - 1)[2]
    for skew in ("quantity:0.7", "label:0.5"):
        clients = make_clients(bcw, 30, skew, seed=1)
        assert min(len(c.y_train) for c in clients) >= 10
    with pytest.raises(InputError, match="10 training rows"):
        make_clients(bcw, 40, "iid", seed=0)


def test_feature_noise_is_in_feature_sd_units_and_spares_categorical_columns():
    hcv_like = Dataset("t", np.column_stack([np.arange(600.0) * 1000,  # sd ≈ 1.7e5
                                             np.arange(600) % 2,  # categorical
                                             np.arange(600.0) * 1e-4]),
                       np.arange(600) % 3, ["big", "sex", "tiny"], "y", "classification",
                       categorical=(1,))
    clean = make_clients(hcv_like, 4, "iid", seed=0)
    noisy = make_clients(hcv_like, 4, "feature:0.8", seed=0)
    spread = hcv_like.X.std(axis=0)
    for number, (a, b) in enumerate(zip(clean, noisy, strict=True), start=1):
        noise = (np.concatenate([b.X_train, b.X_val, b.X_test])
                 - np.concatenate([a.X_train, a.X_val, a.X_test]))
        np.testing.assert_array_equal(noise[:, 1], 0.0)
        relative = noise[:, [0, 2]].std(axis=0) / (spread[[0, 2]] * 0.8 * number / 4)
        np.testing.assert_allclose(relative, 1.0, atol=0.25)


def test_feature_noise_reaches_test_rows_too(bcw):
    clean = make_clients(bcw, 4, "iid", seed=0)
    noisy = make_clients(bcw, 4, "feature:0.7", seed=0)
    assert not np.allclose(clean[3].X_test, noisy[3].X_test)


# --- normalization modes -----------------------------------------------------------------


def test_normalization_names_parse_and_print_back():
    assert len(PAPER_NORMALIZATIONS) == 13
    for name in [*PAPER_NORMALIZATIONS, "pooled_robust"]:
        assert str(NormalizationSpec.parse(name)) == name
    assert NormalizationSpec.parse("Layer_Norm").activation == "layer"
    assert NormalizationSpec.parse("federated_minmax").activation == "none"
    for bad in ("local", "federated_boxcox", "batchnorm", "", "pooled_"):
        with pytest.raises(InputError, match="unknown normalization"):
            NormalizationSpec.parse(bad)


@pytest.mark.parametrize("method", METHODS)
def test_federated_parameters_equal_the_pooled_fit(bcw, method):
    clients = make_clients(bcw, 4, "label:0.5", seed=1)
    federated = normalize_clients(clients, NormalizationSpec("federated", method))
    pooled = normalize_clients(clients, NormalizationSpec("pooled", method))
    assert federated.rounds > 0 and federated.bytes > 0 and pooled.rounds == 0
    tolerance = {"zscore": 1e-9, "minmax": 0.0, "robust": 1e-6, "yeojohnson": 1e-4}[method]
    for name, values in pooled.normalizer.params().items():
        np.testing.assert_allclose(federated.normalizer.params()[name], values,
                                   rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(federated.clients[2].X_test, pooled.clients[2].X_test,
                               rtol=1e-3, atol=1e-3)


def test_local_normalization_differs_from_federated_under_feature_skew(bcw):
    clients = make_clients(bcw, 4, "feature:0.7", seed=0)
    local = normalize_clients(clients, NormalizationSpec.parse("local_zscore")).clients
    federated = normalize_clients(clients, NormalizationSpec.parse("federated_zscore")).clients
    for client in local:  # every client centred on its own mean ...
        np.testing.assert_allclose(client.X_train.mean(axis=0), 0, atol=1e-9)
    pooled_train = np.concatenate([c.X_train for c in federated])  # ... or on the pooled one
    np.testing.assert_allclose(pooled_train.mean(axis=0), 0, atol=1e-9)
    assert np.abs(federated[3].X_train.mean(axis=0)).max() > 0.05
    assert not np.allclose(local[3].X_test, federated[3].X_test, atol=1e-3)


@pytest.mark.parametrize("method", METHODS)
def test_federated_normalization_under_mhe_equals_the_pooled_fit(bcw, method):
    """The study's ``--privacy mhe`` runs the encrypted protocols (test preset), with the
    derived V_abs where the method needs one, and lands on the pooled fit."""
    clients = make_clients(bcw, 3, "quantity:0.7", seed=4)
    options = FitOptions(preset="test", relative_epsilon=1e-7)
    spec = NormalizationSpec("federated", method)
    encrypted = normalize_clients(clients, spec, "mhe", options)
    plain = normalize_clients(clients, spec, "plain", options)
    pooled = normalize_clients(clients, NormalizationSpec("pooled", method)).clients
    assert encrypted.bytes > 10 * plain.bytes  # ciphertexts crossed the wire, not plain sums
    for mine, oracle in zip(encrypted.clients, pooled, strict=True):
        np.testing.assert_allclose(mine.X_test, oracle.X_test, rtol=1e-3, atol=1e-3)


def test_the_study_bound_is_the_power_of_two_above_every_clients_largest_value():
    clients = make_clients(load_dataset("bcw"), 4, "label:0.5", seed=0)
    largest = np.max([np.abs(c.X_train).max(axis=0) for c in clients], axis=0)
    bound = np.array(study_bound(clients))
    assert np.all(bound >= largest) and np.all(bound < 2 * largest)
    np.testing.assert_array_equal(np.log2(bound), np.round(np.log2(bound)))


def test_data_is_untouched_without_data_normalization(bcw):
    clients = make_clients(bcw, 3, "iid", seed=0)
    for name in ("none", "batch_norm"):
        result = normalize_clients(clients, NormalizationSpec.parse(name))
        assert result.clients[1].X_val is clients[1].X_val


# --- models ----------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["none", "batch", "layer", "group", "instance"])
@pytest.mark.parametrize(("dataset", "features", "image"),
                         [("bcw", 30, None), ("parkinsons", 19, None),
                          ("digits", 64, (1, 8, 8)), ("cifar10", 3072, (3, 32, 32))])
def test_every_model_runs_with_every_activation_norm(dataset, features, image, norm):
    model = build_model(MODEL_SPECS[dataset], features, 3, norm, image)
    output, stats = model(torch.randn(5, features))
    assert output.shape == (5, 3)
    assert len(stats) == (0 if norm != "batch" else len(model.running_stat_names()))
    model.eval()
    assert model(torch.randn(2, features))[0].shape == (2, 3)


def test_a_cnn_rejects_images_too_small_for_it():
    with pytest.raises(InputError, match="too small"):
        build_model(MODEL_SPECS["mnist"], 64, 10, "none", (1, 8, 8))


# --- FedAvg: batched == one client at a time ---------------------------------------------


def tiny_run(round_type: type, spec, norm: str, persist: bool, task: str, image=None) -> tuple:
    """Three rounds over four clients of unequal sizes (one smaller than a batch), float64."""
    rng = np.random.default_rng(0)
    sizes = [7, 3, 12, 2]
    features = 16 if image is None else math.prod(image)
    X = torch.tensor(rng.normal(size=(sum(sizes), features)))
    y = (torch.tensor(rng.integers(0, 3, sum(sizes))) if task == "classification"
         else torch.tensor(rng.normal(size=sum(sizes))))
    data = ClientTensors(X, y, sizes)
    config = TrainConfig(batch_size=4, persist_optimizer=persist, seed=5)
    torch.manual_seed(0)
    model = build_model(spec, features, 3 if task == "classification" else 1, norm,
                        image).double()
    state = clone_state(model.state_dict())
    train = round_type(model, data, task, config)
    losses = []
    for round_index in range(3):
        state, loss = train(state, round_index)
        losses.append(loss)
    return state, losses


@pytest.mark.parametrize(("spec", "norm", "persist", "task", "image"), [
    (MLPSpec(hidden=(8, 4)), "none", False, "classification", None),
    (MLPSpec(hidden=(8, 4)), "batch", False, "classification", None),
    (MLPSpec(hidden=(8, 4)), "batch", True, "classification", None),
    (MLPSpec(hidden=(8, 4, 4)), "group", True, "regression", None),
    (MLPSpec(hidden=(8, 4)), "layer", False, "regression", None),
    (CNNSpec(((4,), (8,)), 3, 1, (2, 4), (6,)), "batch", False, "classification", (1, 8, 8)),
    (CNNSpec(((4,), (8,)), 3, 1, (2, 4), (6,)), "instance", True, "classification", (2, 4, 4)),
])
def test_batched_training_equals_one_client_at_a_time(spec, norm, persist, task, image):
    batched, batched_losses = tiny_run(BatchedRound, spec, norm, persist, task, image)
    sequential, sequential_losses = tiny_run(SequentialRound, spec, norm, persist, task, image)
    assert batched.keys() == sequential.keys()
    for name in batched:
        torch.testing.assert_close(batched[name], sequential[name], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(batched_losses, sequential_losses, rtol=1e-9)


def test_optimizer_state_choice_changes_the_result():
    fresh, _ = tiny_run(BatchedRound, MLPSpec(hidden=(8,)), "none", False, "classification")
    kept, _ = tiny_run(BatchedRound, MLPSpec(hidden=(8,)), "none", True, "classification")
    assert any(not torch.equal(fresh[name], kept[name]) for name in fresh)


def stack_data(runs: int, task: str, features: int = 16) -> list[ClientTensors]:
    """``runs`` federations of the same four unequal clients and targets, each with its own
    features (as the normalizations of one partition give), float64."""
    rng = np.random.default_rng(1)
    sizes = [7, 3, 12, 2]
    y = (torch.tensor(rng.integers(0, 3, sum(sizes))) if task == "classification"
         else torch.tensor(rng.normal(size=sum(sizes))))
    return [ClientTensors(torch.tensor(rng.normal(r, 1 + r, size=(sum(sizes), features))),
                          y, sizes) for r in range(runs)]


def seeded_double_model(spec, features: int, task: str, norm: str, image=None):
    torch.manual_seed(0)
    return build_model(spec, features, 3 if task == "classification" else 1, norm,
                       image).double()


STACK_CASES = [
    (MLPSpec(hidden=(8, 6, 4), dropout=0.3), "none", False, "regression", None),
    (MLPSpec(hidden=(8, 6, 4), dropout=0.3), "batch", True, "classification", None),
    (MLPSpec(hidden=(8, 4)), "group", False, "classification", None),
    (CNNSpec(((4,), (8,)), 3, 1, (2, 4), (6,)), "batch", False, "classification", (1, 4, 4)),
]


@pytest.mark.parametrize(("spec", "norm", "persist", "task", "image"), STACK_CASES)
def test_stacked_runs_equal_each_run_trained_alone(spec, norm, persist, task, image):
    """Three rounds of three stacked runs (the middle one leaving after round 1, as an
    early-stopped run does) against each run trained alone, dropout draws included."""
    features = 16 if image is None else math.prod(image)
    runs = stack_data(3, task, features)
    config = TrainConfig(batch_size=4, persist_optimizer=persist, seed=5)
    model = seeded_double_model(spec, features, task, norm, image)
    stack = StackedRound(model, runs, task, config)
    states = [clone_state(model.state_dict()) for _ in runs]
    stacked_losses: list[list[float]] = [[], [], []]
    for round_index in range(3):
        active = [0, 1, 2] if round_index < 2 else [0, 2]
        torch.manual_seed(100 + round_index)
        new, losses = stack([states[r] for r in active], round_index, active)
        for run, state, loss in zip(active, new, losses, strict=True):
            states[run] = state
            stacked_losses[run].append(loss)
    for run, data in enumerate(runs):
        alone_model = seeded_double_model(spec, features, task, norm, image)
        alone = BatchedRound(alone_model, data, task, config)
        state = clone_state(alone_model.state_dict())
        for round_index in range(3 if run != 1 else 2):
            torch.manual_seed(100 + round_index)
            state, loss = alone(state, round_index)
            assert loss == pytest.approx(stacked_losses[run][round_index], rel=1e-9)
        for name in state:
            torch.testing.assert_close(states[run][name], state[name], rtol=1e-9, atol=1e-10)
    assert not torch.allclose(states[0][next(iter(states[0]))],
                              states[2][next(iter(states[2]))])  # the runs did differ


@pytest.mark.parametrize("norm", ["none", "batch", "layer", "group"])
@pytest.mark.parametrize(("task", "loss"), [
    ("classification", {}), ("classification", {"class_weights": (0.5, 3.0, 1.25)}),
    ("regression", {}), ("regression", {"regression_loss": "mse"}),
])
def test_hand_written_mlp_gradients_equal_autograd(norm, task, loss):
    """The MLP step without autograd (what MLPs train with) against functional_call and
    autograd (what CNNs train with), dropout included, over two stacked runs, for every
    loss (plain and class-weighted cross-entropy, absolute and squared error)."""
    spec = MLPSpec(hidden=(8, 6, 4), dropout=0.25)
    assert mlp_step.supports(seeded_double_model(spec, 16, task, norm))
    results = []
    for hand_written in (True, False):
        model = seeded_double_model(spec, 16, task, norm)
        stack = StackedRound(model, stack_data(2, task), task,
                             TrainConfig(batch_size=4, seed=2, **loss))
        if not hand_written:
            stack.manual = None
        states = [clone_state(model.state_dict()) for _ in range(2)]
        torch.manual_seed(7)
        for round_index in range(2):
            states, losses = stack(states, round_index)
        results.append((states, losses))
    (manual, manual_losses), (autograd, autograd_losses) = results
    np.testing.assert_allclose(manual_losses, autograd_losses, rtol=1e-9)
    for run in range(2):
        for name in manual[run]:
            torch.testing.assert_close(manual[run][name], autograd[run][name], rtol=1e-9,
                                       atol=1e-10)
    assert not mlp_step.supports(build_model(MODEL_SPECS["digits"], 64, 10, "none", (1, 8, 8)))


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_mlps_with_different_norms_stack_and_equal_each_run_alone(task):
    """The study's stack of a partition: one MLP run per activation norm (and input
    normalizations, i.e. other features), dropout included, two rounds each."""
    spec = MLPSpec(hidden=(8, 6, 4), dropout=0.25)
    norms = ["group", "none", "batch", "layer", "instance", "none"]
    runs = stack_data(len(norms), task)
    config = TrainConfig(batch_size=4, seed=4)
    models = [seeded_double_model(spec, 16, task, norm) for norm in norms]
    stack = StackedRound(models, runs, task, config)
    assert stack.manual is not None and stack.manual.mixed is not None
    states = [clone_state(model.state_dict()) for model in models]
    stacked_losses = []
    for round_index in range(2):
        torch.manual_seed(50 + round_index)
        states, losses = stack(states, round_index)
        stacked_losses.append(losses)
    for run, (norm, data) in enumerate(zip(norms, runs, strict=True)):
        model = seeded_double_model(spec, 16, task, norm)
        alone = BatchedRound(model, data, task, config)
        state = clone_state(model.state_dict())
        for round_index in range(2):
            torch.manual_seed(50 + round_index)
            state, loss = alone(state, round_index)
            assert loss == pytest.approx(stacked_losses[round_index][run], rel=1e-9)
        assert state.keys() == states[run].keys()
        for name in state:
            torch.testing.assert_close(states[run][name], state[name], rtol=1e-9, atol=1e-10)


def test_a_mixed_stack_goes_on_when_only_runs_without_a_norm_are_left():
    task, spec = "regression", MLPSpec(hidden=(8, 4))
    runs = stack_data(3, task)
    config = TrainConfig(batch_size=4, seed=1)
    models = [seeded_double_model(spec, 16, task, norm) for norm in ("batch", "none", "none")]
    stack = StackedRound(models, runs, task, config)
    states = [clone_state(model.state_dict()) for model in models]
    states, _ = stack(states, 0)
    left, _ = stack(states[1:], 1, [1, 2])  # the batch-norm run has stopped
    model = seeded_double_model(spec, 16, task, "none")
    alone = BatchedRound(model, runs[2], task, config)
    state = clone_state(model.state_dict())
    for round_index in range(2):
        state, _ = alone(state, round_index)
    for name in state:
        torch.testing.assert_close(left[1][name], state[name], rtol=1e-9, atol=1e-10)


def test_networks_that_differ_beyond_the_norm_do_not_stack():
    runs = stack_data(2, "regression")
    models = [seeded_double_model(MLPSpec(hidden=hidden), 16, "regression", "none")
              for hidden in ((8,), (6,))]
    with pytest.raises(InputError, match="share their network"):
        StackedRound(models, runs, "regression", TrainConfig())


def test_stacked_training_stops_each_run_as_it_would_stop_alone():
    task, spec = "classification", MLPSpec(hidden=(8, 4), dropout=0.2)
    runs = stack_data(3, task)
    rng = np.random.default_rng(2)
    vals = [(torch.tensor(rng.normal(r, 1 + r, size=(30, 16))),
             torch.tensor(rng.integers(0, 3, 30))) for r in range(3)]
    config = TrainConfig(batch_size=4, max_rounds=12, patience=2, seed=3)
    models = [seeded_double_model(spec, 16, task, "none") for _ in runs]
    stacked = train_stacked(models, StackedRound(models, runs, task, config),
                            [m.state_dict() for m in models], vals, task, config)
    rounds = []
    for data, val, outcome in zip(runs, vals, stacked, strict=True):
        model = seeded_double_model(spec, 16, task, "none")
        alone = train_federated(model, BatchedRound(model, data, task, config), val, task,
                                config)
        assert (outcome.rounds, outcome.best_round) == (alone.rounds, alone.best_round)
        np.testing.assert_allclose(outcome.val_losses, alone.val_losses, rtol=1e-9)
        for name in alone.state:
            torch.testing.assert_close(outcome.state[name], alone.state[name], rtol=1e-9,
                                       atol=1e-10)
        torch.testing.assert_close(predict(model, outcome.state, val[0]),
                                   predict(model, alone.state, val[0]))
        rounds.append(outcome.rounds)
    assert len(set(rounds)) > 1  # the runs stopped at different rounds


def test_stacking_refuses_runs_of_different_partitions():
    first, second = stack_data(2, "regression")
    other = ClientTensors(second.X, second.y, [6, 4, 12, 2])
    model = seeded_double_model(MLPSpec(hidden=(4,)), 16, "regression", "none")
    with pytest.raises(InputError, match="share"):
        StackedRound(model, [first, other], "regression", TrainConfig())


def test_early_stopping_keeps_the_best_validation_weights():
    torch.manual_seed(0)
    model = build_model(MLPSpec(hidden=(4,)), 3, 2)
    val = (torch.randn(20, 3), torch.randint(0, 2, (20,)))
    initial = clone_state(model.state_dict())

    def worse_every_round(state, round_index):
        return {n: t * (1 + 10 * round_index) for n, t in initial.items()}, 0.0

    config = TrainConfig(max_rounds=50, patience=3)
    outcome = train_federated(model, worse_every_round, val, "classification", config)
    assert outcome.best_round == 1 and outcome.rounds == 4  # 1 good round + 3 of patience
    for name, tensor in initial.items():
        torch.testing.assert_close(outcome.state[name], tensor)


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


def test_a_regression_run_reports_its_scores_in_the_targets_own_units(bcw, monkeypatch):
    """The run's R² and MAE equal sklearn's on the original targets and the model's
    predictions mapped back."""
    from fednorm.training import runner, tensors

    regression = Dataset("r", bcw.X[:, 1:], bcw.X[:, 0] * 10 + 30, bcw.feature_names[1:],
                         "radius", "regression")
    monkeypatch.setattr(runner, "cached_dataset", lambda name, data_dir: regression)
    seen = {}
    original = runner.score_on_test

    def spy(model, outcome, test, task, config, scale=None):
        seen["y"], seen["prediction"] = test.y, scale.invert(
            tensors.predict(model, outcome.state, tensors.eval_tensors(test, task)[0]
                           ).numpy().reshape(-1).astype(float))
        return original(model, outcome, test, task, config, scale)

    monkeypatch.setattr(runner, "score_on_test", spy)
    (_, row), = runner.run_cells([runner.Cell("r", "iid", 4, "federated_zscore", 0)],
                                 runner.RunSettings(max_rounds=3))
    from sklearn.metrics import mean_absolute_error, r2_score

    assert seen["y"].mean() > 100  # original units (radius · 10 + 30), not standardized
    assert row["test_r2"] == pytest.approx(r2_score(seen["y"], seen["prediction"]), abs=1e-5)
    assert row["test_mae"] == pytest.approx(mean_absolute_error(seen["y"], seen["prediction"]),
                                            rel=1e-5)


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

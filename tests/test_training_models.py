"""The training stack's models and FedAvg: every model with every activation norm,
batched training equal to one client at a time, stacked runs equal to each run alone,
the hand-written MLP step equal to autograd, early stopping."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fednorm.engine.errors import InputError  # noqa: E402
from fednorm.training import mlp_step  # noqa: E402
from fednorm.training.fedavg import (  # noqa: E402
    ClientTensors,
    TrainConfig,
    clone_state,
    predict,
    train_federated,
    train_stacked,
)
from fednorm.training.models import (  # noqa: E402
    MODEL_SPECS,
    CNNSpec,
    MLPSpec,
    build_model,
)
from fednorm.training.rounds import BatchedRound, SequentialRound, StackedRound  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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



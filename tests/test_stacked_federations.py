"""A stack of several federations (the partitions of one dataset and seed, and their
central models): every run gets, to the last bit, the result it gets trained alone, and
the grid groups its cells into such stacks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fednorm.engine.errors import InputError  # noqa: E402
from fednorm.training.fedavg import (  # noqa: E402
    ClientTensors,
    TrainConfig,
    train_federated,
    train_stacked,
)
from fednorm.training.grid import (  # noqa: E402
    PARTITIONS_PER_JOB,
    Cell,
    GridRequest,
    build_grid,
)
from fednorm.training.jobs import job_groups  # noqa: E402
from fednorm.training.models import MLPSpec, build_model  # noqa: E402
from fednorm.training.rounds import BatchedRound, StackedRound  # noqa: E402
from fednorm.training.runner import RunSettings, run_cells  # noqa: E402
from fednorm.training.stack_params import ROW_ALIGN, ParamLayout  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = MLPSpec(hidden=(32, 16, 8), dropout=0.2)  # dropout, as Parkinson's network has
FEATURES = 19


def federation(sizes: list[int], seed: int) -> ClientTensors:
    """Float32 clients, as the study trains them."""
    rng = np.random.default_rng(seed)
    rows = sum(sizes)
    return ClientTensors(torch.tensor(rng.normal(size=(rows, FEATURES)), dtype=torch.float32),
                         torch.tensor(rng.normal(size=rows), dtype=torch.float32), sizes)


def model(norm: str):
    torch.manual_seed(0)
    return build_model(SPEC, FEATURES, 1, norm, None)


def validation(seed: int) -> tuple:
    rng = np.random.default_rng(100 + seed)
    return (torch.tensor(rng.normal(size=(40, FEATURES)), dtype=torch.float32),
            torch.tensor(rng.normal(size=40), dtype=torch.float32))


# (federation, norm): a partition's runs (own features, mixed norms), another partition
# (other clients and targets), and a central model (one client of all the rows).
PARTITION = [301, 487, 412]
RUNS = [(0, "none"), (0, "batch"), (0, "layer"), (1, "group"), (1, "none"), (2, "none")]


def run_data() -> list[ClientTensors]:
    first, other = federation(PARTITION, 1), federation([220, 611], 2)
    central = federation([1200], 3)
    data = {0: first, 1: other, 2: central}
    # The same federation's runs share clients and targets but not features.
    return [ClientTensors(data[f].X + run, data[f].y, data[f].sizes) if f == 0 else data[f]
            for run, (f, _) in enumerate(RUNS)]


@pytest.mark.parametrize("persist", [False, True])
def test_every_run_of_a_stack_of_federations_gets_its_lone_result_to_the_bit(persist):
    config = TrainConfig(batch_size=8, max_rounds=4, patience=2, seed=3, persist_optimizer=persist,
                         regression_loss="mse")
    data = run_data()
    models = [model(norm) for _, norm in RUNS]
    stack = StackedRound(models, data, "regression", config, [f for f, _ in RUNS])
    stacked = train_stacked(models, stack, [m.state_dict() for m in models],
                            [validation(f) for f, _ in RUNS], "regression", config)
    for (f, norm), run_data_, outcome in zip(RUNS, data, stacked, strict=True):
        alone_model = model(norm)
        alone = train_federated(alone_model, BatchedRound(alone_model, run_data_, "regression",
                                                          config),
                                validation(f), "regression", config)
        assert (outcome.rounds, outcome.best_round) == (alone.rounds, alone.best_round)
        assert outcome.val_losses == alone.val_losses
        for name in alone.state:
            assert torch.equal(outcome.state[name], alone.state[name]), (f, norm, name)


def test_a_stack_row_is_segments_aligned_and_a_product_gradient_is_kept_as_it_comes():
    network = model("batch")
    layout = ParamLayout(network)
    segments = layout.flatten(network.state_dict())
    assert all(len(segment) % ROW_ALIGN == 0 for segment in segments)
    own = [name for names in layout.segment_names if names[0] in layout.own for name in names]
    assert own == ["layers.4.weight", "layers.7.weight"]  # 32·16 and 16·8 values
    assert layout.padding > 0 and torch.count_nonzero(segments[-1][-layout.padding:]) == 0
    assert len(ParamLayout(network, split=False).flatten(network.state_dict())) == 1
    gradients = [torch.randn(3, *shape) for shape in layout.shapes.values()]
    stacked = layout.gradient_segments(gradients)
    weight = list(layout.shapes).index("layers.4.weight")
    assert stacked[0].data_ptr() == gradients[weight].data_ptr()  # no copy
    views = layout.storage_views(stacked)
    assert all(torch.equal(views[name], g) for name, g in zip(layout.shapes, gradients,
                                                               strict=True))


def test_runs_of_one_federation_must_share_their_clients():
    first, other = federation([30, 20], 1), federation([25, 25], 2)
    with pytest.raises(InputError, match="share their clients"):
        StackedRound(model("none"), [first, other], "regression", TrainConfig(), [0, 0])
    StackedRound(model("none"), [first, other], "regression", TrainConfig(), [0, 1])


def test_the_grid_stacks_mlp_partitions_of_a_dataset_and_seed_and_images_one_by_one():
    cells = build_grid(GridRequest(datasets=["bcw", "digits"], seeds=[0, 1]))
    jobs = job_groups(cells, RunSettings())
    partitions = [{(c.dataset, c.skew, c.clients, c.seed) for c in job} for job in jobs]
    for job, keys in zip(jobs, partitions, strict=True):
        assert len({(c.dataset, c.seed, c.privacy) for c in job}) == 1
        limit = PARTITIONS_PER_JOB if job[0].dataset == "bcw" else 1
        assert 1 <= len(keys) <= limit
    bcw = [keys for job, keys in zip(jobs, partitions, strict=True) if job[0].dataset == "bcw"]
    assert max(map(len, bcw)) == PARTITIONS_PER_JOB
    assert sorted(cells, key=repr) == sorted((c for job in jobs for c in job), key=repr)
    # The dataset with more rows (digits: 1,797; BCW: 569) first over all seeds, then by seed.
    assert [(job[0].dataset, job[0].seed) for job in jobs] == sorted(
        ((job[0].dataset, job[0].seed) for job in jobs), key=lambda k: (k[0] != "digits", k[1]))
    unstacked = job_groups(cells, RunSettings(stack=False))
    assert all(len({(c.skew, c.clients) for c in job}) == 1 for job in unstacked)


def test_a_job_holds_one_dataset_seed_and_privacy():
    cells = [Cell("bcw", "iid", 3, "none", 0), Cell("bcw", "iid", 3, "none", 1)]
    with pytest.raises(InputError, match="share dataset, seed and privacy"):
        run_cells(cells, RunSettings(max_rounds=1))

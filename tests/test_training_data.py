"""The training stack's data: client splits (test, validation, training rows), feature
noise, and the normalization modes (local, federated plain and under MHE, none)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from fednorm.engine.errors import InputError  # noqa: E402
from fednorm.protocols import METHODS, FitOptions  # noqa: E402
from fednorm.sim.datasets import Dataset, load_dataset  # noqa: E402
from fednorm.sim.partition import Partition  # noqa: E402
from fednorm.training.data import (  # noqa: E402
    make_clients,
    merge_test,
    merge_val,
    min_client_rows,
    split_client,
    split_sizes,
)
from fednorm.training.normalization import (  # noqa: E402
    PAPER_NORMALIZATIONS,
    NormalizationSpec,
    normalize_clients,
    study_bound,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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



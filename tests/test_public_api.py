"""``import fednorm``: one public API, typed, that loads nothing heavy until used."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fednorm

PACKAGE = Path(fednorm.__file__).parent


def test_import_fednorm_loads_no_ckks_backend_until_a_name_is_used() -> None:
    probe = ("import sys, fednorm; light = 'openfhe' not in sys.modules; "
             "fednorm.simulate; print(light, 'openfhe' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True"]


@pytest.mark.parametrize("name", fednorm.__all__)
def test_every_public_name_resolves_from_where_it_lives(name: str) -> None:
    value = getattr(fednorm, name)
    assert value is getattr(sys.modules[fednorm._HOME_OF[name]], name)


def test_type_checkers_see_the_same_names_the_package_exports() -> None:
    """The ``TYPE_CHECKING`` imports (what mypy and editors read) name exactly the lazily
    exported names, each from its home: one list cannot drift from the other."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING")
    seen = {alias.name: node.module for node in guarded.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == fednorm._HOME_OF
    assert sorted(fednorm.__all__) == sorted(fednorm._HOME_OF)


def test_unknown_names_are_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'simulte'"):
        fednorm.simulte  # noqa: B018


def test_the_package_is_marked_typed_and_ships_the_marker() -> None:
    assert (PACKAGE / "py.typed").is_file()
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert '"fednorm" = ["py.typed"]' in pyproject


def test_a_fit_through_the_public_api_equals_the_pooled_oracle() -> None:
    parties = [np.random.default_rng(p).normal(p, 2, (20, 3)) for p in range(3)]
    fitted = fednorm.simulate(parties, "zscore").normalizer
    assert isinstance(fitted, fednorm.ZScoreNormalizer)
    np.testing.assert_allclose(fitted.var, np.concatenate(parties).var(axis=0), rtol=1e-12)
    with pytest.raises(fednorm.InputError):
        fednorm.FitOptions(vabs=-1.0)


@pytest.mark.parametrize("method", ["zscore", "minmax", "robust", "yeojohnson"])
def test_to_sklearn_is_typed_as_what_each_method_returns(method: str) -> None:
    """A type checker reads ``to_sklearn``'s return annotation (scikit-learn names imported
    under ``TYPE_CHECKING``): it must name the very class each normalizer returns."""
    import typing

    import sklearn.base
    import sklearn.preprocessing

    from fednorm.protocols import federated_minmax, normalizers

    names = {**vars(normalizers), **vars(sklearn.preprocessing), **vars(sklearn.base),
             "FederatedMinMaxScaler": federated_minmax.FederatedMinMaxScaler}
    rng = np.random.default_rng(3)
    fitted = fednorm.simulate([rng.normal(size=(5, 2)) for _ in range(2)], method).normalizer
    hint = typing.get_type_hints(type(fitted).to_sklearn, globalns=names)["return"]
    assert type(fitted.to_sklearn()) is hint
    assert typing.get_type_hints(fednorm.Normalizer.to_sklearn, globalns=names)["return"] \
        is sklearn.base.TransformerMixin

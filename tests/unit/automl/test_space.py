"""The search space: bad input named at parse time, Optuna's distributions, parameters put where the job reads them."""

from __future__ import annotations

import pytest

from airflow_provider_tao.automl.space import (
    check_search_space,
    check_spec_paths,
    distributions,
    grid_of,
    with_params_at_paths,
)
from airflow_provider_tao.hooks.errors import JobValidationError

SPACE = {
    "train.optim.lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
    "train.batch_size": {"type": "categorical", "choices": [8, 16, 32]},
    "model.depth": {"type": "int", "low": 2, "high": 8},
}


@pytest.mark.parametrize(
    ("space", "names", "says"),
    [
        ({"lr": {"type": "loguniform", "low": 1, "high": 2}}, "search_space['lr']", "unknown type 'loguniform'"),
        ({"lr": {"type": "float", "low": 0.1, "high": 0.1}}, "search_space['lr']", "low 0.1 is not below high 0.1"),
        ({"lr": {"type": "float", "low": 0, "high": 1, "log": True}}, "search_space['lr']", "log=True needs low > 0"),
        ({"bs": {"type": "categorical", "choices": []}}, "search_space['bs']", "choices [] is empty"),
        ({"d": {"type": "int", "low": 1.5, "high": 3}}, "search_space['d']['low']", "is not a finite int"),
        ({"d": {"type": "int", "low": 1, "high": 3, "lo": 2}}, "search_space['d']", "unknown key(s) lo"),
        ({}, "search_space", "is not a non-empty mapping"),
    ],
)
def test_bad_space_is_refused_naming_the_entry(space: dict, names: str, says: str) -> None:
    with pytest.raises(JobValidationError) as exc:
        check_search_space(space)
    assert exc.value.parameter == names and says in str(exc.value), str(exc.value)


def test_distributions_are_optunas_with_log_scale() -> None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    dists = distributions(check_search_space(SPACE))
    assert dists["train.optim.lr"] == FloatDistribution(1e-5, 1e-1, log=True)
    assert dists["train.batch_size"] == CategoricalDistribution([8, 16, 32])
    assert dists["model.depth"] == IntDistribution(2, 8, step=1)


def test_grid_needs_finite_values() -> None:
    with pytest.raises(JobValidationError, match="algorithm='grid' needs a finite set"):
        grid_of(check_search_space({"lr": {"type": "float", "low": 0.1, "high": 1}}))
    grid = grid_of(
        check_search_space(
            {"lr": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1}, **SPACE}
            | {"train.optim.lr": {"type": "categorical", "choices": [0.1]}}
        )
    )
    assert grid["lr"] == [0.1, 0.2, 0.3] and grid["model.depth"] == [2, 3, 4, 5, 6, 7, 8]


def test_config_mode_paths_must_exist_in_the_spec() -> None:
    specs = {"train": {"optim": {"lr": 0.1}, "batch_size": 8}, "model": {"depth": 3}}
    check_spec_paths(SPACE, specs)
    with pytest.raises(JobValidationError) as exc:
        check_spec_paths({"train.optim.lrr": {}}, specs)
    assert exc.value.parameter == "search_space['train.optim.lrr']"
    assert "no 'lrr' under train.optim" in str(exc.value) and "lr" in exc.value.fix


def test_params_are_written_at_their_dotted_paths_in_a_copy() -> None:
    specs = {"train": {"optim": {"lr": 0.1, "momentum": 0.9}}, "model": {"depth": 3}}
    out = with_params_at_paths(specs, {"train.optim.lr": 0.01, "model.depth": 5})
    assert out == {"train": {"optim": {"lr": 0.01, "momentum": 0.9}}, "model": {"depth": 5}}
    assert specs["train"]["optim"]["lr"] == 0.1

"""The search space of a hyperparameter search: checked at DAG parse time, turned into Optuna's distributions when
the search runs, and a trial's parameters put where its job reads them.

A search space maps a parameter name (a dotted spec path in config mode, an argument name in args mode) to one of::

    {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}      # "step" too (not with log)
    {"type": "int", "low": 2, "high": 8}                             # "step", "log" too
    {"type": "categorical", "choices": [8, 16, 32]}

Nothing here imports Optuna at module level: parsing a DAG never does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from airflow_provider_tao.hooks.errors import JobValidationError

TYPES = ("float", "int", "categorical")
_KEYS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}, "categorical": {"choices"}}
#: Grid points a grid search may have at most (a float range needs a ``step``).
MAX_GRID_POINTS = 100_000


def check_search_space(space: Any, parameter: str = "search_space") -> dict[str, dict[str, Any]]:
    """``space`` checked and normalised (``log`` and ``step`` filled in); bad input raises
    :class:`~airflow_provider_tao.hooks.errors.JobValidationError` naming the entry and the fix."""
    if not isinstance(space, Mapping) or not space:
        raise JobValidationError(
            parameter,
            f"{space!r} is not a non-empty mapping",
            'Pass {"name": {"type": "float", "low": .., "high": ..}}',
        )
    return {str(name): _check_entry(f"{parameter}[{name!r}]", entry) for name, entry in space.items()}


def _check_entry(where: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise JobValidationError(where, f"{entry!r} is not a mapping", 'Give {"type": ..., ...}')
    kind = entry.get("type")
    if kind not in TYPES:
        raise JobValidationError(where, f"unknown type {kind!r}", f"Use one of: {', '.join(TYPES)}")
    if unknown := sorted(set(entry) - _KEYS[kind] - {"type"}):
        raise JobValidationError(
            where,
            f"unknown key(s) {', '.join(unknown)} for type {kind!r}",
            f"Use only: {', '.join(sorted(_KEYS[kind]))}",
        )
    if kind == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise JobValidationError(where, f"choices {choices!r} is empty or not a list", "Give a list of values")
        for choice in choices:
            if choice is not None and not isinstance(choice, (bool, int, float, str)):
                raise JobValidationError(
                    where, f"choice {choice!r} is not a number, string, bool or None", "Use plain values"
                )
        if len(set(map(repr, choices))) != len(choices):
            raise JobValidationError(where, f"choices {list(choices)!r} repeat a value", "List each value once")
        return {"type": kind, "choices": list(choices)}
    return _check_range(where, kind, entry)


def _check_range(where: str, kind: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    number = int if kind == "int" else (int, float)
    low, high = entry.get("low"), entry.get("high")
    for key, value in (("low", low), ("high", high)):
        if not isinstance(value, number) or isinstance(value, bool) or not math.isfinite(value):
            raise JobValidationError(f"{where}['{key}']", f"{value!r} is not a finite {kind}", f"Give a {kind}")
    assert low is not None and high is not None
    if low >= high:
        raise JobValidationError(where, f"low {low} is not below high {high}", "Give low < high")
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise JobValidationError(f"{where}['log']", f"{log!r} is not a bool", "Use True or False")
    if log and low <= 0:
        raise JobValidationError(where, f"log=True needs low > 0 (low is {low})", "Give a positive low, or log=False")
    step = entry.get("step")
    if step is not None:
        if not isinstance(step, number) or isinstance(step, bool) or step <= 0:
            raise JobValidationError(
                f"{where}['step']", f"{step!r} is not a positive {kind}", "Give a step > 0, or none"
            )
        if log:
            raise JobValidationError(where, "step and log=True together", "Drop one of them (Optuna allows either)")
    elif kind == "int":
        step = 1
    return {"type": kind, "low": low, "high": high, "log": log, "step": step}


def grid_of(space: Mapping[str, Mapping[str, Any]], parameter: str = "search_space") -> dict[str, list[Any]]:
    """Every value of every parameter, for ``algorithm="grid"`` (a float range needs a ``step``)."""
    grid: dict[str, list[Any]] = {}
    points = 1
    for name, entry in space.items():
        if entry["type"] == "categorical":
            values = list(entry["choices"])
        elif entry["step"] is None or (entry["type"] == "int" and entry["log"]):
            raise JobValidationError(
                f"{parameter}[{name!r}]",
                "algorithm='grid' needs a finite set of values, and this range has none",
                "Give it a 'step' (without log), or make it categorical",
            )
        else:
            count = math.floor((entry["high"] - entry["low"]) / entry["step"] + 1e-9) + 1  # 0.2/0.1 is 1.999...
            values = [entry["low"] + i * entry["step"] for i in range(count)]
            if entry["type"] == "float":
                values = [round(v, 12) for v in values]
        grid[name] = values
        points *= len(values)
        if points > MAX_GRID_POINTS:
            raise JobValidationError(parameter, f"the grid has more than {MAX_GRID_POINTS} points", "Use fewer values")
    return grid


def distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Optuna's distributions of a checked space (imports Optuna)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    result: dict[str, Any] = {}
    for name, entry in space.items():
        if entry["type"] == "categorical":
            result[name] = CategoricalDistribution(entry["choices"])
        elif entry["type"] == "int":
            result[name] = IntDistribution(entry["low"], entry["high"], log=entry["log"], step=entry["step"])
        else:
            result[name] = FloatDistribution(entry["low"], entry["high"], log=entry["log"], step=entry["step"])
    return result


def check_spec_paths(space: Mapping[str, Any], specs: Any) -> None:
    """Config mode: every parameter must be a dotted path the spec has (a typo would tune nothing)."""
    if not isinstance(specs, Mapping):
        return  # a template rendered later: checked again before the first trial
    for name in space:
        node: Any = specs
        walked: list[str] = []
        for part in name.split("."):
            if not isinstance(node, Mapping) or part not in node:
                have = sorted(node) if isinstance(node, Mapping) else []
                at = ".".join(walked) or "the spec's top level"
                raise JobValidationError(
                    f"search_space[{name!r}]",
                    f"the spec has no {part!r} under {at}",
                    f"Use a dotted path of specs (there: {', '.join(map(str, have)) or 'nothing'})",
                )
            node = node[part]
            walked.append(part)


def with_params_at_paths(specs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the nested ``specs`` with each parameter written at its dotted path."""
    result = copy.deepcopy(dict(specs))
    for name, value in params.items():
        node = result
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return result

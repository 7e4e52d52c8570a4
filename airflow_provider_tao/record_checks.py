"""What a job record read back from Airflow must look like before anything trusts it.

A task instance's record (:class:`~airflow_provider_tao.records.JobRecord`) is read back from its XCom, which any
task of the deployment and anyone who may edit the DAG's XComs over the REST API can write, and from its
``task_state_store``. Each field is checked for its type and a sane range here, so a forged or damaged value is
refused in words (and logged by the reader) instead of crashing a page for every viewer, running script in the UI
or steering a cancel. See ``docs/security.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from typing import Any

#: The latest epoch second a record may hold (the end of year 9999: ``datetime`` cannot show a later one).
MAX_EPOCH = 253402300799.0
#: The most GPUs per node or nodes a record may ask for.
MAX_COUNT = 100_000
#: The longest text a record field may hold.
MAX_TEXT = 4096
#: A platform name or a job id: plain words, no markup.
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def _text(value: Any, *, empty: bool = True) -> str | None:
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    if len(value) > MAX_TEXT or (not empty and not value):
        return "is empty" if not value else f"is longer than {MAX_TEXT} characters"
    return None


def _word(value: Any) -> str | None:
    if not isinstance(value, str) or not _WORD.fullmatch(value):
        return "is not a plain word (letters, digits, '_.:-')"
    return None


def _conn_id(value: Any) -> str | None:
    return None if value is None else _text(value, empty=False)


def _integer(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"is a {type(value).__name__}, not a whole number"
        return None if low <= value <= high else f"is {value}, not within {low}..{high}"

    return check


def _number(low: float, high: float, *, optional: bool) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            return f"is a {type(value).__name__}, not a number"
        if not math.isfinite(value) or not low <= value <= high:
            return f"is {value!r}, not within {low:g}..{high:g}"
        return None

    return check


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"is a {type(value).__name__}, not true or false"


def _texts(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(item, str) and len(item) <= MAX_TEXT for item in value):
        return "is not a list of texts"
    return None


def _outputs(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(k) + len(v) <= MAX_TEXT for k, v in value.items()
    ):
        return "is not a mapping of texts"
    return None


def _history(value: Any) -> str | None:
    return None if isinstance(value, list) else "is not a list"


_EPOCH = _number(0.0, MAX_EPOCH, optional=False)
#: The handle's fields (``JobHandle``) and what each must be; a field left out takes its default.
HANDLE_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "platform": _word,
    "conn_id": _conn_id,
    "job_id": _word,
    "name": lambda value: _text(value, empty=False),
    "backend_job_id": _text,
    "results_dir": _text,
    "try_number": _integer(0, 1_000_000),
    "submitted_at": _EPOCH,
    "console_url": _text,
}
#: The record's own fields (``JobRecord`` but ``handle`` and ``state``) and what each must be.
RECORD_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "consumed": _flag,
    "outputs": _outputs,
    "gpu_count": _integer(-1, MAX_COUNT),
    "num_nodes": _integer(1, MAX_COUNT),
    "cancel_on_kill": _flag,
    "deadline": _number(0.0, MAX_EPOCH, optional=True),
    "err_class": lambda value: _text(value) or (None if len(value) <= 64 else "is longer than 64 characters"),
    "ended_at": _number(0.0, MAX_EPOCH, optional=True),
    "run_seconds": _number(0.0, MAX_EPOCH, optional=True),
    "history": _history,
    "secret_conn_ids": _texts,
}
#: Handle fields a record must have (the others have defaults).
REQUIRED_HANDLE_FIELDS = ("platform", "conn_id", "job_id", "name", "submitted_at")


def handle_problem(handle: Any) -> str | None:
    """What is wrong with a job handle read back from Airflow (``"handle.<field> is ..."``), or None."""
    if not isinstance(handle, dict):
        return "handle is not a mapping"
    for name in REQUIRED_HANDLE_FIELDS:
        if name not in handle:
            return f"handle.{name} is missing"
    for name, check in HANDLE_FIELDS.items():
        if name in handle and (problem := check(handle[name])):
            return f"handle.{name} {problem}"
    return None


def record_problem(data: Any, states: Collection[str]) -> str | None:
    """What is wrong with a job record read back from Airflow (``"<field> is ..."``), or None.

    :param data: the stored value.
    :param states: the states a record may hold.
    """
    if not isinstance(data, dict):
        return f"the record is a {type(data).__name__}, not a mapping"
    if problem := handle_problem(data.get("handle")):
        return problem
    if "state" in data and (not isinstance(data["state"], str) or data["state"] not in states):  # a list: unhashable
        return f"state {str(data['state'])[:40]!r} is not one of {', '.join(sorted(states))}"
    for name, check in RECORD_FIELDS.items():
        if name in data and (problem := check(data[name])):
            return f"{name} {problem}"
    return None

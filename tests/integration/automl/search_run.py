"""Drive a deferred search the way Airflow does: each trigger event resumes the task on a fresh operator, which
defers again (a new trigger from its serialized kwargs) until the search returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import TaskDeferred

from tests.integration.taskrun import TaskRun, _deferred

#: the longest wait for one trigger event
EVENT_TIMEOUT = 180


def follow_search(
    run: TaskRun, resumed: Callable[[], Any], before_each: Callable[[], None] | None = None
) -> dict[str, Any]:
    """The search's result. ``resumed`` makes the operator a worker resumes with; ``before_each`` runs before each
    wait for an event (a test letting its trainers go on)."""
    current = run
    while True:
        if before_each is not None:
            before_each()
        event = current.future.result(EVENT_TIMEOUT)
        try:
            return resumed().execute_complete(run.context, event)
        except TaskDeferred as deferred:
            current = _deferred(run.triggerer, run.op, run.context, run.store, deferred)

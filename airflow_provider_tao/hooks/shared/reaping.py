"""The ownership rule ``reap_resources`` shares across platforms: a resource this Airflow's task records name as a
task instance's own goes once that task is over -- never one no record names, nor one whose task may still run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: The Airflow state of a task instance given as ``{dag_id, run_id, task_id, map_index}`` (None: not known).
TaskState = Callable[[Mapping[str, Any]], str | None]

#: A task instance in one of these states runs no more (until a person clears it: it then starts from scratch).
FINISHED_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def task_words(origin: Mapping[str, Any]) -> str:
    """A task instance in words, from a lease or a record: ``dag.task run R`` (and its map index, if mapped)."""
    owner = f"{origin.get('dag_id')}.{origin.get('task_id')} run {origin.get('run_id')}"
    if str(origin.get("map_index")) not in ("None", "", "-1"):
        owner += f" map index {origin.get('map_index')}"
    return owner


def task_over_by_record(origin: Mapping[str, Any] | None, name: str, task_state: TaskState | None) -> tuple[bool, str]:
    """Whether the task instance a record names as the owner of the resource of job ``name`` is over, and why in
    words ("" when no record names it).

    :param origin: what the records say ran under the resource's id (:func:`~airflow_provider_tao.sweeper.
        recorded_jobs`: ``dag_id, run_id, task_id, map_index, name``), or None.
    :param name: the job name the resource itself carries: a record under the same id for another name (a platform
        id used again, another cluster behind the connection) does not make it the task's.
    :param task_state: the Airflow state lookup; without it nothing is judged over.
    """
    if origin is None or origin.get("name") != name or task_state is None:
        return False, ""
    state = task_state(origin)
    if state in FINISHED_TASK_STATES:
        return True, f"its task {task_words(origin)} is {state} (by this Airflow's record)"
    return False, f"its task {task_words(origin)} is {state or 'not finished'}"

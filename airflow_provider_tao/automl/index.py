"""A search's trials as jobs of Airflow's job index (:mod:`airflow_provider_tao.jobindex`): ``airflow tao cancel
<trial's job id>``, the job page's Cancel button, ``airflow tao reap`` and the TAO jobs view find a trial's job like
any other, as a job of the search's task instance.

The search keeps its trials in the task's ``task_state_store`` under :data:`SEARCH_KEY` (only the task writes it);
each trial that has a job becomes one :class:`~airflow_provider_tao.records.JobRecord`, checked like every record read
back from Airflow (:func:`~airflow_provider_tao.record_checks.record_problem`) and refused unless its job's name is
that trial's of that task instance (:func:`trial_digest`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_tao.automl.study import BUDGET, CANCELED, COMPLETE, FAILED, PRUNED
from airflow_provider_tao.jobs import JobState
from airflow_provider_tao.record_checks import record_problem
from airflow_provider_tao.records import STATES, SUBMITTED, JobRecord

log = logging.getLogger(__name__)

#: ``task_state_store`` key of a search's state (beside the single job's record key).
SEARCH_KEY = "tao_automl"
#: A trial's state as its job record's (a live trial's job is ``Submitted``: its platform says how it runs).
RECORD_STATES = {
    COMPLETE: JobState.COMPLETE.value,
    FAILED: JobState.ERROR.value,
    PRUNED: JobState.CANCELED.value,
    CANCELED: JobState.CANCELED.value,
    BUDGET: JobState.CANCELED.value,
}


def trial_digest(dag_id: str, task_id: str, run_id: str, map_index: int | None, number: int) -> str:
    """The part of trial ``number``'s job name that names it: the same for every try of the task instance."""
    identity = f"{dag_id}\n{task_id}\n{run_id}\n{map_index}\ntrial {number}"
    return hashlib.sha256(identity.encode()).hexdigest()[:10]


def trial_records(key: tuple[str, str, str, int], value: Any) -> list[tuple[int, JobRecord]]:
    """The jobs of the search state ``value`` of the task instance ``key`` (``dag_id, run_id, task_id,
    map_index``): ``(trial number, its job's record)`` for every trial that has a job; a value that is not one
    logged and skipped."""
    if not isinstance(value, Mapping) or not isinstance(value.get("trials"), list):
        return []
    given = value.get("task")
    task: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    found = []
    for trial in value["trials"]:
        if not isinstance(trial, Mapping) or not isinstance(trial.get("handle"), Mapping):
            continue  # a trial whose job is not submitted yet (its write-ahead): its next try adopts it by name
        number = trial.get("number")
        data = {
            "handle": dict(trial["handle"]),
            "outputs": trial.get("outputs") or {},
            "gpu_count": task.get("gpu_count", 0),
            "num_nodes": task.get("num_nodes", 1),
            "cancel_on_kill": task.get("cancel_on_kill", True),
            "deadline": task.get("deadline"),
            "state": RECORD_STATES.get(str(trial.get("state")), SUBMITTED),
            "err_class": str(trial.get("err_class") or ""),
        }
        problem = record_problem(data, STATES)
        if problem is None and not _names_trial(data["handle"], key, number):
            problem = f"its job {str(data['handle'].get('name'))[:80]!r} is not trial {number!r}'s"
        record = JobRecord.from_json(data) if problem is None else None
        if record is None:
            log.warning("Ignored trial %r of the search of %s.%s (%s, map index %s): %s", number, key[0], key[2],
                        key[1], key[3], problem or "not a job record")  # fmt: skip
            continue
        found.append((int(number), record))  # type: ignore[arg-type]  # _names_trial checked it is an int
    return found


def _names_trial(handle: Mapping[str, Any], key: tuple[str, str, str, int], number: Any) -> bool:
    if not isinstance(number, int) or isinstance(number, bool) or number < 0:
        return False
    name = handle.get("name")
    digest = trial_digest(key[0], key[2], key[1], key[3], number)
    return isinstance(name, str) and name.endswith("-" + digest)

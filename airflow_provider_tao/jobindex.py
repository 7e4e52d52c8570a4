"""Every job this provider started, read back from what Airflow already stores -- no database of our own.

A task instance's :class:`~airflow_provider_tao.records.JobRecord` is in ``task_state_store`` (all tries; dropped
after success when ``[state_store] clear_on_success`` is on) and in the current try's XCom (cleared when a new try
starts); its task instance row says how the task is doing. This module joins the three for the TAO jobs view and
``airflow tao``. It runs in Airflow's core processes (API server, CLI) with a metadata-database session.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.automl.index import SEARCH_KEY, trial_records
from airflow_provider_tao.jobs import JobStatus
from airflow_provider_tao.record_checks import record_problem
from airflow_provider_tao.records import (
    CHAIN_KEY,
    STATE_KEY,
    STATES,
    SUBMITTED,
    XCOM_RECORD,
    JobRecord,
    names_task_instance,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

#: A task instance: ``(dag_id, run_id, task_id, map_index)``.
TaskKey = tuple[str, str, str, int]

#: Task instance states in which the task still wants its job (it waits, or a next try will reattach).
WANTED_TI_STATES = frozenset({"running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule"})
#: Task instance states while the task waits on its job.
WAITING_TI_STATES = frozenset({"running", "deferred"})


@dataclass(frozen=True)
class IndexedJob:
    """One job with the task instance that started it.

    :param record: the job's record.
    :param dag_id: the task instance's DAG.
    :param run_id: its DAG run.
    :param task_id: its task.
    :param map_index: its map index (-1 when not mapped).
    :param ti_state: the task instance's state now (None when the row is gone).
    :param ti_try: the task instance's current try.
    :param ti_end: epoch seconds the task instance ended, if it did.
    :param current: this is the task instance's latest job (False: an earlier try's).
    :param ti_exists: the task instance's row exists (False: its DAG run was deleted). A row with no state is a task
        that was cleared and waits to be scheduled again.
    :param verified: the record is the task's own (from its ``task_state_store``, which only the task and the
        DAG's task-instance editors write); False: only its XCom names the job, which any task and the DAG's XCom
        editors may write -- shown, but no platform is asked about it and the sweeper never acts on it.
    :param live: what the job's platform said of it lately, for a job whose record has not seen it end
        (:mod:`airflow_provider_tao.livestate`); None: not asked, or the platform did not answer.
    :param trial: the job is this trial of its task's search (``TAOAutoMLOperator``); None: the task's own job.
    """

    record: JobRecord
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    ti_state: str | None
    ti_try: int | None
    ti_end: float | None
    current: bool
    ti_exists: bool = True
    verified: bool = True
    live: JobStatus | None = None
    trial: int | None = None

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def platform(self) -> str:
        return str(self.record.handle.get("platform", ""))

    @property
    def conn_id(self) -> str | None:
        value = self.record.handle.get("conn_id")
        return str(value) if value else None

    @property
    def started_at(self) -> float:
        return float(self.record.handle.get("submitted_at") or 0.0)

    @property
    def state(self) -> str:
        """The job's state as far as Airflow knows: its end state, ``Running`` while its task waits on it, else
        ``Unknown`` (its task ended without seeing the job end: a killed worker, a job left running on purpose)."""
        if self.record.state != SUBMITTED:
            return self.record.state
        if self.live is not None and not self.live.not_found:  # the platform's word now, not a guess
            return self.live.state.value
        if self.current and self.ti_state in WAITING_TI_STATES | {"queued", "scheduled", "up_for_retry"}:
            return "Running"
        return "Unknown"

    @property
    def ended_at(self) -> float | None:
        if self.record.ended_at:
            return self.record.ended_at
        if self.live is not None and not self.live.not_found and not self.live.state.is_terminal:
            return None  # still on the platform: no end, its runtime grows
        return None if self.state == "Running" else self.ti_end

    def runtime_seconds(self, now: float | None = None) -> float:
        """The platform's run time once the job ended (:meth:`JobRecord.runtime_seconds`), else the time since its
        submission until its task ended (or ``now``)."""
        if self.record.run_seconds is not None:
            return self.record.run_seconds
        end = self.ended_at or now or time.time()
        return max(0.0, end - self.started_at)

    def gpu_hours(self, now: float | None = None) -> float | None:
        if self.record.gpu_count < 0:
            return None
        return self.record.gpu_count * self.record.num_nodes * self.runtime_seconds(now) / 3600

    def row(self, now: float | None = None) -> dict[str, Any]:
        """A flat, JSON-ready row (what ``airflow tao jobs -o json`` prints)."""
        gpu_hours = self.gpu_hours(now)
        return {
            "job_id": self.job_id,
            "platform": self.platform,
            "conn_id": self.conn_id,
            "state": self.state,
            "err_class": self.record.err_class or None,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
            "try_number": int(self.record.handle.get("try_number") or 1),
            "task_state": self.ti_state,
            "gpus": self.record.gpu_count,
            "nodes": self.record.num_nodes,
            "started": _iso(self.started_at),
            "ended": _iso(self.ended_at) if self.ended_at else None,
            "runtime_seconds": round(self.runtime_seconds(now), 1),
            "gpu_hours": None if gpu_hours is None else round(gpu_hours, 4),
            "name": self.record.handle.get("name"),
            "backend_job_id": self.record.handle.get("backend_job_id"),
            "results_dir": self.record.handle.get("results_dir"),
            "verified": self.verified,
            "state_from": "platform" if self.live is not None and self.record.state == SUBMITTED else "records",
            "exit_code": self.live.exit_code if self.live is not None else None,
            "message": self.live.message if self.live is not None else None,
        }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def load_jobs(
    session: Session,
    *,
    dag_ids: Collection[str] | None = None,
    run_id: str | None = None,
    include_history: bool = True,
    rejected: list[dict[str, Any]] | None = None,
) -> list[IndexedJob]:
    """Every job recorded in ``session``'s metadata database, newest first (:func:`join_records`).

    :param session: a metadata-database session.
    :param dag_ids: only these DAGs (e.g. the ones the user may read); None = all.
    :param run_id: only this DAG run.
    :param include_history: also the jobs of earlier tries.
    :param rejected: where to add the records refused as invalid (one row each, also logged).
    """
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    records: dict[TaskKey, list[Any]] = {}

    def collect(rows: Iterable[Any], slot: int, decode: Any) -> None:
        for row in rows:
            if dag_ids is not None and row.dag_id not in dag_ids:
                continue
            key = (row.dag_id, row.run_id, row.task_id, int(row.map_index))
            records.setdefault(key, [None, None])[slot] = decode(row)

    store = select(TaskStateStoreModel).where(TaskStateStoreModel.key == STATE_KEY)
    xcom = select(XComModel).where(XComModel.key == XCOM_RECORD)
    if run_id is not None:
        store = store.where(TaskStateStoreModel.run_id == run_id)
        xcom = xcom.where(XComModel.run_id == run_id)
    collect(session.scalars(store), 0, lambda row: _loads(row.value))
    collect(session.scalars(xcom), 1, lambda row: _loads(XComModel.deserialize_value(row)))
    searches: dict[TaskKey, list[Any]] = {}
    search = select(TaskStateStoreModel).where(TaskStateStoreModel.key == SEARCH_KEY)
    if run_id is not None:
        search = search.where(TaskStateStoreModel.run_id == run_id)
    for row in session.scalars(search):
        if dag_ids is None or row.dag_id in dag_ids:
            searches[(row.dag_id, row.run_id, row.task_id, int(row.map_index))] = _loads(row.value)

    instances: dict[TaskKey, Any] = {}  # TaskInstance rows
    for dag_id in {key[0] for key in records} | {key[0] for key in searches}:
        query = select(TaskInstance).where(TaskInstance.dag_id == dag_id)
        if run_id is not None:
            query = query.where(TaskInstance.run_id == run_id)
        for row in session.scalars(query):
            instances[(row.dag_id, row.run_id, row.task_id, int(row.map_index))] = row
    facts = {key: _ti_facts(row) for key, row in instances.items()}
    jobs = join_records(
        {key: (stored, pushed) for key, (stored, pushed) in records.items()},
        facts,
        include_history=include_history,
        rejected=rejected,
    )
    jobs += search_jobs(searches, facts)
    jobs.sort(key=lambda job: job.started_at, reverse=True)
    return jobs


def _ti_facts(ti: Any) -> dict[str, Any]:
    state = str(ti.state.value if hasattr(ti.state, "value") else ti.state) if ti.state else None
    return {"ti_state": state, "ti_try": ti.try_number, "ti_end": _epoch(ti.end_date)}


def join_records(
    records: Mapping[TaskKey, tuple[Any, Any]],
    instances: Mapping[TaskKey, Mapping[str, Any]],
    *,
    include_history: bool = True,
    rejected: list[dict[str, Any]] | None = None,
) -> list[IndexedJob]:
    """The jobs of task instances from their stored values, newest first.

    The ``task_state_store`` record is the task's own and wins; the XCom record (which others may write) is used only
    where the store has none (``[state_store] clear_on_success``), marked unverified. A value that is not a valid
    record of this very task instance (its job's name carries the task instance's digest) is refused and logged.

    :param records: per task instance, its ``task_state_store`` value and its XCom value (each None when absent).
    :param instances: per task instance, ``ti_state``, ``ti_try`` and ``ti_end`` of its row (absent: row gone).
    :param include_history: also the jobs of earlier tries.
    :param rejected: where to add the refused records (``dag_id, run_id, task_id, map_index, where, problem``).
    """
    jobs: list[IndexedJob] = []
    for key, (stored_value, pushed_value) in records.items():
        stored = _checked(key, stored_value, "task_state_store", rejected)
        pushed = _checked(key, pushed_value, "XCom", rejected)
        if stored is not None and pushed is not None and _which(pushed) != _which(stored):
            _refuse(key, "XCom", f"it names job {pushed.job_id}, the task's own record {stored.job_id}", rejected)
        latest = stored or pushed
        if latest is None:
            continue
        common = _task_instance_fields(key, instances.get(key))
        jobs += record_jobs(latest, include_history=include_history, verified=stored is not None, **common)
    jobs.sort(key=lambda job: job.started_at, reverse=True)
    return jobs


def _task_instance_fields(key: TaskKey, ti: Mapping[str, Any] | None) -> dict[str, Any]:
    """The :class:`IndexedJob` fields of the task instance ``key`` (``ti``: its row's facts; None: row gone)."""
    return {
        "dag_id": key[0],
        "run_id": key[1],
        "task_id": key[2],
        "map_index": key[3],
        "ti_state": ti["ti_state"] if ti else None,
        "ti_try": ti["ti_try"] if ti else None,
        "ti_end": ti["ti_end"] if ti else None,
        "ti_exists": ti is not None,
    }


def search_jobs(searches: Mapping[TaskKey, Any], instances: Mapping[TaskKey, Mapping[str, Any]]) -> list[IndexedJob]:
    """The trials' jobs of the searches (``TAOAutoMLOperator``'s state, by task instance): each one a current job
    of its search's task instance (:mod:`airflow_provider_tao.automl.index`), so a person cancels a trial by its
    job id and the sweeper judges it by its search task's state, as any job by its task's.

    :param searches: per task instance, its ``task_state_store`` search state.
    :param instances: per task instance, ``ti_state``, ``ti_try`` and ``ti_end`` of its row (absent: row gone).
    """
    jobs = []
    for key, value in searches.items():
        common = _task_instance_fields(key, instances.get(key))
        for number, record in trial_records(key, value):
            jobs.append(IndexedJob(record=record, current=True, verified=True, trial=number, **common))
    return jobs


def _checked(key: TaskKey, value: Any, where: str, rejected: list[dict[str, Any]] | None) -> JobRecord | None:
    """The record in ``value`` when it is a valid record of the task instance ``key``'s own job (its history kept to
    the task instance's jobs), else None (refused in a log line unless there is no value at all)."""
    if value is None:
        return None
    problem = record_problem(value, STATES)
    if problem is None and not names_task_instance(value["handle"], key[0], key[2], key[1], key[3]):
        problem = f"its job {str(value['handle'].get('name'))[:80]!r} is not one of this task instance's"
    record = JobRecord.from_json(value) if problem is None else None
    if record is None:
        _refuse(key, where, problem or "it is not a job record", rejected)
        return None
    history = [old for old in record.history if names_task_instance(old.get("handle") or {}, key[0], key[2], key[1],
                                                                     key[3])]  # fmt: skip
    return record if len(history) == len(record.history) else replace(record, history=history)


def _which(record: JobRecord) -> tuple[str, Any, Any]:
    return record.job_id, record.handle.get("platform"), record.handle.get("conn_id")


def _refuse(key: TaskKey, where: str, problem: str, rejected: list[dict[str, Any]] | None) -> None:
    log.warning("Ignored the TAO job record in the %s of %s.%s (%s, map index %s): %s", where, key[0], key[2], key[1],
                key[3], problem)  # fmt: skip
    if rejected is not None:
        rejected.append({"dag_id": key[0], "run_id": key[1], "task_id": key[2], "map_index": key[3],
                         "where": where, "problem": problem})  # fmt: skip


def record_jobs(latest: JobRecord, *, include_history: bool = True, **ti: Any) -> list[IndexedJob]:
    """A task instance's jobs from its record: the record's own (current), then its history's, newest first, each
    once. ``ti``: the :class:`IndexedJob` fields of the task instance (``dag_id`` ... ``ti_exists``)."""
    jobs = [IndexedJob(record=latest, current=True, **ti)]
    if include_history:
        seen = {latest.job_id}
        for old in reversed(latest.history):
            earlier = JobRecord.from_json(old)
            if earlier is not None and earlier.job_id not in seen:
                seen.add(earlier.job_id)
                jobs.append(IndexedJob(record=earlier, current=False, **ti))
    return jobs


def load_write_aheads(session: Session) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every task instance's write-ahead -- its chain record, kept before each submission: the platform, connection,
    job name and job id its newest job was submitted under -- with the task instance (``dag_id, run_id, task_id,
    map_index``). Who owns a job whose submission was never recorded (its worker died during it)."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import select

    found = []
    for row in session.scalars(select(TaskStateStoreModel).where(TaskStateStoreModel.key == CHAIN_KEY)):
        chain = _loads(row.value)
        if isinstance(chain, dict) and chain.get("job_name"):
            ti = {"dag_id": row.dag_id, "run_id": row.run_id, "task_id": row.task_id, "map_index": int(row.map_index)}
            found.append((ti, chain))
    return found


def find_job(session: Session, job_id: str) -> IndexedJob | None:
    """The job with this id (an exact id, or a unique prefix of at least 6 characters)."""
    matches = [job for job in load_jobs(session) if job.job_id == job_id]
    if not matches and len(job_id) >= 6:
        matches = [job for job in load_jobs(session) if job.job_id.startswith(job_id)]
        if len({job.job_id for job in matches}) > 1:
            raise LookupError(f"{job_id!r} matches several jobs: {', '.join(sorted({j.job_id for j in matches}))}")
    matches.sort(key=lambda job: not job.verified)  # a task's own record before one only an XCom holds
    return matches[0] if matches else None


def task_instance_state(
    session: Session, dag_id: str, run_id: str, task_id: str, map_index: int
) -> tuple[bool, str | None]:
    """Whether the task instance's row exists, and its state now (None: cleared, waiting to be scheduled)."""
    row = task_instance_row(session, dag_id, run_id, task_id, map_index)
    return (False, None) if row is None else (True, row[1])


def task_instance_row(
    session: Session, dag_id: str, run_id: str, task_id: str, map_index: int
) -> tuple[str, str | None] | None:
    """The task instance's id and state now (None: its row is gone; a state of None: cleared, waiting to be
    scheduled). Airflow gives a task instance a new id at each retry and clear."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    query = select(TaskInstance.id, TaskInstance.state).where(
        TaskInstance.dag_id == dag_id,
        TaskInstance.run_id == run_id,
        TaskInstance.task_id == task_id,
        TaskInstance.map_index == map_index,
    )
    row = session.execute(query).first()
    if row is None:
        return None
    return str(row.id), None if row.state is None else str(getattr(row.state, "value", row.state))


def task_state_lookup(session: Session) -> Callable[[Mapping[str, Any]], str | None]:
    """The Airflow state of a task instance named by ``{dag_id, run_id, task_id, map_index}`` (None: unknown), for
    :meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.reap_resources`."""

    def lookup(origin: Mapping[str, Any]) -> str | None:
        map_index = origin.get("map_index")
        return task_instance_state(
            session,
            str(origin.get("dag_id")),
            str(origin.get("run_id")),
            str(origin.get("task_id")),
            -1 if map_index in (None, "") else int(map_index),
        )[1]

    return lookup


def gpu_hours_by_dag_and_day(jobs: Iterable[IndexedJob], now: float | None = None) -> dict[str, dict[str, float]]:
    """GPU-hours per DAG per day (UTC day of the job's submission): ``{day: {dag_id: hours}}``, days ascending."""
    totals: dict[str, dict[str, float]] = {}
    for job in jobs:
        hours = job.gpu_hours(now)
        if hours is None:
            continue
        day = datetime.fromtimestamp(job.started_at, UTC).date().isoformat()
        per_dag = totals.setdefault(day, {})
        per_dag[job.dag_id] = per_dag.get(job.dag_id, 0.0) + hours
    return dict(sorted(totals.items()))

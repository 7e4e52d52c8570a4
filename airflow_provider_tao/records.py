"""What the operator keeps about a task instance's job, in what Airflow already stores.

One :class:`JobRecord` per task instance lives in ``task_state_store`` under :data:`STATE_KEY` (it survives retries;
``[state_store] clear_on_success`` may drop it once the task succeeded) and, for the current try, in the XCom
:data:`XCOM_RECORD` (cleared by Airflow when a new try starts, kept after success). The TAO jobs view and
``airflow tao`` read both back (:mod:`airflow_provider_tao.jobindex`); nothing else is stored anywhere.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_tao.jobs import JobHandle, JobState, _JsonValue
from airflow_provider_tao.record_checks import record_problem

#: ``task_state_store`` key of a task instance's record.
STATE_KEY = "tao_job"
#: ``task_state_store`` key of the chain record: ``{"conn_id", "position", "platform", "job_name", "job_id",
#: "attempts": [...]}`` -- where the newest submission went (written before it is made) and the attempts so far.
CHAIN_KEY = "tao_chain"
#: XCom key of the current try's record (pushed before the task defers, updated when it ends).
XCOM_RECORD = "tao_job"
#: Earlier jobs of a task instance kept in its record (other tries), newest last.
HISTORY_LIMIT = 20

#: ``JobRecord.state`` while the task waits on the job (the job's live state is on its platform, not in Airflow).
SUBMITTED = "Submitted"
#: Every ``JobRecord.state`` a record may hold.
STATES = frozenset({SUBMITTED, *(state.value for state in JobState)})


def task_instance_digest(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> str:
    """The task instance's part of its jobs' names: the same for every try, different for every run and map index
    (:meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.job_name_for` never shortens it)."""
    identity = f"{dag_id}\n{task_id}\n{run_id}\n{map_index}"
    return hashlib.sha256(identity.encode()).hexdigest()[:10]


def names_task_instance(handle: dict[str, Any], dag_id: str, task_id: str, run_id: str, map_index: int) -> bool:
    """Whether the job ``handle`` names is one of this task instance's (its name carries the task instance's digest):
    a record copied from another task instance's job does not."""
    name = handle.get("name")
    return isinstance(name, str) and name.endswith("-" + task_instance_digest(dag_id, task_id, run_id, map_index))


@dataclass(frozen=True)
class JobRecord(_JsonValue):
    """A task instance's job as the operator last saw it.

    :param handle: the job's handle (``JobHandle.to_json()``).
    :param consumed: a try succeeded with this job's result (a clear must run a new job).
    :param outputs: output name -> final URI.
    :param gpu_count: GPUs per node asked for (-1 = every GPU of the node).
    :param num_nodes: nodes asked for.
    :param cancel_on_kill: the task cancels the job when it is killed (False: the job is meant to outlive it).
    :param deadline: epoch seconds after which the task cancels the job (execution_timeout or ``[tao] lease_hours``).
    :param state: ``Submitted`` while the task waits, then the job's end state (``Complete``, ``Error``, ``Canceled``).
    :param err_class: the failure class of a job that did not complete.
    :param ended_at: epoch seconds the task saw the job end.
    :param run_seconds: the job's run time as its platform reports it (the attempt's ``run_seconds``: program start
        to end, no queue, no trigger hold) -- THE run time every view shows once the job has ended.
    :param history: earlier jobs of this task instance (their records without history), newest last.
    :param secret_conn_ids: connections whose secrets the job received (``storage_conn_id``): the job page and
        ``airflow tao logs`` hide their values in the job's log.
    """

    handle: dict[str, Any]
    consumed: bool = False
    outputs: dict[str, str] = field(default_factory=dict)
    gpu_count: int = 0
    num_nodes: int = 1
    cancel_on_kill: bool = True
    deadline: float | None = None
    state: str = SUBMITTED
    err_class: str = ""
    ended_at: float | None = None
    run_seconds: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    secret_conn_ids: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Any) -> JobRecord | None:
        """The record in ``data``, or None when it is not one: a foreign, damaged or forged value (the XCom holding a
        record is writable by others: :func:`~airflow_provider_tao.record_checks.record_problem` says what is
        wrong with it)."""
        if record_problem(data, STATES) is not None:
            return None
        known = cls._known(data)
        history = known.get("history")
        known["history"] = [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []
        try:
            return cls(**known)
        except TypeError:
            return None

    @property
    def job(self) -> JobHandle:
        return JobHandle.from_json(self.handle)

    @property
    def job_id(self) -> str:
        return str(self.handle["job_id"])

    def ended(
        self, state: str, *, err_class: str = "", consumed: bool | None = None, run_seconds: float | None = None
    ) -> JobRecord:
        """The record of the job once the task saw it end."""
        return replace(
            self,
            state=state,
            err_class=err_class,
            ended_at=time.time(),
            consumed=self.consumed if consumed is None else consumed,
            run_seconds=run_seconds,
        )

    def runtime_seconds(self, now: float | None = None) -> float:
        """The job's run time: the platform's once it ended, else from submission to its end (or ``now``)."""
        if self.run_seconds is not None:
            return self.run_seconds
        end = self.ended_at or now or time.time()
        return max(0.0, end - self.job.submitted_at)

    def successor(self, handle: JobHandle, **fields: Any) -> JobRecord:
        """The record of a new job of the same task instance; this one moves into the history."""
        history = [*self.history, {**self.to_json(), "history": []}][-HISTORY_LIMIT:]
        if self.job_id == handle.job_id:
            history = self.history
        return JobRecord(handle=handle.to_json(), history=history, **fields)

    def gpu_hours(self, now: float | None = None) -> float | None:
        """GPUs x nodes x hours from submission to the end (or ``now`` while it waits); None for "every GPU"."""
        if self.gpu_count < 0:
            return None
        return self.gpu_count * self.num_nodes * self.runtime_seconds(now) / 3600

"""A person's cancel is final in every state of its task: ``airflow tao cancel`` leaves a record the next try reads
before it submits anything.

While a try waits on the job, the job's ``canceled_by`` mark tells it (it fails with ERR_CANCELED). When no try waits
-- the task is up_for_retry, scheduled, queued, or cleared and not yet scheduled -- the next try would find the job
ended and submit a new one. So the CLI also keeps ``{"ti_id", "by", "at", "job"}`` in the task instance's
``task_state_store`` under :data:`CANCEL_KEY`, and a try whose task instance id is the recorded one fails with
ERR_CANCELED instead of submitting.

The record binds the task (dag, run, task, map index), not one task-instance id: Airflow gives a task instance a new
id when a try fails into up_for_retry (``prepare_db_for_next_try``), so a try that met a platform blip while it
decided, and went up for retry, must still honour it (issue 37, defect 1). It binds until a try honours it (fails
ERR_CANCELED, writing ``honoured_by``): a later clear (a person asking again) then runs the task again. The CLI
voids it when its cancel found the waiting try's job already ended (the person is told "left as it was").
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.jobindex import IndexedJob
    from airflow_provider_tao.jobs import JobHandle

#: ``task_state_store`` key of a person's cancel (next to the job record, so neither write overwrites the other).
CANCEL_KEY = "tao_cancel"
#: Task instance states in which a try of the same id may still start or run (None: cleared, not yet scheduled).
PENDING_TI_STATES = frozenset(
    {None, "scheduled", "queued", "up_for_retry", "up_for_reschedule", "restarting", "running", "deferred"}
)
#: Times the CLI records again when the task instance moved to its next try while it wrote.
_RECORD_ATTEMPTS = 3


def binding_cancel(context: Context) -> dict[str, Any] | None:
    """The person's cancel this try must honour (recorded, neither honoured by a try nor voided), or None."""
    request = context["task_state_store"].get(CANCEL_KEY)
    if not isinstance(request, dict) or request.get("honoured_by") is not None or request.get("void"):
        return None
    return request


def honour_cancel(context: Context, log: Any) -> None:
    """Record that this try honoured the person's cancel (best effort: the try fails ERR_CANCELED either way)."""
    try:
        request = context["task_state_store"].get(CANCEL_KEY)
        if isinstance(request, dict) and request.get("honoured_by") is None:
            context["task_state_store"].set(CANCEL_KEY, {**request, "honoured_by": context["ti"].try_number})
    except Exception as exc:
        log.warning("Could not record that the person's cancel was honoured: %s", exc)


def void_cancel(job: IndexedJob, log: Any) -> None:
    """The CLI's cancel found the waiting try's job already ended: its record binds nothing (the try takes the
    job's verdict; the person was told so). Best effort: a record left binding fails the task ERR_CANCELED."""
    try:
        _keep(job, {"ti_id": "", "by": "", "at": time.time(), "job": job.record.handle, "void": True})
    except Exception as exc:
        log.warning("Could not void the cancel record of job %s: %s", job.job_id, exc)


def record_cancel(job: IndexedJob, by: str, *, ended: bool = False) -> str | None:
    """Keep ``by``'s cancel of ``job`` for its task instance's next try; returns the task instance's state the cancel
    was kept for (``"cleared"`` for Airflow's None: a cleared task instance keeps the cancel too), or None when
    nothing was kept (the job is an earlier try's, or no try of the task instance will run again).

    Read, write, read again: a try that failed into up_for_retry meanwhile has a new id, which is recorded then
    (the id is kept for the record's readers; the record binds the task whatever its id). The state returned is the
    first one: a cancel kept for a try to come binds that try even if it has started since -- it may have read it
    (the caller voids only a cancel kept for a waiting try, which takes its job's own verdict).

    :param ended: the job has ended already: a try waiting on it (running, deferred) takes the job's own verdict,
        so nothing is kept for it (its state is returned) -- a record kept, then voided, binds a try that resumes in
        between (the pair explorer: the task's deadline stopped the job, then a person canceled it)."""
    from airflow_provider_tao.jobindex import WAITING_TI_STATES

    if not job.current:
        return None  # a person canceling an old job of the task instance has not canceled the task
    recorded: str | None = None
    kept_for: str | None = None
    for _ in range(_RECORD_ATTEMPTS):
        now = _task_instance_now(job)
        if now is None or now[1] not in PENDING_TI_STATES:
            return None
        ti_id, state = now
        if recorded is None and ended and state in WAITING_TI_STATES:
            return state
        if ti_id == recorded:
            break
        _keep(job, {"ti_id": ti_id, "by": by, "at": time.time(), "job": job.record.handle})
        recorded, kept_for = ti_id, kept_for or state or "cleared"
    return kept_for


def _task_instance_now(job: IndexedJob) -> tuple[str, str | None] | None:
    """The id and state of ``job``'s task instance, read now (None: its row is gone)."""
    from airflow.utils.session import create_session

    from airflow_provider_tao.jobindex import task_instance_row

    with create_session() as session:
        return task_instance_row(session, job.dag_id, job.run_id, job.task_id, job.map_index)


def _keep(job: IndexedJob, value: dict[str, Any]) -> None:
    """``value`` under :data:`CANCEL_KEY` in the task instance's ``task_state_store`` (the deployment's backend,
    kept as long as the store's default retention keeps what the task writes)."""
    from airflow.sdk import conf
    from airflow.state import TaskScope, get_state_backend
    from airflow.utils.session import create_session

    scope = TaskScope(dag_id=job.dag_id, run_id=job.run_id, task_id=job.task_id, map_index=job.map_index)
    days = conf.getint("state_store", "default_retention_days", fallback=0)
    expires_at = datetime.now(UTC) + timedelta(days=days) if days > 0 else None
    with create_session() as session:
        get_state_backend().set(scope, CANCEL_KEY, json.dumps(value), expires_at=expires_at, session=session)


def stop_canceled_job(handle: JobHandle, by: str, log: Any) -> None:
    """Cancel ``handle`` for ``by`` if it still runs (the CLI's cancel may have failed after its record) and clean up
    after it. Best effort: the try fails with ERR_CANCELED whatever the platform says now, and ``airflow tao reap``
    cancels a job whose task has failed."""
    from airflow_provider_tao.hooks import get_platform_hook

    try:
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        if not hook.get_job_status(handle).state.is_terminal:
            hook.cancel_job(handle, requested_by=by)
        hook.cleanup_job(handle)
    except Exception as exc:
        log.warning("Could not make sure job %s is stopped (%s); airflow tao reap stops it", handle.job_id, exc)

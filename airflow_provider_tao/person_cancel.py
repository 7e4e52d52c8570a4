"""A person's cancel is final in every state of its task: ``airflow tao cancel`` leaves a record the next try reads
before it submits anything.

While a try waits on the job, the job's ``canceled_by`` mark tells it (it fails with ERR_CANCELED). When no try waits
-- the task is up_for_retry, scheduled, queued, or cleared and not yet scheduled -- the next try would find the job
ended and submit a new one. So the CLI also keeps ``{"ti_id", "by", "at", "job"}`` in the task instance's
``task_state_store`` under :data:`CANCEL_KEY`, and a try whose task instance id is the recorded one fails with
ERR_CANCELED instead of submitting.

The id is what tells a person's cancel from a retry or a clear: Airflow gives a task instance a new id when a try
fails into up_for_retry and when it is cleared (``prepare_db_for_next_try``), and never between a retry's scheduling
and its run. The record therefore binds the try that runs next from the state the person saw: a later clear (a new
id, a person asking again) runs the task again, and a plain retry with no record resubmits as before.
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


def cancel_request(context: Context) -> dict[str, Any] | None:
    """The person's cancel this try must honour (its task instance id is the recorded one), or None."""
    request = context["task_state_store"].get(CANCEL_KEY)
    ti_id = getattr(context["ti"], "id", None)
    if not isinstance(request, dict) or ti_id is None or request.get("ti_id") != str(ti_id):
        return None
    return request


def record_cancel(job: IndexedJob, by: str) -> str | None:
    """Keep ``by``'s cancel of ``job`` for its task instance's next try; returns the task instance's state, or None
    when nothing was kept (the job is an earlier try's, or no try of the task instance will run again).

    Read, write, read again: a try that failed into up_for_retry meanwhile has a new id, which is recorded then."""
    if not job.current:
        return None  # a person canceling an old job of the task instance has not canceled the task
    recorded, state = None, None
    for _ in range(_RECORD_ATTEMPTS):
        now = _task_instance_now(job)
        if now is None or now[1] not in PENDING_TI_STATES:
            return None
        ti_id, state = now
        if ti_id == recorded:
            return state
        _keep(job, {"ti_id": ti_id, "by": by, "at": time.time(), "job": job.record.handle})
        recorded = ti_id
    return state


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

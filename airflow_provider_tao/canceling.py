"""A person's cancel of a job, as ``airflow tao cancel JOB`` and the job page's **Cancel** button run it: the cancel
kept for the task instance first (:func:`~airflow_provider_tao.person_cancel.record_cancel`, so its next try submits
nothing even if the platform refuses the cancel now), then the one cancel routine of the hook, marked with who asked
(``cli:<user>``, ``ui:<user>``): the task fails with ``ERR_CANCELED``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_tao.asking import asked_again
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.jobindex import WAITING_TI_STATES, IndexedJob
from airflow_provider_tao.person_cancel import record_cancel, void_cancel
from airflow_provider_tao.sweeper import task_resumes

log = logging.getLogger(__name__)
#: Times the person's cancel is asked again while the platform cannot be read (a blip, a status it could not tell),
#: the first pause in seconds, doubling.
CANCEL_ASKS, CANCEL_PAUSE = 3, 1.0
T = TypeVar("T")


def cancel_as_person(job: IndexedJob, hook: TAOPlatformHook, by: str) -> dict[str, Any]:
    """Cancel ``job`` as ``by``; what was done, as one row (``airflow tao cancel``'s output).

    :param job: the job, as Airflow's records know it.
    :param hook: its platform's hook, connection loaded.
    :param by: who cancels (``cli:<user>``, ``ui:<user>``): kept on the job and in the task's failure.
    """
    handle = job.record.job
    try:
        before = _asked(lambda: hook.get_job_status(handle), f"Reading the state of job {job.job_id}").state
    except Exception as exc:  # nothing kept, nothing canceled: the person is told to run it again
        return _row(job, "Unknown", False, "Unknown", by=by, note=unsent_note(exc, None))
    # Kept first: the task's next try reads it before submitting, even if the platform refuses the cancel now. A
    # search's trial keeps none: its job's canceled_by mark ends that trial alone, and the search goes on.
    ti_state = record_cancel(job, by, ended=before.is_terminal) if job.trial is None else job.ti_state
    # an ended job marked already (canceled before) is not this cancel's: only a mark its routine writes now is
    marked_before = before.is_terminal and _marked(hook, job, unread=True)
    try:
        stopped = _asked(lambda: hook.cancel_job(handle, requested_by=by), f"Canceling job {job.job_id}").over
    except Exception as exc:  # the person's cancel stands where it was kept; the job's is theirs to ask again
        kept = ti_state if job.trial is None else None  # a trial keeps no cancel record
        return _row(job, before.value, False, _state_now(hook, job), by=by, note=unsent_note(exc, kept))
    # Canceled only if the routine itself found the job running and marked it (its task then fails ERR_CANCELED
    # even if the job ends by itself meanwhile); one that ended since `before` keeps its verdict, and its task too.
    # One that had ended at `before` and runs again (the trigger requeued it) the routine canceled: kept as any.
    canceled = stopped and not marked_before and _marked(hook, job, unread=not before.is_terminal)
    if canceled and before.is_terminal and job.trial is None:
        ti_state = record_cancel(job, by)
    if not canceled and ti_state in WAITING_TI_STATES and job.trial is None:
        void_cancel(job, log)  # its waiting try takes the job's own verdict, as the person is told below
    if stopped and (canceled or not before.is_terminal) and not task_resumes(job):
        _cleanup(hook, job)  # no task will resume to clean up after it
    note = cancel_note(not canceled, ti_state) if job.trial is None else trial_note(canceled, job.trial)
    return _row(job, before.value, canceled, _state_now(hook, job), by=by, note=note)


def _asked(call: Callable[[], T], what: str) -> T:
    """``call`` asked again while it fails (a blip; a cancel routine that could not read the job decides nothing,
    ``DecideLater``)."""
    return asked_again(call, asks=CANCEL_ASKS, pause=CANCEL_PAUSE, log=log, what=what)


def _marked(hook: TAOPlatformHook, job: IndexedJob, *, unread: bool) -> bool:
    """Whether the job carries the person's cancel mark, read back after the routine stopped it; ``unread``: what a
    read that fails leaves (the job was running at the CLI's first read: the routine stopped it, so it is canceled
    and the kept cancel binds its task; it had ended then: it keeps its verdict, as the person is told)."""
    try:
        return bool(_asked(lambda: hook.canceled_by(job.record.job), f"Reading the cancel mark of job {job.job_id}"))
    except Exception as exc:
        left = "it was stopped, so it is canceled" if unread else "it had ended, so it keeps its verdict"
        log.warning("Could not read the cancel mark of job %s back (%s): %s", job.job_id, exc, left)
        return unread


def _cleanup(hook: TAOPlatformHook, job: IndexedJob) -> None:
    """Best effort: what a canceled job holds that no resumed task will let go of (the sweeper takes the rest)."""
    try:
        hook.cleanup_job(job.record.job)
    except Exception as exc:
        log.warning("Could not clean up after job %s (the sweeper will): %s", job.job_id, exc)


def _state_now(hook: TAOPlatformHook, job: IndexedJob) -> str:
    """The job's state as the person is shown it (a read that fails shows as Unknown: the row is still printed)."""
    try:
        return hook.get_job_status(job.record.job).state.value
    except Exception as exc:
        log.warning("Could not read the state of job %s: %s", job.job_id, exc)
        return "Unknown"


def _row(job: IndexedJob, was: str, canceled: bool, state: str, *, by: str, note: str) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "platform": job.platform,
        "dag_id": job.dag_id,
        "task_id": job.task_id,
        "run_id": job.run_id,
        "was": was,
        "canceled": canceled,
        "state": state,
        "by": by,
        "note": note,
    }


def unsent_note(exc: Exception, ti_state: str | None) -> str:
    """What happens after a cancel the platform could not be asked for, in words."""
    why = f"the platform could not cancel the job now ({str(exc)[:200]})"
    if ti_state is None:
        return f"{why}: run the cancel again"
    return f"{why}; the cancel is kept: its task fails with ERR_CANCELED when it resumes, and stops the job"


def trial_note(canceled: bool, trial: int) -> str:
    """What happens to the search of a canceled trial, in words."""
    if not canceled:
        return f"trial {trial} had already ended: left as it was"
    return f"trial {trial} is recorded canceled (never rerun, never ranked); the search goes on"


def cancel_note(ended: bool, ti_state: str | None) -> str:
    """What happens to the task of a canceled job, in words."""
    if ti_state in ("queued", "scheduled"):
        return f"its task ({ti_state}) fails with ERR_CANCELED as it starts, submitting nothing"
    if ti_state is not None and ti_state not in WAITING_TI_STATES:
        return f"its task ({ti_state}) fails with ERR_CANCELED when it next runs, submitting nothing"
    if ended:
        return "already ended: left as it was"
    return "its task fails with ERR_CANCELED"

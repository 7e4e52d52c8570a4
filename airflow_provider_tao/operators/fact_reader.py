"""The facts a decision needs (:class:`~airflow_provider_tao.operators.decisions.Facts`), read in one step.

Each read that fails becomes :data:`~airflow_provider_tao.operators.decisions.UNKNOWN` -- never an exception in the
middle of a verdict, never a guess. The marks are read last, right before the verdict: a person's cancel that lands
during the failure analysis (seconds of platform calls) counts too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.hooks.ownership import MARK_CANCEL, MARK_CANCELED_BY, MARK_CONSUMED, owner_of
from airflow_provider_tao.jobs import FailureAnalysis, JobState, JobStatus
from airflow_provider_tao.operators.decisions import UNKNOWN, Facts, state_fact
from airflow_provider_tao.person_cancel import binding_cancel

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.jobs import JobHandle

log = logging.getLogger(__name__)


def _read(what: str, read: Any) -> Any:
    try:
        return read()
    except Exception as exc:  # a read that failed is a fact of its own: unknown
        log.warning("Could not read %s: %s", what, exc)
        return UNKNOWN


def job_state(hook: TAOPlatformHook, handle: JobHandle) -> Any:
    """The job's state now; None when the platform no longer knows it; UNKNOWN when it could not tell."""
    return read_status(hook, handle)[0]


def read_status(hook: TAOPlatformHook, handle: JobHandle) -> tuple[Any, JobStatus | None]:
    """:func:`job_state` and the status it was read from (None when the read failed)."""
    status = _read(f"the state of job {handle.job_id}", lambda: hook.get_job_status(handle))
    return (UNKNOWN, None) if status is UNKNOWN else (state_fact(status), status)


def _optional_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def mark_facts(hook: TAOPlatformHook, handle: JobHandle) -> dict[str, Any]:
    """The job's marks as facts (all UNKNOWN when they could not be read)."""
    marks = _read(f"the marks of job {handle.job_id}", lambda: hook.read_marks(handle))
    if marks is UNKNOWN:
        return dict.fromkeys(("owner_try", "cancel_try", "canceled_by", "consumed_by"), UNKNOWN)
    who = marks.get(MARK_CANCELED_BY)
    return {
        "owner_try": owner_of(marks, handle.try_number),
        "cancel_try": _optional_int(marks.get(MARK_CANCEL)),
        "canceled_by": str(who) if who else None,
        "consumed_by": _optional_int(marks.get(MARK_CONSUMED)),
    }


def person_cancel(context: Context) -> Any:
    """Who canceled the task in a record that binds it (``airflow tao cancel``), None, or UNKNOWN."""
    request = _read("the task's cancel record", lambda: binding_cancel(context))
    if request is UNKNOWN or request is None:
        return request
    return str(request.get("by") or "a person")


def resume_facts(
    hook: TAOPlatformHook,
    handle: JobHandle,
    context: Context,
    outcome: str,
    cancel_on_kill: bool,
    *,
    over_budget: Callable[[], bool] | None = None,
) -> tuple[Facts, FailureAnalysis | None]:
    """The facts of a resumed task, and the failure analysis they carry (for its evidence in the log);
    ``over_budget`` reads whether the job passed its ``max_gpu_hours`` (outcome ``budget`` only)."""
    analysis: Any = None
    budget = None
    if outcome == "budget" and over_budget is not None:
        budget = _read(f"the GPU-hours of job {handle.job_id}", over_budget)
    if outcome == "error":
        analysis = _read(f"the failure analysis of job {handle.job_id}", lambda: hook.get_failure_analysis(handle))
    facts = Facts(
        try_number=int(context["ti"].try_number),
        state=job_state(hook, handle),
        person_cancel=person_cancel(context),
        outcome=outcome,
        err_class=UNKNOWN if analysis is UNKNOWN else (analysis.err_class if analysis else None),
        cancel_on_kill=cancel_on_kill,
        over_budget=budget,
        **mark_facts(hook, handle),  # last: see the module's docstring
    )
    return facts, (None if analysis is UNKNOWN else analysis)


def reattach_facts(hook: TAOPlatformHook, candidate: JobHandle, try_number: int) -> tuple[Facts, JobStatus | None]:
    """The facts of an earlier job a starting try may reattach to (the person's record was honoured before), and
    the status they were read from."""
    state, status = read_status(hook, candidate)
    if state not in (JobState.PENDING, JobState.RUNNING, JobState.PAUSED, JobState.COMPLETE):
        return Facts(try_number=try_number, state=state), status  # ended without a result: its marks change nothing
    return Facts(try_number=try_number, state=state, **mark_facts(hook, candidate)), status

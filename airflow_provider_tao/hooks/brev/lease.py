"""The lease of a Brev instance this provider creates, and the reaper's judgement of an instance by its lease.

A lease says who made the instance and until when it may live: created at, expires at (created + ``lease_hours``),
the owning dag / task / run / map index, the connection and the try. The instance's startup script writes it (on the
instance, see :mod:`~airflow_provider_tao.hooks.brev.remote`) from its first boot on, so an instance whose worker
died at any moment after ``brev create`` has one. Only instances whose lease names this provider and the instance
itself are ever reaped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.shared.reaping import FINISHED_TASK_STATES, task_over_by_record, task_words
from airflow_provider_tao.jobindex import WAITING_TI_STATES
from airflow_provider_tao.jobs import JobSpec

#: Who wrote a lease: only instances whose lease says so are ever reaped.
LEASE_CREATOR = "airflow-provider-tao"

#: What one scan of an instance read: its lease and this provider's running containers, ``"unread"`` (not in a
#: state an exec may reach), or the error text when it did not answer.
Scan = tuple[dict[str, Any] | None, list[remote.FoundContainer]] | str


@dataclass(frozen=True)
class ReapDecision:
    """What :meth:`BrevHook.reap <airflow_provider_tao.hooks.brev.BrevHook.reap>` did with one instance.

    :param instance: the instance name.
    :param action: ``deleted``; ``jobs canceled`` (its lease expired while its task still watches it: the jobs on it
        are canceled through the one cancel routine, the task fails with ERR_CANCELED and deletes the instance, or the
        next reap does); ``kept``; ``skipped`` (its lease could not be read, or it is being deleted); ``failed``
        (the delete failed); in a dry run ``would delete`` / ``would cancel jobs``.
    :param reason: why, in words (also logged).
    """

    instance: str
    action: str
    reason: str


def new_lease(spec: JobSpec, hours: float, conn_id: str | None, try_number: int) -> dict[str, Any]:
    """The lease of the instance ``spec`` runs on, from now for ``hours``."""
    now = time.time()
    return {
        "created_by": LEASE_CREATOR,
        "instance": spec.name,
        "job_name": spec.name,
        "created_at": round(now, 3),
        "expires_at": round(now + hours * 3600, 3),
        "lease_hours": hours,
        "conn_id": conn_id,
        "try_number": try_number,
        **{key: spec.origin.get(key, "") for key in ("dag_id", "task_id", "run_id", "map_index")},
    }


def own_lease(lease: Mapping[str, Any] | None, instance: str) -> bool:
    """Whether ``lease`` is this provider's lease of ``instance`` (only such instances are ever reaped)."""
    return lease is not None and lease.get("created_by") == LEASE_CREATOR and lease.get("instance") == instance


def judge(
    name: str,
    entry: Mapping[str, Any],
    scan: Scan,
    task_state: Callable[[Mapping[str, Any]], str | None] | None,
    *,
    now: float,
    origin: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """What the reaper does with one instance, and why: ``skipped`` / ``kept``; ``delete`` (its lease expired, or its
    task is finished and nothing of it runs there any more: a running job of a finished task is the orphan sweep's to
    judge, it may have been kept with ``cancel_on_kill=False``); ``cancel jobs`` (its lease expired while its task
    still watches it: the task must see the cancel, and deletes the instance).

    ``origin`` is the task instance this Airflow's records name as the instance's job's (``dag_id, run_id, task_id,
    map_index, name``): an instance that cannot be exec'd (it failed under its job, it was stopped) shows no lease,
    but the task's own instance -- named after its job -- is this provider's by that record, and goes once its task
    finished (its resume, which deletes it, never runs when the task is marked failed before it)."""
    status = str(entry.get("status"))
    if status == "DELETING":
        return "skipped", "it is being deleted already"
    if scan == "unread":
        unread = f"it is {status}: its lease cannot be read without starting it"
        over, why = task_over_by_record(origin, name, task_state)
        if over:
            return "delete", f"it is {status} and {why}"
        return "skipped", f"{unread}; {why}" if why else unread
    if isinstance(scan, str):
        return "skipped", f"its lease could not be read: {scan}"
    lease, running = scan
    if lease is None or not own_lease(lease, name):
        return "kept", "not created by this provider (no lease of its own)"
    owner = task_words(lease)
    expires = float(lease.get("expires_at") or 0)
    state = task_state(lease) if task_state is not None else None
    jobs = ", ".join(c.job_id for c in running)
    if now >= expires:
        reason = (
            f"its lease expired at {utc(expires)} (created {utc(float(lease.get('created_at') or 0))} "
            f"with lease_hours={lease.get('lease_hours')}) for task {owner}"
        )
        if state in WAITING_TI_STATES and running:  # the task sees the cancel and cleans up
            return (
                "cancel jobs",
                f"{reason}; its task is {state}: job(s) {jobs} canceled, the task deletes the instance",
            )
        return "delete", reason
    if state in FINISHED_TASK_STATES and running:
        # the instance goes once nothing runs on it, or with its lease
        return "kept", f"leased until {utc(expires)}; its task {owner} is {state} but job(s) {jobs} still run on it"
    if state in FINISHED_TASK_STATES:
        return "delete", f"its task {owner} is {state}"
    known = f"is {state}" if state else "is not finished (or unknown to this Airflow)"
    return "kept", f"leased until {utc(expires)}; its task {owner} {known}"


def task_state_lookup(ti: Any) -> Callable[[Mapping[str, Any]], str | None]:
    """For :meth:`BrevHook.reap <airflow_provider_tao.hooks.brev.BrevHook.reap>` in a task: the Airflow state of a
    lease's task instance, asked through the running task's ``ti`` (``get_task_states``); None when this Airflow does
    not know it.

    :param ti: the reaping task's task instance (``context["ti"]``).
    """

    def lookup(lease: Mapping[str, Any]) -> str | None:
        map_index = int(lease.get("map_index") or -1)
        states = ti.get_task_states(
            dag_id=str(lease["dag_id"]),
            task_ids=[str(lease["task_id"])],
            run_ids=[str(lease["run_id"])],
            map_index=map_index,
        )
        key = str(lease["task_id"]) if map_index < 0 else f"{lease['task_id']}_{map_index}"
        state = (states.get(str(lease["run_id"])) or {}).get(key)
        return str(state) if state is not None else None

    return lookup


def utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))

"""The orphan sweeper: cancels the jobs no Airflow task watches any more -- ``airflow tao reap`` and the
``tao_orphan_sweeper`` maintenance DAG.

Airflow tells a job's task when it is killed (the operator's ``on_kill``, the trigger's ``on_kill``), but not always:
a task marked failed or cleared in the first seconds after it deferred, before a triggerer picked its trigger up, gets
no ``on_kill``; a worker or triggerer host can die for good. Per ``tao_*`` connection the sweeper makes ONE list call
of the jobs this provider started that the platform still runs (:meth:`~airflow_provider_tao.hooks.base.
TAOPlatformHook.list_active_jobs`), joins them with what Airflow recorded about their tasks
(:mod:`airflow_provider_tao.jobindex`) and cancels, through the one cancel routine
(:meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.cancel_job`), every job whose task instance is no longer
running or deferred and whose task asked for ``cancel_on_kill`` (plus jobs past their task's deadline, which
carries ``[tao] lease_hours``). A lease never overrides those ownership rules.
It never cancels a job of a live task, nor one this Airflow has no record of (another deployment's, or a job whose
submitting try died before recording it: its next try adopts it by name). Every decision is logged with its reason.
Platforms that rent machines for jobs reap those too (:meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.
reap_resources`: Brev's leased instances).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobindex import WAITING_TI_STATES, WANTED_TI_STATES, IndexedJob

if TYPE_CHECKING:
    from airflow_provider_tao.hooks.base import Recorded, TAOPlatformHook
    from airflow_provider_tao.jobs import JobHandle

log = logging.getLogger(__name__)

#: Re-reads a task instance's state just before its job is canceled: why to keep the job after all, or None.
Recheck = Callable[[IndexedJob], str | None]


def verdict(
    hook: TAOPlatformHook, handle: JobHandle, job: IndexedJob | None, now: float, min_age: float
) -> tuple[bool, str]:
    """The sweeper's one rule: (cancel it?, why) for an active job ``handle`` that Airflow knows as ``job``.

    :param hook: the job's platform hook (for its lease).
    :param handle: the job as its platform lists it.
    :param job: the job as Airflow recorded it, or None when no task record names it.
    :param now: epoch seconds.
    :param min_age: seconds: younger jobs are kept whatever their task does.
    """
    from airflow_provider_tao.operators.decisions import Act, Facts, Situation, decide

    if job is None:
        facts = Facts(try_number=handle.try_number, young=now - handle.submitted_at < min_age, recorded=False)
    else:
        deadline = job.record.deadline
        facts = Facts(
            try_number=handle.try_number,
            young=now - handle.submitted_at < min_age,
            same_connection=(job.platform, job.conn_id) == (hook.platform, hook.conn_id),
            current=job.current,
            task_state=job.ti_state,
            task_exists=job.ti_exists,
            past_deadline=bool(deadline and now > deadline + min_age),
            cancel_on_kill=job.record.cancel_on_kill,
        )
    decided = decide(facts, Situation.SWEEP)  # the rule and its table: operators/decisions.py, docs/decisions.md
    if decided.why.startswith("orphan") and hook.lease_expired(handle, now):  # read only for an orphan: its why
        decided = decide(replace(facts, lease_expired=True), Situation.SWEEP)
    why = decided.why
    if why.startswith("judged only through") and job is not None:
        why = f"started through the {job.platform} connection {job.conn_id}"
    return decided.act is Act.CANCEL, why


def known_jobs(jobs: Iterable[IndexedJob]) -> dict[str, IndexedJob]:
    """The jobs the sweeper judges, by job id: each job's newest record (``jobs`` lists the newest first) among the
    tasks' own records -- a record only an XCom holds (others may write it) never steers a cancel."""
    known: dict[str, IndexedJob] = {}
    for job in jobs:
        if job.verified:
            known.setdefault(job.job_id, job)
    return known


def recorded_as(job: IndexedJob | None, handle: JobHandle) -> IndexedJob | None:
    """``job`` when it is a task's own record of the very job its platform lists as ``handle`` (same id, same
    name), else None: a record only an XCom holds (others may write it) or one copying another job's id never
    steers a cancel (``docs/security.md``)."""
    if job is None:
        return None
    if not job.verified or (handle.name and job.record.handle.get("name") != handle.name):
        log.warning("The record of job %s in %s.%s is not that task's own record of it: not used", handle.job_id,
                    job.dag_id, job.task_id)  # fmt: skip
        return None
    return job


def task_resumes(job: IndexedJob | None) -> bool:
    """Whether the job's task still waits on it: it sees the cancel and cleans up after the job itself (a Brev
    instance deleted under a waiting task would read as a lost instance, not as a cancel)."""
    return job is not None and job.current and job.ti_state in WAITING_TI_STATES


def sweep_connection(
    hook: TAOPlatformHook,
    known: Mapping[str, IndexedJob],
    *,
    now: float,
    min_age: float,
    dry_run: bool,
    recheck: Recheck,
    active: Sequence[JobHandle] | None = None,
    machines: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Sweep one connection: one list call, a decision per active job, a cancel per orphan.

    :param hook: the connection's hook (connection loaded).
    :param known: the jobs Airflow recorded, by job id.
    :param now: epoch seconds the records were read at.
    :param min_age: seconds: younger jobs are kept.
    :param dry_run: decide and report, cancel nothing.
    :param recheck: asks the task instance of an orphan again right before its job is canceled (a task cleared
        since the records were read wants its job back).
    :param active: the connection's active jobs when listed already (before its machines were reaped: a job a
        machine's reaping stopped is still reported); None lists them now.
    :param machines: the rows of :func:`sweep_machines` on this connection: a job on a machine (a Brev instance, a
        Kubernetes Job) whose reaping stopped it is reported as that reaping's doing, not judged again.
    :returns: one row per job: ``platform, conn_id, job_id, name, dag_id, task_id, task_state, action, why``.
    """
    rows = []
    stopped_by = {row["name"]: row for row in machines if row["action"] in MACHINE_STOPS_JOBS}
    for handle in hook.list_active_jobs() if active is None else active:
        job = recorded_as(known.get(handle.job_id), handle)
        cancel, why = verdict(hook, handle, job, now, min_age)
        action = "kept"
        machine = stopped_by.get(handle.backend_job_id or "")
        if machine is not None:
            action = MACHINE_STOPS_JOBS[machine["action"]]
            why = f"its {machine.get('kind') or 'machine'} {machine['name']}: {machine['why']}"
        elif cancel and dry_run:
            action = "would cancel"
        elif cancel:
            came_back = recheck(job) if job is not None and job.ti_state not in WANTED_TI_STATES else None
            if came_back:
                why = came_back
            else:
                action, why = _cancel(hook, handle, job, why)
        row = {
            "platform": hook.platform,
            "conn_id": hook.conn_id,
            "job_id": handle.job_id,
            "name": handle.name,
            "dag_id": job.dag_id if job else None,
            "task_id": job.task_id if job else None,
            "task_state": job.ti_state if job else None,
            "action": action,
            "why": why,
        }
        log.info("%s", describe(row))
        rows.append(row)
    return rows


#: What a machine's reaping did to the jobs on it, by the machine's action (a dry run says what it would do).
MACHINE_STOPS_JOBS = {
    "deleted": "canceled",
    "jobs canceled": "canceled",
    "would delete": "would cancel",
    "would cancel jobs": "would cancel",
}


def sweep_machines(
    hook: TAOPlatformHook,
    task_state: Callable[[Mapping[str, Any]], str | None],
    *,
    dry_run: bool,
    recorded: Recorded | None = None,
) -> list[dict[str, Any]]:
    """What outlives its job besides the job -- the machines a platform rents for jobs (Brev's instances), a
    Kubernetes Job left suspended, a Docker container never started --, reaped by the platform's own rule
    (:meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.reap_resources`); one row per resource, each logged.

    :param hook: the connection's hook (connection loaded).
    :param task_state: the Airflow state of a task instance given as ``{dag_id, run_id, task_id, map_index}``.
    :param dry_run: decide and report, stop nothing.
    :param recorded: this connection's jobs as Airflow's task records hold them (:func:`recorded_jobs`).
    """
    rows = []
    for resource in hook.reap_resources(task_state, dry_run=dry_run, recorded=recorded):
        row = {"platform": hook.platform, "conn_id": hook.conn_id, "job_id": None, "name": resource["resource"],
               "kind": resource.get("kind", "machine"), "action": resource["action"],
               "why": resource["why"]}  # fmt: skip
        log.info("%s", describe(row))
        rows.append(row)
    return rows


def recorded_jobs(
    jobs: Iterable[IndexedJob],
    platform: str,
    conn_id: str | None,
    write_aheads: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]] = (),
) -> dict[str, dict[str, Any]]:
    """What Airflow's task records say ran through one connection: a job's platform id (``backend_job_id``: a Brev
    instance's name, a container's id) -> its task instance (``dag_id, run_id, task_id, map_index``) and its job's
    ``name``; the first record of ``jobs`` naming an id wins (:func:`~airflow_provider_tao.jobindex.load_jobs` lists
    the newest first). A job whose submission was never recorded (its worker died during it) is known by its
    write-ahead (:func:`~airflow_provider_tao.jobindex.load_write_aheads`), under its name."""
    found: dict[str, dict[str, Any]] = {}
    for job in jobs:
        backend_id = str(job.record.handle.get("backend_job_id") or "")
        if backend_id and job.verified and (job.platform, job.conn_id) == (platform, conn_id):
            origin = {"dag_id": job.dag_id, "run_id": job.run_id, "task_id": job.task_id, "map_index": job.map_index}
            found.setdefault(backend_id, {**origin, "name": job.record.handle.get("name")})
    for ti, chain in write_aheads:
        if (chain.get("platform"), chain.get("conn_id")) == (platform, conn_id):
            found.setdefault(str(chain["job_name"]), {**ti, "name": chain["job_name"]})
    return found


#: A sweep row's action (and reason, where the sweep's own no longer holds) for what the cancel routine did: a job
#: that ended between the listing and the cancel kept its own verdict; one a newer try claimed meanwhile (Kubernetes'
#: patch tests the marks it read) is that try's.
SWEEP_ROWS: dict[CancelOutcome, tuple[str, str | None]] = {
    CancelOutcome.STOPPED: ("canceled", None),
    CancelOutcome.ENDED: ("ended", None),
    CancelOutcome.NOT_OURS: ("kept", "a newer try of its task claimed it as it was canceled"),
}


def _cancel(hook: TAOPlatformHook, handle: JobHandle, job: IndexedJob | None, why: str) -> tuple[str, str]:
    """The reaper's cancel of one job: its row's action and reason."""
    try:
        outcome = hook.cancel_job(handle, requested_by=f"reap: {why}")  # decides through operators/decisions.py
        if outcome.over and not task_resumes(job):  # cleanup only after a job that has stopped (or had ended)
            hook.cleanup_job(handle)  # no task will resume to clean up after it
    except Exception as exc:  # one job the platform would not cancel must not stop the sweep
        log.warning("Canceling job %s on %s failed: %s", handle.job_id, hook.platform, exc)
        return "cancel failed", why
    action, reason = SWEEP_ROWS[outcome]
    return action, reason or why


def describe(row: Mapping[str, Any]) -> str:
    """One decision as a log line: what was done to which job (or machine, or other resource) of which task, and
    why."""
    what = f"job {row['job_id']}" if row.get("job_id") else f"{row.get('kind') or 'machine'} {row.get('name')}"
    task = f" of {row['dag_id']}.{row['task_id']}" if row.get("dag_id") else ""
    where = f" on {row['conn_id']}" if row.get("conn_id") else ""
    return f"{row['action']}: {row['platform']} {what}{where}{task} -- {row['why']}"


#: The connection the ``tao_orphan_sweeper`` DAG reads Airflow's metadata database through.
METADATA_CONN_ID = "tao_metadata_db"


def sweep_from_a_task(
    *,
    dry_run: bool = False,
    min_age_minutes: float = 0.0,
    timeout: float = 900,
    metadata_conn_id: str = METADATA_CONN_ID,
) -> list[dict]:
    """Run ``airflow tao reap`` from a task (the ``tao_orphan_sweeper`` DAG) and log each decision with its reason.

    The sweeper reads the metadata database (task records, task instance states, the ``tao_*`` connections), which
    Airflow 3 keeps away from task code: it replaces the database URL in a task's environment. So the sweep runs as
    the CLI in a child process given the database's URL from an Airflow connection made for it -- the way Airflow's
    upgrade guide tells maintenance tasks to reach the database. But in Airflow 3 every task may read every
    connection, so that connection hands the database to every DAG author: where DAG authors are not all trusted
    with it, run ``airflow tao reap --every 5`` as a service beside the scheduler instead (``docs/security.md``).

    :param dry_run: decide and report, cancel nothing.
    :param min_age_minutes: keep jobs younger than this.
    :param timeout: seconds the sweep may take.
    :param metadata_conn_id: the connection holding the metadata database's SQLAlchemy URL (extra
        ``sql_alchemy_conn``, or the connection's own URI).
    :returns: every decision (rows of ``airflow tao reap -o json``).
    :raises RuntimeError: the sweep could not run, or a connection could not be swept (after logging the rest).
    """
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__CORE__SQL_ALCHEMY_CONN"}
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = metadata_db_url(metadata_conn_id)
    argv = [sys.executable, "-m", "airflow", "tao", "reap", "-o", "json", "--min-age-minutes", str(min_age_minutes)]
    if dry_run:
        argv.append("--dry-run")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    rows = _rows(done.stdout) if done.returncode == 0 else None
    if rows is None:
        raise RuntimeError(f"airflow tao reap failed (exit {done.returncode}): {(done.stderr or done.stdout)[-3000:]}")
    for row in rows:
        log.info("%s", describe(row))
    failed = [row for row in rows if row.get("action") == "error"]
    if failed:
        raise RuntimeError(
            "Could not sweep: " + "; ".join(f"{r['platform']} connection {r['conn_id']}: {r['why']}" for r in failed)
        )
    return rows


def metadata_db_url(conn_id: str) -> str:
    """The metadata database's SQLAlchemy URL from the Airflow connection ``conn_id`` (masked in logs).

    :raises RuntimeError: no such connection -- saying how to make one.
    """
    from airflow.sdk.exceptions import AirflowNotFoundException
    from airflow.sdk.log import mask_secret

    from airflow_provider_tao.connections import get_connection

    try:
        conn = get_connection(conn_id)
    except AirflowNotFoundException:
        raise RuntimeError(
            f"The orphan sweeper reads Airflow's metadata database through the connection {conn_id!r}, which does not "
            "exist. Better: run `airflow tao reap --every 5` as a service beside the scheduler (it has the database; "
            "no task code gets it) and leave this DAG off. Else create the connection with the database's URL (the "
            f"value of [database] sql_alchemy_conn) in its extra, e.g. "
            f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "generic", "extra": {{"sql_alchemy_conn": '
            f'"postgresql://..."}}}}\' -- knowing that every task of the deployment can then read it.'
        ) from None
    url = str(conn.extra_dejson.get("sql_alchemy_conn") or conn.get_uri())
    if url.startswith("postgres://"):  # Airflow's URI scheme for Postgres connections; SQLAlchemy's is postgresql
        url = "postgresql://" + url.removeprefix("postgres://")
    mask_secret(url)
    return url


def _rows(stdout: str) -> list[dict[str, Any]] | None:
    """The rows ``airflow tao reap -o json`` printed (its last line; log lines may come before it)."""
    lines = stdout.strip().splitlines()
    try:
        rows = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return rows if isinstance(rows, list) else None

"""``airflow tao jobs | logs | cancel | reap``: what Airflow knows of the jobs (:mod:`airflow_provider_tao.jobindex`)
joined with what their platforms say (the hooks), and cancels through the one cancel routine."""

from __future__ import annotations

import getpass
import json
import logging
import re
import sys
import time
from argparse import Namespace
from collections.abc import Callable
from typing import Any, NoReturn

from airflow.cli.simple_table import AirflowConsole
from airflow.utils import cli as cli_utils
from airflow.utils.providers_configuration_loader import providers_configuration_loaded
from airflow.utils.session import create_session

from airflow_provider_tao.canceling import cancel_as_person
from airflow_provider_tao.hooks import PLATFORMS, get_platform_hook
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.hooks.shared.secrets import redact
from airflow_provider_tao.jobindex import (
    WANTED_TI_STATES,
    IndexedJob,
    find_job,
    load_jobs,
    load_write_aheads,
    task_instance_state,
    task_state_lookup,
)
from airflow_provider_tao.joblog import readable_log
from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.livestate import LiveStates
from airflow_provider_tao.received_secrets import job_secrets
from airflow_provider_tao.sweeper import describe, known_jobs, recorded_jobs, sweep_connection, sweep_machines

log = logging.getLogger(__name__)

#: What a job id given on the command line may look like (ours are 12 hex digits).
JOB_ID = re.compile(r"^[0-9a-f]{6,32}$")
#: Most log bytes ``airflow tao logs`` reads (in chunks of the hook's limit).
MAX_LOG_BYTES = 64 << 20


def _print(rows: list[dict[str, Any]], output: str) -> None:
    """Rows as Airflow's CLI prints them; ``json`` keeps numbers, booleans and nulls as JSON (scripts read it)."""
    if output == "json":
        print(json.dumps(rows, default=str))
    else:
        AirflowConsole().print_as(data=rows, output=output)


def _fail(message: str) -> NoReturn:
    print(f"airflow tao: {message}", file=sys.stderr)
    sys.exit(1)


def _hook(platform: str, conn_id: str | None) -> TAOPlatformHook:
    hook = get_platform_hook(platform, conn_id)
    hook.load_connection()
    return hook


def _job(job_id: str) -> IndexedJob:
    if not JOB_ID.match(job_id):
        _fail(f"{job_id!r} is not a job id: use the 12 hex digits of the task's XCom job_id (or 6+ of them)")
    with create_session() as session:
        try:
            job = find_job(session, job_id)
        except LookupError as exc:
            _fail(str(exc))
    if job is None:
        _fail(f"no job {job_id} in this Airflow's task records (airflow tao jobs lists them)")
    assert job is not None
    if job.platform not in PLATFORMS:
        _fail(f"job {job.job_id} ran on platform {job.platform!r}, which this installation does not have")
    return job


def _job_on_platform(job_id: str) -> tuple[IndexedJob, JobHandle, TAOPlatformHook]:
    """The job Airflow knows by ``job_id``, its handle and its platform's hook (connection loaded)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_provider_tao.hooks.base import JobValidationError

    job = _job(job_id)
    handle = job.record.job
    try:
        return job, handle, _hook(handle.platform, handle.conn_id)
    except (AirflowNotFoundException, JobValidationError) as exc:  # words, not a traceback
        _fail(
            f"job {job.job_id} ran on the {handle.platform} connection {handle.conn_id!r}, which cannot be read: {exc}"
        )


@cli_utils.action_cli(check_db=False)
@providers_configuration_loaded
def list_jobs(args: Namespace) -> None:
    """``airflow tao jobs``."""
    with create_session() as session:
        jobs = load_jobs(session, dag_ids={args.dag_id} if args.dag_id else None, run_id=args.run_id)
    jobs = LiveStates().apply(jobs)  # the jobs not seen ending: their platforms' word now, one call per connection
    now = time.time()
    rows = [
        job.row(now)
        for job in jobs
        if (not args.platform or job.platform == args.platform.lower())
        and (not args.state or job.state.lower() == args.state.lower())  # `-s error` finds the Error jobs
    ][: max(0, args.limit)]
    if args.output == "table":
        keys = ("job_id", "platform", "state", "dag_id", "task_id", "try_number", "gpus", "nodes", "gpu_hours")
        rows = [{key: row[key] for key in keys} | {"run_id": row["run_id"]} for row in rows]
    _print(rows, args.output)


@cli_utils.action_cli(check_db=False)
@providers_configuration_loaded
def job_logs(args: Namespace) -> None:
    """``airflow tao logs JOB``."""
    job, handle, hook = _job_on_platform(args.job_id)
    people = args.output not in ("json", "yaml")
    secrets = job_secrets(job.record.secret_conn_ids, job.conn_id, job.platform)  # no task-log masker out here
    if args.tail is not None and people:
        text = _tail(hook, handle, max(1, args.tail), secrets)
    elif args.tail is not None:
        text, cursor = hook.get_job_logs(handle, "", tail=max(1, args.tail))
    else:
        parts, cursor, size = [], "", 0
        while size < MAX_LOG_BYTES:
            chunk, next_cursor = hook.get_job_logs(handle, cursor)
            if not chunk or next_cursor == cursor:
                break
            parts.append(chunk)
            size += len(chunk)
            cursor = next_cursor
        text = "".join(parts)
    if not people:  # for machines: the log as the job wrote it
        _print([{"job_id": job.job_id, "platform": job.platform, "log": redact(text, secrets)}], args.output)
    else:  # for people: progress bars at their last state, the runner's heartbeats collapsed into words
        text = text if args.tail is not None else readable_log(text, secrets)
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


#: Most raw lines ``logs --tail N`` reads to find N readable ones (progress bars and heartbeats collapse).
MAX_TAIL_LINES = 100_000


def _tail(hook: TAOPlatformHook, handle: JobHandle, lines: int, secrets: list[str]) -> str:
    """The last ``lines`` lines of the job's log as people read them: progress lines that collapse into one do not
    count, so more raw lines are read (four times as many each round) until ``lines`` readable ones are there or
    the log has no more."""
    asked = lines
    while True:
        raw, _ = hook.get_job_logs(handle, "", tail=asked)
        shown = readable_log(raw, secrets).rstrip("\n").split("\n")
        if len(shown) >= lines or raw.count("\n") < asked or asked >= MAX_TAIL_LINES:
            return "\n".join(shown[-lines:])
        asked = min(asked * 4, MAX_TAIL_LINES)


@cli_utils.action_cli(check_db=False)
@providers_configuration_loaded
def cancel_job(args: Namespace) -> None:
    """``airflow tao cancel JOB``: the one cancel routine, as a person (the task then fails with ERR_CANCELED)."""
    job, _, hook = _job_on_platform(args.job_id)
    _print([cancel_as_person(job, hook, f"cli:{getpass.getuser()}")], args.output)


@cli_utils.action_cli(check_db=False)
@providers_configuration_loaded
def reap(args: Namespace) -> None:
    """``airflow tao reap``: the orphan sweeper (:mod:`airflow_provider_tao.sweeper`) on every connection jobs were
    started on and every ``tao_*`` connection of the metadata database; with ``--every``, again and again (a
    service beside the scheduler: the sweep reads the database outside task code)."""
    every = getattr(args, "every", None)
    if every is None:
        _sweep(args)
        return
    if every <= 0:
        _fail(f"--every {every}: give the minutes between sweeps, more than 0")
    run_every(every * 60, lambda: _sweep(args))


def run_every(seconds: float, sweep: Callable[[], None], sleep: Callable[[float], None] = time.sleep) -> None:
    """``sweep`` now and every ``seconds`` after, for ever: a sweep that fails is logged and the next one runs (an
    unreachable database or platform now is no reason to stop sweeping)."""
    while True:
        try:
            sweep()
        except Exception:
            log.exception("The sweep failed; the next one runs in %.0f s", seconds)
        sys.stdout.flush()
        sleep(seconds)


def _sweep(args: Namespace) -> None:
    """One sweep of every connection, its decisions printed."""
    from airflow.models.connection import Connection
    from sqlalchemy import select

    conn_types = {conn_type: platform for platform, (conn_type, _) in PLATFORMS.items()}
    with create_session() as session:
        jobs = load_jobs(session)
        write_aheads = load_write_aheads(session)
        configured = session.execute(
            select(Connection.conn_id, Connection.conn_type).where(Connection.conn_type.in_(conn_types))
        ).all()
    known = known_jobs(jobs)
    targets = {(j.platform, j.conn_id) for j in jobs if j.platform in PLATFORMS}
    targets |= {(conn_types[conn_type], conn_id) for conn_id, conn_type in configured}
    now, min_age = time.time(), max(0.0, args.min_age_minutes) * 60
    rows: list[dict[str, Any]] = []
    for platform, conn_id in sorted(targets, key=lambda t: (t[0], t[1] or "")):
        try:
            hook = _hook(platform, conn_id)
            active = hook.list_active_jobs()  # before the machines: a job their reaping stops is still reported
            recorded = recorded_jobs(jobs, platform, conn_id, write_aheads)
            with create_session() as session:
                machines = sweep_machines(hook, task_state_lookup(session), dry_run=args.dry_run, recorded=recorded)
            rows += machines
            rows += sweep_connection(
                hook, known, now=now, min_age=min_age, dry_run=args.dry_run, recheck=_recheck, active=active,
                machines=machines,
            )  # fmt: skip
        except Exception as exc:  # one unreachable platform must not stop the others' sweeping
            rows.append({"platform": platform, "conn_id": conn_id, "job_id": None, "action": "error", "why": str(exc)})
            log.warning("%s", describe(rows[-1]))
    _print_reaped(rows, len(targets), args)


def _print_reaped(rows: list[dict[str, Any]], connections: int, args: Namespace) -> None:
    """``reap``'s decisions; none, in a table, in words (Airflow's table of nothing says only "No data found")."""
    if rows or args.output != "table":
        _print(rows, args.output)
        return
    print(
        f"Nothing to reap: no orphaned job or machine on {connections} connection(s)"
        + (" (dry run: nothing would be canceled)." if args.dry_run else ".")
    )


def _recheck(job: IndexedJob) -> str | None:
    """Why to keep an orphan's job after all: its task instance, read again now, wants it (a clear since)."""
    with create_session() as session:
        exists, state = task_instance_state(session, job.dag_id, job.run_id, job.task_id, job.map_index)
    if exists and (state is None or state in WANTED_TI_STATES):
        return f"its task is {state or 'cleared'} again"
    return None

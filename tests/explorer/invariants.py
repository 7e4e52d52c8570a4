"""The invariants, counted on the backend (:mod:`tests.explorer.backends`) once a schedule's task instance ended.

* I1 never two live jobs of one task instance (sampled at every boundary and at the end);
* I2 every job that ran is the task's recorded job, adoptable by its name (the newest, while the task has not
  succeeded with another), or stopped by a cancel -- and none is left running after the task ended;
* I3 a person's cancel that stopped the job (the CLI reports it canceled: its routine found the job running) is
  final: the task fails with ERR_CANCELED and no job of the name starts after;
* I4 an old try never cancels a newer try's job: a task interrupted only by deaths, a clear, a timeout or an outage
  ends successfully on its retries, its recorded job not stopped;
* I5 the outputs returned are those of the job that ran: the result's job completed on the backend and its results
  folder holds what that job wrote;
* I6 nothing of the platform's is held after the task ended and one sweep ran (:meth:`Backend.leftovers`);
* I7 the connection's secret (:data:`tests.explorer.backends.SECRET`) is in none of: the task's log lines (as
  Airflow's masker leaves them), the trigger's serialized kwargs, the backend's records of the jobs
  (:meth:`Backend.records`: job specs, ``docker inspect``, sbatch scripts, Slurm's job record).
"""

from __future__ import annotations

import time
from typing import Any

from airflow_provider_tao.jobindex import IndexedJob, record_jobs
from airflow_provider_tao.records import CHAIN_KEY, STATE_KEY, JobRecord
from airflow_provider_tao.sweeper import recorded_jobs
from tests.explorer.backends import SECRET, Backend, BackendJob
from tests.explorer.simulate import Outcome, Schedule

#: How a task instance ends when a person marks it (the outcome's error is the mark).
MARKS = frozenset({"mark_failed", "mark_success"})
SETTLE_SECONDS = 60.0  # a bound, not a wait: a cancel's grace (SIGTERM, then SIGKILL) landing late on a busy machine
#: Interruptions after which the task is expected to end successfully on its retries.
RECOVERABLE = frozenset({"worker_kill", "triggerer_kill", "clear", "outage", "execution_timeout", None})


def settled(backend: Backend, name: str, expected: frozenset[str] = frozenset()) -> list[BackendJob]:
    """The name's jobs once none is live, or ``SETTLE_SECONDS`` passed; ``expected`` jobs not listed yet are waited
    for as live ones (under load the SLURM ok job was once in neither squeue nor sacct 1 s after it ended)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    jobs = backend.jobs(name)
    while (any(job.live for job in jobs) or not expected <= {job.job_id for job in jobs}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
        jobs = backend.jobs(name)
    return jobs


def violations(backend: Backend, schedule: Schedule, outcome: Outcome, store: Any) -> list[str]:
    found: list[str] = []
    result = outcome.result if outcome.state == "success" and isinstance(outcome.result, dict) else {}
    jobs = settled(backend, outcome.job_name, frozenset({str(result["job_id"])} if "job_id" in result else ()))
    record = JobRecord.from_json(store.get(STATE_KEY))
    recorded = record.job_id if record else None
    # jobs an earlier try recorded (and a later try replaced) are accounted for: the record's history holds them
    accounted = {recorded, *(str(old.get("handle", {}).get("job_id")) for old in (record.history if record else []))}
    if outcome.live_seen > 1:
        found.append(f"I1: {outcome.live_seen} live jobs of the task instance at once")
    for job in jobs:
        if job.live:
            found.append(f"I2: job {job.job_id} still runs after the task ended ({outcome.state})")
        # not ran: removed while queued; cancel-marked: the cancel reached it and it exited on its own before the
        # platform's stop landed (a Job controller lagging under load; a job live past the settle is caught above)
        elif job.job_id in outcome.live_at_end and job.ran and not job.stopped and not job.cancel_marked:
            found.append(f"I2: job {job.job_id} was left running when the task ended ({outcome.state}: "
                         f"{outcome.error[:120]}) and ran to its end (exit {job.exit_code})")  # fmt: skip
    newest = jobs[-1] if jobs else None
    for job in jobs:
        # a job its try's cancel marked that exited 0 on its own before the stop landed (a 1.5 s job, a cancel
        # slowed by load) was canceled: the platform's verdict, so the next try submits anew rather than take it
        if not job.ran or job.live or job.job_id in accounted or job.stopped or job.cancel_marked:
            continue
        if job is newest and outcome.state != "success":
            continue  # adoptable: the next run of the task instance finds it by its name
        found.append(f"I2: job {job.job_id} ran to its end (exit {job.exit_code}) in no record and unadoptable")
    cancel = outcome.person_cancel
    # judged by what the person was told (the CLI's "canceled": its routine found the job running), not by the
    # observer's look just before: the two are not one instant, and a 1.5 s job ends between them under load
    if cancel and cancel.get("stopped") and not cancel.get("cleared_after"):
        # a mark after it (the pair explorer's second fault) ends the task as marked: final too
        if outcome.error not in MARKS and (outcome.state != "failed" or "ERR_CANCELED" not in outcome.error):
            found.append(f"I3: a person canceled job {cancel['job_id']} but the task ended {outcome.state} "
                         f"({outcome.error[:200]})")  # fmt: skip
        later = [job.job_id for job in jobs if job.created > cancel["at"]]
        if later:
            found.append(f"I3: job(s) {later} submitted after a person canceled job {cancel['job_id']}")
    expect_success = schedule.interruption in RECOVERABLE or (
        schedule.interruption == "cli_cancel" and not (cancel and cancel.get("stopped"))
    )
    # a clear after a person's cancel: the clear's try may run the task again, or read the job's canceled_by mark
    # and fail ERR_CANCELED -- either honours a person (the cancel, then the clear); nothing else may end it. A
    # cancel the CLI reported binding (a clear that landed while it ran: "its task (cleared) fails with
    # ERR_CANCELED when it next runs") is honoured by ERR_CANCELED (I3 above), whatever the interruptions were
    honoured = bool(cancel and (cancel.get("cleared_after") or cancel.get("stopped")))
    if honoured and outcome.state == "failed" and "ERR_CANCELED" in outcome.error:
        expect_success = False
    if expect_success and outcome.state != "success":
        stopped = next((job for job in jobs if job.job_id == recorded and job.stopped), None)
        what = f"its job {recorded} was stopped" if stopped else "its job was not stopped"
        told = f"; the person was told {cancel['told']}" if cancel and "told" in cancel else ""
        found.append(f"I4: the task failed after {schedule.interruption} ({what}): {outcome.error[:300]}{told}")
    if outcome.state == "success" and isinstance(outcome.result, dict):
        job_id = outcome.result.get("job_id")
        ran = next((job for job in jobs if job.job_id == job_id), None)
        if ran is None or not ran.completed:
            found.append(f"I5: the result names job {job_id}, which did not complete on the backend ({ran})")
        marker = backend.host_path(str(outcome.result.get("results_dir"))) / "ran"
        written = marker.read_text().strip() if marker.is_file() else None
        if written != job_id:
            found.append(f"I5: the result's folder {marker.parent} holds the output of {written!r}, not {job_id!r}")
    ti = {"dag_id": "dag", "run_id": outcome.run_id, "task_id": "train", "map_index": -1}
    chain = store.get(CHAIN_KEY)
    write_aheads = [(ti, chain)] if isinstance(chain, dict) and chain.get("job_name") else []
    recorded = recorded_jobs(_indexed(record, outcome), backend.platform, backend.conn_id, write_aheads)
    found.extend(f"I6: {w}" for w in backend.leftovers(outcome.job_name, outcome.run_id, outcome.state, recorded))
    found.extend(f"I7: the connection's secret is in {where}" for where in secret_seen(backend, outcome))
    return found


def _indexed(record: JobRecord | None, outcome: Outcome) -> list[IndexedJob]:
    """The task's jobs as ``airflow tao reap`` reads them from the metadata database (:func:`~airflow_provider_tao.
    jobindex.load_jobs`, its write-ahead as :func:`~airflow_provider_tao.jobindex.load_write_aheads`): the record's
    job, then those of its history, newest first."""
    if record is None:
        return []
    return record_jobs(record, dag_id="dag", run_id=outcome.run_id, task_id="train", map_index=-1,
                       ti_state=outcome.state, ti_try=None, ti_end=None)  # fmt: skip


def secret_seen(backend: Backend, outcome: Outcome) -> list[str]:
    places = {
        "the task's log": outcome.logs,
        "the trigger's kwargs": outcome.trigger_kwargs,
        "the backend's records": backend.records(outcome.job_name) if outcome.job_name else [],
    }
    return [f"{where}: ...{text[max(0, text.index(SECRET) - 120) : text.index(SECRET)]}"
            for where, texts in places.items() for text in texts if SECRET in text][:3]  # fmt: skip

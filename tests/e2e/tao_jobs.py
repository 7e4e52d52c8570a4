"""Helpers of the e2e tests that run TAO jobs on the ``tao_e2e`` local connection (DAGs in ``dags/tao_e2e.py``).

A job writes ``started.<job_id>`` and ``done.<job_id>`` into the run's ``mark_dir``; these helpers read those marks,
find a job's processes and wait for the steps of a run.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_tao.jobs import JobHandle
from tests.e2e.airflow_harness import AirflowClient, wait_until

TASK = "train"
E2E_DAG_IDS = (
    "tao_e2e_deferred",
    "tao_e2e_sync",
    "tao_e2e_keep",
    "tao_e2e_outputs",
    "tao_e2e_outage",
    "tao_e2e_outage_sync",
    "tao_e2e_bad_input",
)


def job_ids(marks: Path, kind: str) -> list[str]:
    return sorted(p.name.split(".", 1)[1] for p in marks.glob(f"{kind}.*"))


def job_processes(job_ids: list[str]) -> list[int]:
    """Live processes of these jobs, found by the TAO_JOB_ID in their environment (jobs do not retitle)."""
    needles = [f"TAO_JOB_ID={job_id}".encode() for job_id in job_ids]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and any(needle in environ for needle in needles):
            found.append(int(entry))
    return found


def local_handle(client: AirflowClient, dag_id: str, run_id: str) -> JobHandle:
    return JobHandle(platform="local", conn_id="tao_e2e", job_id=client.get_job_id(dag_id, run_id, TASK), name="")


def start_run(client: AirflowClient, dag_id: str, marks: Path, seconds: int) -> str:
    run_id = client.trigger_dag_run(dag_id, conf={"mark_dir": str(marks), "seconds": seconds})
    return run_id


def wait_started(marks: Path, count: int = 1, timeout: float = 60) -> list[str]:
    return wait_until(
        lambda: ids if len(ids := job_ids(marks, "started")) >= count else None,
        timeout=timeout,
        interval=0.2,
        message=lambda: f"expected {count} started job(s) in {marks}, saw {job_ids(marks, 'started')}",
    )


def wait_watched(client: AirflowClient, dag_id: str, run_id: str) -> None:
    """Until a triggerer runs the trigger: Airflow calls a trigger's on_kill only once it runs."""
    wait_until(
        lambda: "Watching local job" in client.get_task_log_safe(dag_id, run_id, TASK, 1),
        timeout=60,
        interval=0.5,
        message=lambda: f"no triggerer picked up the trigger of {dag_id}/{run_id}",
    )

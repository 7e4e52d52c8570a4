"""What ``airflow tao reap`` asks the platform, on the real cluster: ``list_active_jobs`` -- this provider's queued or
running jobs (one ``squeue``), each with its handle read from the job folder; canceled ones are gone -- and
``reap_resources`` -- the env files of ended jobs whose task is over."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.jobs import JobSpec

pytestmark = pytest.mark.integration


def test_active_jobs_are_listed_until_canceled(slurm_cluster: Any, slurm_conn: str) -> None:
    hook = SlurmHook(conn_id=slurm_conn)
    jobs = []
    for _ in range(2):
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec(
            name=f"reap-{job_id}",
            job_id=job_id,
            command="sleep 300",
            gpu_count=0,
            backend_details={"container_runtime": "none", "partition": slurm_cluster.partition_held},
        )
        jobs.append(hook.create_job(spec))
    try:
        listed = {h.job_id: h for h in hook.list_active_jobs()}
        for handle in jobs:
            assert handle.job_id in listed, listed
            found = listed[handle.job_id]
            assert (found.backend_job_id, found.name, found.platform) == (handle.backend_job_id, handle.name, "slurm")
        assert hook.cancel_job(jobs[0], requested_by="reap: test") is CancelOutcome.STOPPED
        assert jobs[0].job_id not in {h.job_id for h in hook.list_active_jobs()}
    finally:
        for handle in jobs:
            hook.cancel_job(handle)
        hook.close()


def test_reap_deletes_the_env_file_of_an_ended_job_whose_task_is_over_and_keeps_the_others(
    slurm_cluster: Any, slurm_conn: str
) -> None:
    """The env file (the job's secrets) of an ended job whose task is over goes in one sweep -- its resume never
    ran (the task was marked failed after its trigger's event); a pending job's, and an ended job's whose task may
    still resume and requeue it, stay; files no record names (other tests' jobs on the same cluster) are not judged:
    the one row is the one file deleted."""
    hook = SlurmHook(conn_id=slurm_conn)

    def submit(command: str, partition: str | None = None) -> Any:
        job_id = uuid.uuid4().hex[:12]
        details = {"container_runtime": "none", **({"partition": partition} if partition else {})}
        spec = JobSpec(name=f"reap-{job_id}", job_id=job_id, command=command, gpu_count=0, backend_details=details)
        return hook.create_job(spec)

    over, live_task, pending = submit("true"), submit("true"), submit("sleep 300", slurm_cluster.partition_held)
    try:
        for handle in (over, live_task):  # ended for squeue too (COMPLETING is not ended), as the sweep reads it
            deadline = time.monotonic() + 120
            while not hook.get_job_status(handle).state.is_terminal:
                assert time.monotonic() < deadline, f"job {handle.job_id} never ended"
                time.sleep(0.5)
        runs = {over.job_id: "failed", live_task.job_id: "deferred", pending.job_id: "failed"}
        recorded = {
            h.backend_job_id: {"dag_id": "d", "run_id": h.job_id, "task_id": "t", "map_index": -1, "name": h.name}
            for h in (over, live_task, pending)
        }
        env = {h.job_id: hook.layout(h.job_id, h.name).env_file for h in (over, live_task, pending)}

        rows = hook.reap_resources(lambda ti: runs.get(ti["run_id"], "running"), dry_run=False, recorded=recorded)

        assert [(r["resource"], r["kind"], r["action"]) for r in rows] == [(env[over.job_id], "env file", "deleted")]
        assert "its Slurm job has ended" in rows[0]["why"] and "is failed" in rows[0]["why"], rows
        left = set(slurm_cluster.ssh(f"ls {slurm_cluster.results_root}/jobs/*/env/*.env").stdout.split())
        assert env[over.job_id] not in left
        assert {env[live_task.job_id], env[pending.job_id]} <= left  # a queued job's, a live task's
        assert hook.reap_resources(lambda ti: runs.get(ti["run_id"], "running"), dry_run=False, recorded=recorded) == []
    finally:
        hook.cancel_job(pending)
        hook.close()

"""``list_active_jobs`` on the real cluster -- what ``airflow tao reap`` asks the platform: this provider's queued or
running jobs (one ``squeue``), each with its handle read from the job folder; canceled ones are gone."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

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
        assert hook.cancel_job(jobs[0], requested_by="reap: test") is True
        assert jobs[0].job_id not in {h.job_id for h in hook.list_active_jobs()}
    finally:
        for handle in jobs:
            hook.cancel_job(handle)
        hook.close()

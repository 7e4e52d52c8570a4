"""``list_active_jobs`` on the real engine -- what ``airflow tao reap`` asks: this provider's running containers
(one list call), each with its handle from the labels; a canceled container is no longer active."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_tao.hooks.docker import TAODockerHook
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobSpec
from tests.integration.docker.conftest import DockerEngine

pytestmark = pytest.mark.integration


def test_active_jobs_are_listed_until_canceled(docker_engine: DockerEngine, docker_conn: str) -> None:
    hook = TAODockerHook(conn_id=docker_conn)
    jobs = []
    for _ in range(2):
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec(
            name=f"reap-{job_id}", job_id=job_id, command="sleep 300", gpu_count=0, image=docker_engine.busybox
        )
        jobs.append(hook.create_job(spec))
    try:
        listed = {h.job_id: h for h in hook.list_active_jobs()}
        for handle in jobs:
            found = listed[handle.job_id]
            assert (found.backend_job_id, found.name, found.results_dir) == (
                handle.backend_job_id,
                handle.name,
                handle.results_dir,
            )
        assert hook.cancel_job(jobs[0], requested_by="reap: test") is CancelOutcome.STOPPED
        assert hook.canceled_by(jobs[0]) == "reap: test"
        assert jobs[0].job_id not in {h.job_id for h in hook.list_active_jobs()}
        assert jobs[1].job_id in {h.job_id for h in hook.list_active_jobs()}
    finally:
        for handle in jobs:
            hook.cancel_job(handle)
            docker_engine.client.remove_container(f"tao-job-{handle.job_id}", force=True)

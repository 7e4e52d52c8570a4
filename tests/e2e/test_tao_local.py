"""TAOSubmitOperator on the local platform under a real ``airflow standalone`` (scheduler, triggerer, REST API).

The promises under test: a deferred run succeeds through the real triggerer with its link visible while deferred;
``cancel_on_kill=False`` leaves the job of a task marked success running. Marks, clears, triggerer restarts and worker
kills are the fault matrix's cases (``tests/e2e/matrix``), on this platform and the five others.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.links import job_page_path
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, wait_until
from tests.e2e.tao_jobs import (
    TASK,
    job_ids,
    job_processes,
    local_handle,
    start_run,
    wait_started,
    wait_watched,
)

pytestmark = pytest.mark.usefixtures("tao_connection")


def test_a_deferred_run_succeeds_through_the_triggerer_and_links_resolve_while_deferred(
    dags: AirflowClient, marks: Path
) -> None:
    run_id = start_run(dags, "tao_e2e_deferred", marks, seconds=10)
    dags.wait_for_task_instance("tao_e2e_deferred", run_id, TASK, ["deferred"], timeout=90)
    # the job's own log lines reach the task log while the task is still deferred
    wait_until(
        lambda: "[job] tick 2" in dags.get_task_log_safe("tao_e2e_deferred", run_id, TASK, 1),
        timeout=30,
        interval=0.5,
        message="no job log lines in the task log while deferred",
    )

    links = dags.get_task_instance_links("tao_e2e_deferred", run_id, TASK)
    job_id = dags.get_job_id("tao_e2e_deferred", run_id, TASK)
    url = links.get("TAO job") if isinstance(links, dict) else None
    # local has no web console: the link is the provider's job page of this task instance (tests/e2e/ui opens it)
    assert url == f"{dags.base_url}{job_page_path('tao_e2e_deferred', run_id, TASK)}", links
    assert links.get("TAO results") == f"{url}#results", links
    handle = dags.get_xcom("tao_e2e_deferred", run_id, TASK, "tao_job")["handle"]
    log_file = urlparse(handle["console_url"])  # where the job's log is, and the host that runs it
    assert Path(log_file.path).exists() and log_file.netloc == os.uname().nodename
    assert dags.get_task_instance_state("tao_e2e_deferred", run_id, TASK) == "deferred"

    dags.wait_for_dag_run("tao_e2e_deferred", run_id, ["success"], timeout=120)
    result = dags.get_xcom("tao_e2e_deferred", run_id, TASK, "return_value")
    assert result["job_id"] == job_id and result["state"] == "Complete" and result["exit_code"] == 0
    assert job_ids(marks, "started") == job_ids(marks, "done") == [job_id]
    log = dags.get_task_log("tao_e2e_deferred", run_id, TASK, 1)
    assert "[job] tick 3" in log and "[job] finished" in log  # streamed by the triggerer while deferred


def test_mark_success_with_cancel_on_kill_false_leaves_the_job_running(dags: AirflowClient, marks: Path) -> None:
    run_id = start_run(dags, "tao_e2e_keep", marks, seconds=300)
    dags.wait_for_task_instance("tao_e2e_keep", run_id, TASK, ["deferred"], timeout=90)
    (job_id,) = wait_started(marks)
    wait_watched(dags, "tao_e2e_keep", run_id)

    dags.mark_task_instance_success("tao_e2e_keep", run_id, TASK)
    dags.wait_for_task_instance("tao_e2e_keep", run_id, TASK, ["success"], timeout=30)
    time.sleep(8)  # well past the ~2 s after which on_kill runs
    try:
        assert job_processes([job_id]), "the job was killed although cancel_on_kill=False"
        assert "cancel_on_kill=False: leaving job" in dags.get_task_log_safe("tao_e2e_keep", run_id, TASK, 1)
    finally:
        handle = local_handle(dags, "tao_e2e_keep", run_id)
        LocalHook("tao_e2e").cancel_job(handle)
    assert not job_processes([job_id])


def test_a_task_that_fails_before_submitting_says_why_without_noise(
    airflow_standalone: AirflowStandalone, dags: AirflowClient
) -> None:
    """Issue 23.8: the operator's links look up no XCom of a job that was never submitted (each missing one was an
    ``[error] XCom not found`` line of ``airflow dags test``)."""
    proc = subprocess.run(
        [airflow_standalone.airflow_bin, "dags", "test", "tao_e2e_bad_input"],
        env=airflow_standalone.env,
        cwd=airflow_standalone.home,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert "Bad input, nothing was submitted: conn_id: there is no Airflow connection" in out, out
    assert "XCom not found" not in out, out

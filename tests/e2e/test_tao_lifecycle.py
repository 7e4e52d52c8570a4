"""The lifecycle defects of issue 7 that live in Airflow's own lifecycle, on a real ``airflow standalone``.

1. A retry that reattaches after a worker SIGKILL returns the outputs of the job that ran (not of a never-submitted
   one). 3. An outage (the jobs volume gone for 4 report intervals) never fails a task with ``retries=0``, on the
   triggerer or on the worker. 4. Clearing a successful task with ``[state_store] clear_on_success=True`` runs a new
   job instead of returning the old result. 5. A trigger moved to another triggerer, whose old triggerer then calls
   ``on_kill`` (Airflow 3.3 does, for a trigger reassigned after missed heartbeats), still ends in one completed job,
   without a lost or a duplicated log line.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, free_ports, wait_until
from tests.e2e.tao_connection import TAO_E2E_ROOT
from tests.e2e.tao_jobs import TASK, job_ids, job_processes, start_run, wait_started, wait_watched

pytestmark = pytest.mark.usefixtures("tao_connection")

_TICK = re.compile(r"\[job\] (tick \d+ of \w+)")


def test_defect_1_reattach_after_a_worker_sigkill_returns_the_outputs_of_the_job_that_ran(
    dags: AirflowClient, airflow_standalone: AirflowStandalone, marks: Path
) -> None:
    run_id = start_run(dags, "tao_e2e_outputs", marks, seconds=12)
    (job_id,) = wait_started(marks)
    airflow_standalone.kill_task_runner("tao_e2e_outputs", run_id, TASK, sig=signal.SIGKILL)

    dags.wait_for_dag_run("tao_e2e_outputs", run_id, ["success"], timeout=180)
    assert job_ids(marks, "started") == job_ids(marks, "done") == [job_id]
    assert len(dags.list_task_instance_tries("tao_e2e_outputs", run_id, TASK)) == 2
    assert f"Reattached to job {job_id}" in dags.get_task_log("tao_e2e_outputs", run_id, TASK, 2)
    result = dags.get_xcom("tao_e2e_outputs", run_id, TASK, "return_value")
    out = Path(result["outputs"][f"{marks}/out"])
    assert result["job_id"] == job_id
    assert out == TAO_E2E_ROOT / "results" / job_id / "out"  # the job that ran, not the retry's unsent spec
    assert (out / "model.txt").read_text().strip() == job_id


def test_defect_3_an_outage_never_fails_a_task_without_retries(dags: AirflowClient, marks: Path) -> None:
    runs = {dag_id: start_run(dags, dag_id, marks, seconds=30) for dag_id in ("tao_e2e_outage", "tao_e2e_outage_sync")}
    wait_started(marks, count=2)
    wait_watched(dags, "tao_e2e_outage", runs["tao_e2e_outage"])

    jobs_dir = TAO_E2E_ROOT / "jobs"
    unmounted = TAO_E2E_ROOT / "jobs-unmounted"
    jobs_dir.rename(unmounted)  # the jobs volume goes away: no status, no logs, on every path
    try:
        time.sleep(15)  # 3 report intervals at [tao] outage_report_seconds=5: 15 minutes at the default
    finally:
        unmounted.rename(jobs_dir)

    for dag_id, run_id in runs.items():
        dags.wait_for_dag_run(dag_id, run_id, ["success"], timeout=180)
        assert len(dags.list_task_instance_tries(dag_id, run_id, TASK)) == 1
        log = dags.get_task_log(dag_id, run_id, TASK, 1)
        assert "platform does not answer" in log and "jobs folder" in log, dag_id
        assert "has not answered for" in log, dag_id  # the outage is reported while it lasts
        assert "answers again after" in log, dag_id
    assert len(job_ids(marks, "done")) == 2 and job_ids(marks, "started") == job_ids(marks, "done")


def test_defect_4_clear_after_success_runs_a_new_job_with_clear_on_success(dags: AirflowClient, marks: Path) -> None:
    run_id = start_run(dags, "tao_e2e_deferred", marks, seconds=2)
    dags.wait_for_dag_run("tao_e2e_deferred", run_id, ["success"], timeout=120)
    (first,) = job_ids(marks, "done")

    dags.clear_task_instances("tao_e2e_deferred", run_id, [TASK])  # the store's rows of try 1 are already gone
    wait_until(
        lambda: len(job_ids(marks, "done")) == 2,
        timeout=120,
        interval=0.5,
        message=lambda: f"the cleared task ran no new job: done {job_ids(marks, 'done')}",
    )
    dags.wait_for_dag_run("tao_e2e_deferred", run_id, ["success"], timeout=120)
    result = dags.get_xcom("tao_e2e_deferred", run_id, TASK, "return_value")
    assert result["job_id"] != first and result["job_id"] in job_ids(marks, "done")
    assert "Reattached" not in dags.get_task_log("tao_e2e_deferred", run_id, TASK, 2)


def test_defect_5_a_trigger_moved_to_another_triggerer_survives_the_old_ones_on_kill(
    dags: AirflowClient, airflow_standalone: AirflowStandalone, marks: Path
) -> None:
    run_id = start_run(dags, "tao_e2e_deferred", marks, seconds=45)
    dags.wait_for_task_instance("tao_e2e_deferred", run_id, TASK, ["deferred"], timeout=90)
    wait_started(marks)
    wait_watched(dags, "tao_e2e_deferred", run_id)
    # the old trigger's first lines are in the task log before it is frozen: a line still in the frozen triggerer's
    # own log pipeline (Airflow's, not the trigger's) would be lost with it on a loaded machine
    wait_until(
        lambda: "tick 2 of" in dags.get_task_log("tao_e2e_deferred", run_id, TASK, 1),
        timeout=120, interval=0.5, message="the old trigger's lines in the task log",
    )  # fmt: skip

    old_id = max(int(job["id"]) for job in dags.list_jobs("TriggererJob", alive_only=True))
    frozen = airflow_standalone.suspend_triggerer()  # misses its heartbeats, lives on
    try:
        # the frozen triggerer still holds the trigger log server's port
        port = str(free_ports(1)[0])
        airflow_standalone.start_triggerer(extra_env={"AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": port})
        new_id = wait_until(
            lambda: next(
                (int(j["id"]) for j in dags.list_jobs("TriggererJob", alive_only=True) if int(j["id"]) > old_id), None
            ),
            timeout=90,
            interval=0.5,
            message="the second triggerer never heartbeated",
        )
        dags.wait_for_trigger_owner("tao_e2e_deferred", run_id, TASK, new_id, timeout=120)
    finally:
        for proc in frozen:  # the old triggerer wakes up, finds its trigger gone and calls on_kill
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
    try:
        # then it goes: alive, it could be handed the trigger back when the new one misses a heartbeat on a loaded
        # machine, and Airflow opens a trigger's log file afresh ("wb") each time a triggerer starts it -- the lines
        # it wrote before would be lost with the old file (Airflow's, not the trigger's)
        wait_until(
            lambda: "its trigger moved to another triggerer): leaving job"
            in dags.get_task_log("tao_e2e_deferred", run_id, TASK, 1),
            timeout=180, interval=0.5, message="the old triggerer's on_kill never left the job",
        )  # fmt: skip
    finally:
        airflow_standalone.stop_process_tree(frozen, signal.SIGTERM)
    dags.wait_for_dag_run("tao_e2e_deferred", run_id, ["success"], timeout=240)

    started, done = job_ids(marks, "started"), job_ids(marks, "done")
    print(f"jobs started {started}, completed {done}")
    # the old triggerer's on_kill sees the task still deferred (its trigger moved) and leaves the job: one job
    assert len(done) == 1 and started == done
    assert job_processes(started) == []
    assert len(dags.list_task_instance_tries("tao_e2e_deferred", run_id, TASK)) == 1
    assert dags.get_xcom("tao_e2e_deferred", run_id, TASK, "return_value")["job_id"] == done[0]
    ticks = _TICK.findall(dags.get_task_log("tao_e2e_deferred", run_id, TASK, 1))
    assert len(ticks) == len(set(ticks)), "a log line was written twice"
    assert {f"tick {n} of {done[0]}" for n in range(1, 46)} <= set(ticks), "log lines of the job that ran are missing"

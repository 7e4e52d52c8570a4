"""TAOAutoMLOperator under a real ``airflow standalone``, two searches in one DAG run.

``tune`` waits in the real triggerer: its trials run at once on the host, its triggerer is SIGKILLed and replaced,
a person cancels one of its trials with ``airflow tao cancel <trial's job id>`` (that trial is recorded ``canceled``,
the search goes on), ASHA's condemned trials are stopped before their last epoch, the trial budget is kept and the
best trial is the task's XCom. ``tune_sync`` waits on the worker: its worker is SIGKILLed mid-search and its retry
adopts the trials in flight. No trial is lost or run twice: one job per trial on the backend."""

from __future__ import annotations

import getpass
import json
import signal
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.jobs import JobState
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, wait_until
from tests.e2e.tao_connection import TAO_E2E_ROOT
from tests.e2e.tao_jobs import job_processes

pytestmark = pytest.mark.usefixtures("tao_connection")
DAG_ID, TASK, SYNC = "tao_e2e_automl", "tune", "tune_sync"


def trial_jobs(task: str = TASK) -> dict[str, dict]:
    """The trial jobs of the search ``task`` on the tao_e2e connection (job id -> its meta), by the trial names."""
    prefix = f"tao-e2e-automl-{task.replace('_', '-')}-t"
    found = {}
    for meta in (TAO_E2E_ROOT / "jobs").glob("*/meta.json"):
        data = json.loads(meta.read_text())
        if data.get("name", "").startswith(prefix):
            found[data["job_id"]] = data
    return found


def running(task: str, count: int, before: set[str]) -> list[str] | None:
    """The new trial jobs of ``task`` running now, when there are ``count`` of them."""
    hook = LocalHook("tao_e2e")
    jobs = {j: m for j, m in trial_jobs(task).items() if j not in before}
    handles = [hook.find_job(meta["name"]) for meta in jobs.values()]
    statuses = hook.get_job_statuses([h for h in handles if h is not None])
    alive = [j for j, s in statuses.items() if s.state is JobState.RUNNING]
    return alive if len(alive) == count else None


def cancel_as_person(standalone: AirflowStandalone, job_id: str) -> dict[str, Any]:
    """``airflow tao cancel <job id> -o json`` in the instance's environment."""
    proc = subprocess.run(
        [standalone.airflow_bin, "tao", "cancel", job_id, "-o", "json"], env=standalone.env, cwd=standalone.home,
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"airflow tao cancel failed:\n{proc.stdout}\n{proc.stderr}"
    (row,) = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def test_parallel_trials_survive_a_worker_sigkill_a_triggerer_restart_and_a_persons_cancel(
    airflow_client: AirflowClient, airflow_standalone: AirflowStandalone, tmp_path: Path
) -> None:
    client, standalone = airflow_client, airflow_standalone
    client.wait_for_dag(DAG_ID, timeout=90)
    client.unpause_dag(DAG_ID)
    before = set(trial_jobs()) | set(trial_jobs(SYNC))
    run_id = client.trigger_dag_run(DAG_ID, conf={"gate_dir": str(tmp_path)})
    client.wait_for_task_instance(DAG_ID, run_id, TASK, ["deferred"], timeout=90)
    first = wait_until(lambda: running(TASK, 3, before), timeout=60, interval=0.5, message="three trials at once")
    assert len(job_processes(first)) >= 3  # three trial processes alive on the host, the task deferred
    assert client.get_task_instance_state(DAG_ID, run_id, TASK) == "deferred"
    # the plugin's search page reads the search's live state from the task's state store while the task is deferred
    where = f"{DAG_ID}/{quote(run_id, safe='')}/{TASK}"
    live = httpx.get(f"{client.base_url}/tao/api/searches/{where}", timeout=30).json()
    assert set(first) <= {t["job_id"] for t in live["trials"]} and not live["finished"], live
    page = httpx.get(f"{client.base_url}/tao/searches/{where}", timeout=30).text
    assert "AutoML search" in page and all(job_id in page for job_id in first)
    in_flight = wait_until(lambda: running(SYNC, 2, before), timeout=90, interval=0.5, message="two sync trials")

    # the worker of the search that waits on the worker dies mid-search; its retry adopts the trials in flight
    standalone.kill_task_runner(DAG_ID, run_id, SYNC, sig=signal.SIGKILL)
    # the triggerer of the deferred search dies; a new one takes its trigger over
    _, new_triggerer = standalone.restart_triggerer(signal.SIGKILL)
    client.wait_for_trigger_owner(DAG_ID, run_id, TASK, new_triggerer, timeout=120)
    # a person cancels one trial of the deferred search by its job id
    victim = first[0]
    row = cancel_as_person(standalone, victim)
    assert row["canceled"] and "the search goes on" in row["note"], row
    wait_until(
        lambda: "Continuing search" in client.get_task_log_safe(DAG_ID, run_id, SYNC, 2),
        timeout=120, interval=0.5, message="the sync search's retry continuing the search",
    )  # fmt: skip
    (tmp_path / "go").touch()
    client.wait_for_dag_run(DAG_ID, run_id, ["success"], timeout=240)

    result = client.get_xcom(DAG_ID, run_id, TASK, "return_value")
    rows = result["trials"]
    assert [r["trial"] for r in rows] == list(range(6))  # max_trials kept, none lost
    canceled = [r for r in rows if r["state"] == "canceled"]
    assert [r["job_id"] for r in canceled] == [victim], rows
    assert canceled[0]["reason"] == f"canceled by cli:{getpass.getuser()}"
    assert {r["state"] for r in rows} - {"canceled"} <= {"complete", "pruned"}
    ours = {j for j in trial_jobs() if j not in before}
    assert ours == {r["job_id"] for r in rows}  # one job per trial: none run twice across the triggerer restart
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert pruned, rows
    assert not job_processes([r["job_id"] for r in pruned + canceled])  # their processes are gone
    # and stopped early: a trial judged at rung 1 (step 1) or 2 (step 3) has epochs left -- unless the resume of
    # the worker took longer than its remaining epochs, which cannot happen to all of them
    assert any(r["last_step"] < 6 for r in pruned), pruned
    complete = [r for r in rows if r["state"] == "complete"]
    assert result["best"]["value"] == min(r["value"] for r in complete)
    log = client.get_task_log(DAG_ID, run_id, TASK, 1)
    assert "pruned at step" in log and "Best trial" in log

    synced = client.get_xcom(DAG_ID, run_id, SYNC, "return_value")["trials"]
    assert [(r["trial"], r["state"]) for r in synced] == [(0, "complete"), (1, "complete")]
    assert {r["job_id"] for r in synced} == set(in_flight)  # the killed try's trials, adopted, not run again
    assert {j for j in trial_jobs(SYNC) if j not in before} == set(in_flight)
    assert len(client.list_task_instance_tries(DAG_ID, run_id, SYNC)) == 2

"""TAOAutoMLOperator under a real ``airflow standalone``: trials run at once on the host while the task is deferred
in the real triggerer, ASHA's condemned trials are stopped before their last epoch, the trial budget is kept, and the
best trial is the task's XCom."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.jobs import JobState
from tests.e2e.airflow_harness import AirflowClient, wait_until
from tests.e2e.tao_connection import TAO_E2E_ROOT
from tests.e2e.tao_jobs import job_processes

pytestmark = pytest.mark.usefixtures("tao_connection")
DAG_ID, TASK = "tao_e2e_automl", "tune"


def trial_jobs() -> dict[str, dict]:
    """The search DAG's trial jobs on the tao_e2e connection (job id -> its meta), by the trial names' prefix."""
    found = {}
    for meta in (TAO_E2E_ROOT / "jobs").glob("*/meta.json"):
        data = json.loads(meta.read_text())
        if data.get("name", "").startswith("tao-e2e-automl-tune-t"):
            found[data["job_id"]] = data
    return found


def test_parallel_trials_pruned_early_within_the_trial_budget(airflow_client: AirflowClient, tmp_path: Path) -> None:
    client = airflow_client
    client.wait_for_dag(DAG_ID, timeout=90)
    client.unpause_dag(DAG_ID)
    before = set(trial_jobs())
    run_id = client.trigger_dag_run(DAG_ID, conf={"gate_dir": str(tmp_path)})
    client.wait_for_task_instance(DAG_ID, run_id, TASK, ["deferred"], timeout=90)
    hook = LocalHook("tao_e2e")

    def running_at_once() -> list[str] | None:
        jobs = [j for j in trial_jobs() if j not in before]
        handles = [hook.find_job(trial_jobs()[j]["name"]) for j in jobs]
        statuses = hook.get_job_statuses([h for h in handles if h is not None])
        alive = [j for j, s in statuses.items() if s.state is JobState.RUNNING]
        return alive if len(alive) == 3 else None

    first = wait_until(running_at_once, timeout=60, interval=0.5, message="three trials running at once")
    assert len(job_processes(first)) >= 3  # three trial processes alive on the host, the task deferred
    assert client.get_task_instance_state(DAG_ID, run_id, TASK) == "deferred"
    # the plugin's search page reads the search's live state from the task's state store while the task is deferred
    where = f"{DAG_ID}/{quote(run_id, safe='')}/{TASK}"
    live = httpx.get(f"{client.base_url}/tao/api/searches/{where}", timeout=30).json()
    assert set(first) <= {t["job_id"] for t in live["trials"]} and not live["finished"], live
    page = httpx.get(f"{client.base_url}/tao/searches/{where}", timeout=30).text
    assert "AutoML search" in page and all(job_id in page for job_id in first)
    (tmp_path / "go").touch()
    client.wait_for_dag_run(DAG_ID, run_id, ["success"], timeout=240)
    result = client.get_xcom(DAG_ID, run_id, TASK, "return_value")
    rows = result["trials"]
    assert len(rows) == 6  # max_trials kept
    assert {r["state"] for r in rows} <= {"complete", "pruned"}
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert pruned, rows
    assert not job_processes([r["job_id"] for r in pruned])  # every pruned trial's process is gone
    # and stopped early: a trial judged at rung 1 (step 1) or 2 (step 3) has epochs left -- unless the resume of
    # the worker took longer than its remaining epochs, which cannot happen to all of them
    assert any(r["last_step"] < 6 for r in pruned), pruned
    complete = [r for r in rows if r["state"] == "complete"]
    assert result["best"]["value"] == min(r["value"] for r in complete)
    log = client.get_task_log(DAG_ID, run_id, TASK, 1)
    assert "pruned at step" in log and "Best trial" in log

"""DAGs used only by tests/e2e/test_harness.py to prove the harness against a real standalone.

They use nothing but Airflow's own operators, so they parse even while the provider is unfinished.
"""

from __future__ import annotations

import time
from datetime import timedelta

from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG, task

with DAG(
    dag_id="e2e_smoke_deferred",
    schedule=None,
    catchup=False,
    tags=["e2e"],
    doc_md="A deferrable sensor waits `conf.wait_seconds` (default 20) after the run was triggered.",
):
    wait = DateTimeSensorAsync(
        task_id="wait",
        target_time=(
            "{{ (dag_run.run_after + macros.timedelta(seconds=dag_run.conf.get('wait_seconds', 20))).isoformat() }}"
        ),
    )

    @task
    def report(**context) -> dict:
        """Push a small XCom so the harness can read it back."""
        return {"waited": context["dag_run"].conf.get("wait_seconds", 20), "ok": True}

    wait >> report()


with DAG(
    dag_id="e2e_smoke_worker_kill",
    schedule=None,
    catchup=False,
    tags=["e2e"],
    doc_md="Try 1 sleeps `conf.sleep_seconds` (default 300) so it can be killed; the retry returns at once.",
):

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def sleepy(**context) -> int:
        """Sleep on the first try only, and return the try number."""
        try_number = context["ti"].try_number
        if try_number == 1:
            print("try 1 sleeping", flush=True)
            time.sleep(int(context["dag_run"].conf.get("sleep_seconds", 300)))
        return try_number

    sleepy()

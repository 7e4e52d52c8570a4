"""DAGs of the UI/CLI end-to-end tests: one run with a job on each of two platforms, a long job to cancel, and long
jobs on the fake Brev world for ``airflow tao reap`` (one with a lease of 10.8 s)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_tao.operators.submit import TAOSubmitOperator

with DAG("tao_ui_two_platforms", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["tao-e2e"]):
    TAOSubmitOperator(
        task_id="train_local",
        platform="local",
        command="for i in 1 2 3 4; do echo step $i; sleep 1; done",
        gpu_count=1,  # the test instance's worker "sees" GPUs 0,1 (CUDA_VISIBLE_DEVICES): GPU-hours for the view
        deferrable=True,
        poll_interval=1,
        execution_timeout=timedelta(minutes=5),
    )
    TAOSubmitOperator(
        task_id="train_docker",
        conn_id="tao_ui_docker",
        image="local/busybox:ci",
        command="for i in 1 2 3 4; do echo step $i; sleep 1; done",
        gpu_count=2,  # the test engine grants GPU requests (a stub runtime hook): GPU-hours for the view
        deferrable=True,
        poll_interval=1,
        execution_timeout=timedelta(minutes=5),
    )

with DAG(
    "tao_ui_cancel",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
    tags=["tao-e2e"],
):
    TAOSubmitOperator(
        task_id="train",
        platform="local",
        command="echo started; sleep 600",
        gpu_count=0,
        deferrable=True,
        poll_interval=1,
    )

with DAG("tao_ui_orphan", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["tao-e2e"]):
    # waits on the worker (not deferred): killing the worker leaves the job with no one watching it
    TAOSubmitOperator(
        task_id="train",
        platform="local",
        command="echo started; sleep 600",
        gpu_count=0,
        deferrable=False,
        poll_interval=1,
        retries=0,
    )

for dag_id, lease_hours in (("tao_ui_brev", 8.0), ("tao_ui_brev_lease", 0.003)):
    with DAG(
        dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
        tags=["tao-e2e"],
    ):
        TAOSubmitOperator(
            task_id="train",
            conn_id="tao_ui_brev",
            image="local/busybox:ci",
            command="echo started; sleep 600",
            gpu_count=0,
            backend_details={"lease_hours": lease_hours},
            cancel_on_kill=False,  # marked failed, its job runs on: an orphan for the reaper
            deferrable=True,
            poll_interval=1,
        )

"""DAGs driven by tests/e2e/test_tao_local.py: one TAO job on the local platform, deferrable or on the worker.

The job writes ``started.<job_id>`` when it starts and ``done.<job_id>`` when it ran to completion into the folder
given as ``mark_dir`` in the run's conf, ticking once a second for ``seconds`` (conf) in between.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_tao.operators.submit import TAOSubmitOperator

JOB = (
    'echo "started $TAO_JOB_ID"; touch "$MARK_DIR/started.$TAO_JOB_ID"; '
    'for i in $(seq "$RUN_SECONDS"); do echo "tick $i"; sleep 1; done; '
    'touch "$MARK_DIR/done.$TAO_JOB_ID"; echo finished'
)
ENV = {"MARK_DIR": "{{ dag_run.conf['mark_dir'] }}", "RUN_SECONDS": "{{ dag_run.conf.get('seconds', 8) }}"}

for dag_id, deferrable, cancel_on_kill in (
    ("tao_e2e_deferred", True, True),
    ("tao_e2e_sync", False, True),
    ("tao_e2e_keep", True, False),
):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    ):
        TAOSubmitOperator(
            task_id="train",
            conn_id="tao_e2e",
            command=JOB,
            gpu_count=0,
            env=ENV,
            deferrable=deferrable,
            cancel_on_kill=cancel_on_kill,
            poll_interval=1,
        )

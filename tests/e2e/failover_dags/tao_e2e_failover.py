"""The DAG of tests/e2e/test_tao_platform_failover.py: a job whose first connection is a Slurm partition that is down
(its jobs wait for resources: PartitionDown) and whose fallback is the local platform.

The job writes ``started.<job_id>`` / ``done.<job_id>`` into the run's ``mark_dir`` (conf) and ticks once a second
for ``seconds`` (conf) in between, as the DAGs of ``tests/e2e/dags/tao_e2e.py`` do.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_tao.operators.submit import TAOSubmitOperator

JOB = (
    'echo "started $TAO_JOB_ID"; touch "$MARK_DIR/started.$TAO_JOB_ID"; '
    'for i in $(seq "$RUN_SECONDS"); do echo "tick $i of $TAO_JOB_ID"; sleep 1; done; '
    'touch "$MARK_DIR/done.$TAO_JOB_ID"; echo finished'
)
ENV = {"MARK_DIR": "{{ dag_run.conf['mark_dir'] }}", "RUN_SECONDS": "{{ dag_run.conf.get('seconds', 8) }}"}

# tao_e2e_failover moves after 5 s of waiting; tao_e2e_failover_slow after 20 s (room for a triggerer restart)
for dag_id, capacity_timeout in (("tao_e2e_failover", 5), ("tao_e2e_failover_slow", 20)):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    ):
        TAOSubmitOperator(
            task_id="train",
            conn_id="tao_e2e_slurm_down",
            fallback_conn_ids=["tao_e2e"],
            capacity_timeout=capacity_timeout,
            command=JOB,
            env=ENV,
            gpu_count=0,
            deferrable=True,
            poll_interval=1,
        )

"""DAGs driven by tests/e2e/test_tao_local.py: one TAO job on the local platform, deferrable or on the worker.

The job writes ``started.<job_id>`` when it starts and ``done.<job_id>`` when it ran to completion into the folder
given as ``mark_dir`` in the run's conf, ticking once a second for ``seconds`` (conf) in between. The ``outputs``
DAG also writes ``<mark_dir>/out/model.txt`` (its job id), committed by the in-job runner; the ``outage`` DAGs have
no retries, so an outage that failed the task would fail the run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_tao.operators.submit import TAOSubmitOperator

JOB = (
    'echo "started $TAO_JOB_ID"; touch "$MARK_DIR/started.$TAO_JOB_ID"; '
    'for i in $(seq "$RUN_SECONDS"); do echo "tick $i of $TAO_JOB_ID"; sleep 1; done; '
    'mkdir -p "$MARK_DIR/out" && echo "$TAO_JOB_ID" > "$MARK_DIR/out/model.txt"; '
    'touch "$MARK_DIR/done.$TAO_JOB_ID"; echo finished'
)
ENV = {"MARK_DIR": "{{ dag_run.conf['mark_dir'] }}", "RUN_SECONDS": "{{ dag_run.conf.get('seconds', 8) }}"}

for dag_id, deferrable, cancel_on_kill, retries, outputs in (
    ("tao_e2e_deferred", True, True, 1, None),
    ("tao_e2e_sync", False, True, 1, None),
    ("tao_e2e_keep", True, False, 1, None),
    ("tao_e2e_outputs", False, True, 1, ["{{ dag_run.conf['mark_dir'] }}/out"]),
    ("tao_e2e_outage", True, True, 0, None),
    ("tao_e2e_outage_sync", False, True, 0, None),
):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=2)},
    ):
        TAOSubmitOperator(
            task_id="train",
            conn_id="tao_e2e",
            command=JOB,
            gpu_count=0,
            env=ENV,
            outputs=outputs,
            deferrable=deferrable,
            cancel_on_kill=cancel_on_kill,
            poll_interval=1,
        )

# a task that fails before anything is submitted (its connection does not exist): its log says why, and nothing else
with DAG(dag_id="tao_e2e_bad_input", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    TAOSubmitOperator(task_id="train", conn_id="tao_e2e_no_such_connection", command="true", gpu_count=0)

"""Train a TAO model on an NVIDIA Brev GPU instance made for the task, watched from the triggerer; results go to S3.

Needs an Airflow connection of type ``tao_brev`` (Admin > Connections, or an ``AIRFLOW_CONN_*`` variable) and an
``aws`` connection for the results bucket, e.g.::

    AIRFLOW_CONN_TAO_BREV_DEFAULT='{"conn_type": "tao_brev", "password": "<Brev API token>",
      "extra": {"instance_type": "g5.xlarge,g6.xlarge", "lease_hours": 8, "ngc_api_key": "<NGC API key>"}}'

``train`` creates the instance ``<job name>`` with the first type of the chain that has capacity (the name is the
task instance's, so a retry finds it again), waits until ``brev exec`` answers, copies the job's archive (the
runner, the spec, the S3 credentials: 0600, never on a command line) and launches the container
``tao-job-<job_id>`` there, then defers. Every watched job of the connection costs one ``brev ls --json`` plus one
``brev exec`` per instance per interval, and the job's new log lines arrive with it. When the job ends (or the task
is marked failed, or times out) the instance is deleted; if Airflow dies first, ``tao_brev_reaper`` deletes it once
its lease (``lease_hours``) runs out. The in-job runner uploads ``/workspace/out`` to
``<results_uri>/<job_id>/``; ``report`` lists what arrived.

Every value below can be overridden with an environment variable of the same name (the CI test runs it against
``tests/brevfake`` with ``TAO_BREV_IMAGE=local/debian-py:ci TAO_BREV_GPUS=0 TAO_BREV_NETWORK=host``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CONN_ID = os.environ.get("TAO_BREV_CONN_ID", "tao_brev_default")
AWS_CONN_ID = os.environ.get("TAO_BREV_AWS_CONN_ID", "aws_default")
IMAGE = os.environ.get("TAO_BREV_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI
GPUS = int(os.environ.get("TAO_BREV_GPUS", "1"))
RESULTS = os.environ.get("TAO_BREV_RESULTS", "s3://my-bucket/tao/results")
NETWORK = os.environ.get("TAO_BREV_NETWORK", "")  # "" = the instance's default Docker network
POLL = float(os.environ.get("TAO_BREV_POLL", "30"))

TRAIN = r"""
mkdir -p /workspace/out
nvidia-smi -L 2>/dev/null || echo "GPUs: ${NVIDIA_VISIBLE_DEVICES:-none}"
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e /workspace/specs/train.yaml results_dir=/workspace/out
else
  echo "no tao CLI in this image: writing a placeholder model"
  echo '{"model": "placeholder"}' > /workspace/out/model.json
fi
"""


@dag(
    dag_id="tao_brev_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["tao", "brev", "example"],
)
def tao_brev_train():
    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CONN_ID,
        image=IMAGE,
        command=TRAIN,
        gpu_count=GPUS,
        outputs=["/workspace/out"],
        storage_conn_id=AWS_CONN_ID,
        results_uri=RESULTS,
        backend_details={"shm_size": "16g", **({"network": NETWORK} if NETWORK else {})},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=6),
    )

    @task
    def report(result: dict) -> list[str]:
        """What the job uploaded to its results folder in S3."""
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        bucket, _, prefix = result["outputs"]["/workspace/out"].removeprefix("s3://").partition("/")
        keys = S3Hook(aws_conn_id=AWS_CONN_ID).list_keys(bucket_name=bucket, prefix=prefix) or []
        print(f"Job {result['job_id']} on instance {result['backend_job_id']} uploaded {sorted(keys)}")
        return sorted(keys)

    report(train.output)


tao_brev_train()

"""Train a TAO model in a container on a Docker host with GPUs (a workstation, a DGX, a Jetson), watched from the
triggerer.

Needs an Airflow connection of type ``tao_docker`` (Admin > Connections, or an ``AIRFLOW_CONN_*`` variable), e.g.::

    AIRFLOW_CONN_TAO_DOCKER_DEFAULT='{"conn_type": "tao_docker", "host": "unix:///var/run/docker.sock",
      "login": "$oauthtoken", "password": "<NGC API key>",
      "extra": {"registry": "nvcr.io", "results_root": "/data/tao/results", "network": "tao_default"}}'

``train`` pulls the image when the daemon lacks it (with the NGC key: a pull that fails is ``ERR_IMAGE_PULL``,
never retried), creates the container ``tao-job-<job_id>`` with one GPU, copies the job's files in through the
Docker API (no secret in ``docker inspect``), starts it and defers. Every watched container of the connection is
then polled with ONE ``GET /containers/json`` per interval, and its new log lines appear in the task log. The data
set is a folder on the Docker host, mounted read-only; results land in ``<results_root>/<job_id>`` on the host.
``report`` lists what the job wrote.

Every value below can be overridden with an environment variable of the same name (e.g. to try the DAG on the CI
engine of ``scripts/docker-up.sh``: ``TAO_DOCKER_CONN_ID=tao_docker_ci TAO_DOCKER_IMAGE=local/busybox:ci
TAO_DOCKER_GPUS=0 TAO_DOCKER_DATA=/tmp``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CONN_ID = os.environ.get("TAO_DOCKER_CONN_ID", "tao_docker_default")
IMAGE = os.environ.get("TAO_DOCKER_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI
GPUS = int(os.environ.get("TAO_DOCKER_GPUS", "1"))
DATA = os.environ.get("TAO_DOCKER_DATA", "/data/datasets/coco-mini")  # a folder on the Docker host
POLL = float(os.environ.get("TAO_DOCKER_POLL", "15"))

# Results go to $TAO_RESULTS_ROOT/$TAO_JOB_ID (= the task's results_dir), a folder on the Docker host.
TRAIN = r"""
out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"
echo "GPUs: ${NVIDIA_VISIBLE_DEVICES:-none}"
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e /workspace/specs/train.yaml results_dir="$out" \
    dataset.train_data_path=/data/train
else
  echo "no tao CLI in this image: writing a placeholder model"
  echo '{"model": "placeholder"}' > "$out/model.json"
fi
"""


@dag(
    dag_id="tao_docker_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["tao", "docker", "example"],
)
def tao_docker_train():
    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CONN_ID,
        image=IMAGE,
        command=TRAIN,
        gpu_count=GPUS,
        backend_details={"mounts": [f"{DATA}:/data:ro"], "shm_size": "16g"},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=8),
    )

    @task
    def report(result: dict) -> list[str]:
        """What the job wrote to its results folder on the Docker host."""
        from airflow_provider_tao.hooks.docker import TAODockerHook

        files = TAODockerHook(conn_id=CONN_ID).list_path(result["results_dir"])
        print(
            f"Container {result['backend_job_id'][:12]} ({result['job_id']}) wrote {files} to {result['results_dir']}"
        )
        return files

    report(train.output)


tao_docker_train()

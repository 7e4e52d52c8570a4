"""Train a TAO model as a Kubernetes Job on a GPU cluster, watched from the triggerer, then report its results.

Needs an Airflow connection of type ``tao_kubernetes`` (Admin > Connections, or an ``AIRFLOW_CONN_*`` variable),
e.g.::

    AIRFLOW_CONN_TAO_KUBERNETES_DEFAULT='{"conn_type": "tao_kubernetes", "password": "<NGC API key>",
      "extra": {"kube_config_path": "/opt/airflow/kubeconfig", "namespace": "tao", "results_pvc": "tao-results"}}'

``train`` creates the Job (suspended), the Secret, ConfigMaps and pull Secret it owns, then resumes it and defers.
Every watched job of the connection is polled with one Job list and one Pod list per interval; new log lines of the
pod appear in the task log. With ``num_nodes=2`` it is an Indexed Job with a headless Service (``NODE_RANK``,
``MASTER_ADDR``). Results land on the ``results_pvc`` volume under ``/results/<job_id>``. ``report`` runs a second,
tiny Job on the same volume that lists what the training job wrote -- the PVC is inside the cluster, not on the
Airflow hosts.

Every value below can be overridden with an environment variable of the same name (the CI test runs it against
``tests/kubefake`` with ``TAO_K8S_IMAGE=local/busybox:ci TAO_K8S_GPUS=0``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CONN_ID = os.environ.get("TAO_K8S_CONN_ID", "tao_kubernetes_default")
IMAGE = os.environ.get("TAO_K8S_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI
GPUS = int(os.environ.get("TAO_K8S_GPUS", "1"))
NODES = int(os.environ.get("TAO_K8S_NODES", "2"))
POLL = float(os.environ.get("TAO_K8S_POLL", "15"))

TRAIN = r"""
out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"
mkdir -p "$out"
echo "rank $NODE_RANK of $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT, GPUs per node $NUM_GPU_PER_NODE"
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e /workspace/specs/train.yaml results_dir="$out" \
    train.num_gpus="$NUM_GPU_PER_NODE" train.num_nodes="$NNODES"
else
  echo "no tao CLI in this image: writing a placeholder model"
  echo "{\"model\": \"placeholder\", \"rank\": $NODE_RANK}" > "$out/model-rank$NODE_RANK.json"
fi
"""


@dag(
    dag_id="tao_k8s_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["tao", "kubernetes", "example"],
)
def tao_k8s_train():
    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CONN_ID,
        image=IMAGE,
        command=TRAIN,
        gpu_count=GPUS,
        num_nodes=NODES,
        backend_details={"memory": "64Gi", "cpu": "8", "unschedulable_timeout_seconds": 1800},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=8),
    )
    report = TAOSubmitOperator(
        task_id="report",
        conn_id=CONN_ID,
        image=IMAGE,
        command='ls "$TAO_RESULTS_ROOT/{{ ti.xcom_pull(task_ids="train")["job_id"] }}"',
        gpu_count=0,
        deferrable=True,
        poll_interval=POLL,
    )
    train >> report


tao_k8s_train()

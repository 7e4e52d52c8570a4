"""Train a TAO model on two nodes of a DGX Cloud Lepton node group, watched from the triggerer, then report.

Needs an Airflow connection of type ``tao_lepton`` (Admin > Connections, or an ``AIRFLOW_CONN_*`` variable), e.g.::

    AIRFLOW_CONN_TAO_LEPTON_DEFAULT='{"conn_type": "tao_lepton", "password": "<Lepton API token>",
      "extra": {"workspace_id": "<workspace id>", "node_group": "h100-pool", "ngc_api_key": "<NGC API key>"}}'

``train`` resolves the resource shape from ``gpu_count`` (8 GPUs per node: e.g. ``gpu.8xh100-80gb``) among the
node group's shapes, mounts the node group's Lustre volume (``/mnt/<volume>``, at the prefix its storage
permissions grant; results land in ``/mnt/<volume>/results/<job_id>`` and S3 inputs would be cached there), turns
the NGC key into a per-job image pull secret, and submits one job with ``completions = parallelism = 2`` and
intra-job communication. The rendered spec and the in-job runner reach the job in secret-held environment variables
(large ones through the shared volume); every replica gets ``NODE_RANK``, ``MASTER_ADDR`` (replica 0),
``MASTER_PORT``, ``WORLD_SIZE`` = ``NNODES`` and ``NUM_GPU_PER_NODE`` from Lepton's worker variables, translated by
a script shipped with the job -- nothing is downloaded at job start. The task then defers: every watched job of the
workspace is polled with ONE job list per interval, and the rank-0 replica's log appears in the task log.
``report`` runs a tiny CPU job on the same volume that lists what the training job wrote.

Every value below can be overridden with an environment variable of the same name (the CI test runs it against
``tests/leptonfake`` with ``TAO_LEPTON_IMAGE=local/debian-py:ci TAO_LEPTON_GPUS=1``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CONN_ID = os.environ.get("TAO_LEPTON_CONN_ID", "tao_lepton_default")
IMAGE = os.environ.get("TAO_LEPTON_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI
GPUS = int(os.environ.get("TAO_LEPTON_GPUS", "8"))
NODES = int(os.environ.get("TAO_LEPTON_NODES", "2"))
POLL = float(os.environ.get("TAO_LEPTON_POLL", "30"))

TRAIN = r"""
out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"
mkdir -p "$out"
echo "rank $NODE_RANK of $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT, GPUs per node $NUM_GPU_PER_NODE"
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e {config_path} results_dir="$out"
else
  echo "no tao CLI in this image: writing a placeholder model"
  echo "{\"model\": \"placeholder\", \"rank\": $NODE_RANK}" > "$out/model-rank$NODE_RANK.json"
fi
"""


@dag(
    dag_id="tao_lepton_multinode",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["tao", "lepton", "multi-node", "example"],
)
def tao_lepton_multinode():
    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CONN_ID,
        image=IMAGE,
        command=TRAIN,
        specs={
            "train": {"num_gpus": GPUS, "num_nodes": NODES, "num_epochs": 10, "precision": "bf16"},
            "model": {"backbone": {"type": "fan_small_12_p4_hybrid"}},
        },
        gpu_count=GPUS,
        num_nodes=NODES,
        # Queueing longer than 30 minutes for capacity fails the try as ERR_CAPACITY (retried after retry_delay).
        backend_details={"capacity_timeout_seconds": 1800, "shared_memory_size": 65536},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=12),
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


tao_lepton_multinode()

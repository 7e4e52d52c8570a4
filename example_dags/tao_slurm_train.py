"""Train a TAO model on a SLURM cluster: data on the shared filesystem, 2 nodes x 8 GPUs, watched from the triggerer.

Needs an Airflow connection of type ``tao_slurm`` (Admin > Connections, or an ``AIRFLOW_CONN_*`` variable), e.g.::

    AIRFLOW_CONN_TAO_SLURM_DEFAULT='{"conn_type": "tao_slurm", "host": "login1.example.org,login2.example.org",
      "login": "alice", "extra": {"key_file": "/opt/airflow/keys/id_ed25519", "host_key": "ssh-ed25519 AAAA...",
      "partition": "polar,polar3", "account": "my-account", "results_root": "/lustre/fsw/my-project/alice",
      "container_runtime": "pyxis"}}'

``check_data`` fails fast (before any GPU is asked for) when the data set is not on the cluster; ``train`` stages
the job under ``<results_root>/jobs/<job_id>`` over ONE SSH connection, submits it with ``sbatch`` and defers;
every job of the connection is then polled with one ``squeue`` per interval over one shared SSH connection, and
the job's ``main.out`` / ``main.err`` lines appear in the task log. An infrastructure failure (node fault, GPU
that fell off the bus, preemption) is requeued on the cluster up to the connection's ``max_resubmits``; a CUDA
out-of-memory error fails the task at once with ``ERR_OOM``. ``report`` lists what the job wrote.

Every value below can be overridden with an environment variable of the same name (e.g. to try the DAG on the CI
cluster of ``scripts/slurm-up.sh``: ``TAO_SLURM_CONN_ID=tao_slurm_ci TAO_SLURM_IMAGE=$SLURM_CI_OCI_BUNDLE_PY
TAO_SLURM_GPUS=0 TAO_SLURM_DATA=lustre://$SLURM_CI_RESULTS_ROOT``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CONN_ID = os.environ.get("TAO_SLURM_CONN_ID", "tao_slurm_default")
IMAGE = os.environ.get("TAO_SLURM_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI / bundle
GPUS = int(os.environ.get("TAO_SLURM_GPUS", "8"))
NODES = int(os.environ.get("TAO_SLURM_NODES", "2"))
DATA = os.environ.get("TAO_SLURM_DATA", "lustre:///lustre/fsw/my-project/datasets/coco-mini")
POLL = float(os.environ.get("TAO_SLURM_POLL", "30"))

# One task per node. Multi-node jobs get WORLD_SIZE (= nodes, TAO's convention), NNODES, NODE_RANK,
# NUM_GPU_PER_NODE, MASTER_ADDR and MASTER_PORT in every task; single-node jobs get none of them (a launcher that
# spawns one rank per GPU must not see WORLD_SIZE=1). Results go to $TAO_RESULTS_ROOT/$TAO_JOB_ID (= results_dir).
TRAIN = r"""
set -euo pipefail
out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"
echo "node ${NODE_RANK:-0} of ${NNODES:-1}, rendezvous ${MASTER_ADDR:-local}:${MASTER_PORT:--}"
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e "$SPEC" results_dir="$out" dataset.train_data_path="$DATA"
else
  echo "no tao CLI in this image: writing a placeholder model"
  [ "${NODE_RANK:-0}" != 0 ] || echo '{"model": "placeholder"}' > "$out/model.json"
fi
"""


@dag(
    dag_id="tao_slurm_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["tao", "slurm", "example"],
)
def tao_slurm_train():
    @task
    def check_data() -> str:
        """Fail before asking for GPUs when the data set is not on the cluster's shared filesystem."""
        from airflow_provider_tao.hooks.slurm import SlurmHook

        if not SlurmHook(conn_id=CONN_ID).check_path(DATA):
            raise FileNotFoundError(f"{DATA} is not on the cluster; stage it on the shared filesystem first")
        return DATA

    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CONN_ID,
        image=IMAGE,
        command=TRAIN,
        gpu_count=GPUS,
        num_nodes=NODES,
        env={"DATA": DATA.removeprefix("lustre://"), "SPEC": "/workspace/specs/train.yaml"},
        backend_details={"time_hours": 4, "inputs": [DATA]},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=5),
    )

    @task
    def report(result: dict) -> list[str]:
        """What the job wrote to its results folder (read over SSH)."""
        from airflow_provider_tao.hooks.slurm import SlurmHook

        files = SlurmHook(conn_id=CONN_ID).list_path(result["results_dir"])
        print(f"Slurm job {result['backend_job_id']} ({result['job_id']}) wrote {files} to {result['results_dir']}")
        return files

    check_data() >> train
    report(train.output)


tao_slurm_train()

"""Train a TAO model on a SLURM cluster: one node, one GPU, the data set on the shared filesystem, watched from the
triggerer.

Needs an Airflow connection of type ``tao_slurm`` (Admin > Connections, or an ``AIRFLOW_CONN_*`` variable), e.g.::

    AIRFLOW_CONN_TAO_SLURM_DEFAULT='{"conn_type": "tao_slurm", "host": "login1.example.org,login2.example.org",
      "login": "alice", "extra": {"key_file": "/opt/airflow/keys/id_ed25519", "host_key": "ssh-ed25519 AAAA...",
      "partition": "polar,polar3", "account": "my-account", "results_root": "/lustre/fsw/my-project/alice",
      "container_runtime": "pyxis"}}'

and a cluster its admin set up as docs/howto/slurm.md's checklist says (python3 in the image, ``results_root`` seen
by the login and compute nodes, pyxis/enroot credentials for nvcr.io).

``train`` declares its data with the operator's own ``inputs=``: the spec's ``dataset.train_data_path`` is checked
to exist on the cluster (over SSH) before anything is submitted, so a missing data set fails the task before any GPU
is asked for. The job is staged under ``<results_root>/jobs/<job_id>`` over ONE SSH connection, submitted with
``sbatch`` and deferred; every job of the connection is polled with one ``squeue`` per interval, and the job's
output appears in the task log. The spec is written to a file whose path replaces ``{config_path}``; the output
``train.results_dir`` is filled in with a folder of the job's results. ``report`` lists what the job wrote.

Every value below can be overridden with an environment variable of the same name (e.g. to try the DAG on the CI
cluster of ``scripts/slurm-up.sh``: ``TAO_SLURM_CONN_ID=tao_slurm_ci TAO_SLURM_IMAGE=$SLURM_CI_OCI_BUNDLE_PY
TAO_SLURM_GPUS=0 TAO_SLURM_DATA=$SLURM_CI_RESULTS_ROOT``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CONN_ID = os.environ.get("TAO_SLURM_CONN_ID", "tao_slurm_default")
IMAGE = os.environ.get("TAO_SLURM_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI / bundle
GPUS = int(os.environ.get("TAO_SLURM_GPUS", "1"))
DATA = os.environ.get("TAO_SLURM_DATA", "/lustre/fsw/my-project/datasets/coco-mini")  # a path on the cluster
POLL = float(os.environ.get("TAO_SLURM_POLL", "30"))

# {config_path} and {results_dir} are replaced by the spec file's path and the job's results folder.
TRAIN = r"""
set -euo pipefail
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e {config_path}
else
  echo "no tao CLI in this image: writing a placeholder model"
  echo '{"model": "placeholder"}' > {results_dir}/model.json
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
    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CONN_ID,
        image=IMAGE,
        command=TRAIN,
        gpu_count=GPUS,  # one GPU on one node (num_nodes=1, the default)
        specs={
            "dataset": {"train_data_path": DATA},
            "train": {"num_epochs": 10, "results_dir": ""},  # filled in: a folder of the job's results
        },
        inputs=["dataset.train_data_path"],  # checked on the cluster before submission
        outputs=["train.results_dir"],
        backend_details={"time_hours": 2},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=3),
    )

    @task
    def report(result: dict) -> list[str]:
        """What the job wrote to its results folder (read over SSH)."""
        from airflow_provider_tao.hooks.slurm import SlurmHook

        files = SlurmHook(conn_id=CONN_ID).list_path(result["results_dir"])
        print(f"Slurm job {result['backend_job_id']} ({result['job_id']}) wrote {files} to {result['results_dir']}")
        return files

    report(train.output)


tao_slurm_train()

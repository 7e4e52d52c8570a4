"""Train where the GPUs are: DGX Cloud Lepton first, the SLURM cluster when Lepton has no capacity, then a Brev spot
instance -- in ONE task try -- and report what every attempt cost in GPU-hours.

``train`` submits the job on the first connection of its chain. When that platform finds no capacity for it -- it
gives up by itself (Lepton's ``capacity_timeout_seconds``, Kubernetes' ``unschedulable_timeout_seconds``, a Brev type
chain with nothing available), or the job waits for resources longer than ``capacity_timeout`` -- the provider
cancels it there and submits the same job on the next connection, without using an Airflow retry. A program error
or an out-of-memory kill never moves (it would fail the same way anywhere). Every connection of the chain is checked
before anything runs (its image rule, multi-node support, its settings, the inputs it can see), so a chain that
could never run fails at once, naming the connection.

``report`` reads ``train``'s XCom: ``attempts`` (platform, connection, job id, outcome, reason, GPUs x nodes,
queued / run time, GPU-hours -- all from the times the platforms report) and the task's total ``gpu_hours``. The
same numbers go to Airflow's metrics (``tao.job.gpu_seconds``, ``tao.job.run_time``, ``tao.job.queued_time``,
``tao.job.attempts``, ``tao.job.failovers``; tagged with dag_id, task_id, platform, gpu_type) to chart spend by DAG.

Needs three connections (Admin > Connections, or ``AIRFLOW_CONN_*`` variables): ``tao_lepton_default`` (type
``tao_lepton``), ``tao_slurm_default`` (``tao_slurm``), ``tao_brev_default`` (``tao_brev``); settings per connection
go in ``backend_details`` keyed by connection id. Every value below can be overridden with an environment variable of
the same name (the CI test runs a Lepton -> SLURM chain on the test backends).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task

from airflow_provider_tao.operators.submit import TAOSubmitOperator

CHAIN = os.environ.get("TAO_FAILOVER_CHAIN", "tao_lepton_default,tao_slurm_default,tao_brev_default").split(",")
IMAGE = os.environ.get("TAO_FAILOVER_IMAGE", "tao_toolkit.pyt")  # a versions.yaml key, or an image URI
GPUS = int(os.environ.get("TAO_FAILOVER_GPUS", "8"))
#: Seconds a job may wait for resources on a connection before it moves to the next one.
CAPACITY_TIMEOUT = float(os.environ.get("TAO_FAILOVER_CAPACITY_TIMEOUT", "1800"))
POLL = float(os.environ.get("TAO_FAILOVER_POLL", "30"))
#: Per-connection settings: the partition on SLURM, the instance types on Brev, the shape on Lepton.
DETAILS: dict[str, Any] = json.loads(
    os.environ.get("TAO_FAILOVER_DETAILS", "")
    or json.dumps(
        {
            "tao_lepton_default": {"resource_shape": "gpu.8xh100-80gb", "capacity_timeout_seconds": 1800},
            "tao_slurm_default": {"partition": "gpu", "time_hours": 8},
            "tao_brev_default": {"instance_type": "p4d.24xlarge,p5.48xlarge", "lease_hours": 10},
        }
    )
)

TRAIN = r"""
out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"
mkdir -p "$out"
echo "training job $TAO_JOB_ID"
if command -v tao >/dev/null 2>&1; then
  tao model classification_pyt train -e /workspace/specs/train.yaml results_dir="$out"
else
  echo "no tao CLI in this image: writing a placeholder model"
  sleep 3
  echo '{"model": "placeholder"}' > "$out/model.json"
fi
"""


@dag(
    dag_id="tao_failover_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    tags=["tao", "failover", "gpu-hours", "example"],
)
def tao_failover_train():
    train = TAOSubmitOperator(
        task_id="train",
        conn_id=CHAIN[0],
        fallback_conn_ids=CHAIN[1:],
        capacity_timeout=CAPACITY_TIMEOUT,
        image=IMAGE,
        command=TRAIN,
        gpu_count=GPUS,
        backend_details={conn: details for conn, details in DETAILS.items() if conn in CHAIN},
        deferrable=True,
        poll_interval=POLL,
        execution_timeout=timedelta(hours=12),
    )

    @task
    def report(result: dict[str, Any]) -> float | None:
        """Where the job ran, how it got there, and what it cost."""
        for number, attempt in enumerate(result["attempts"], 1):
            gpus = "?" if attempt["gpus"] is None else attempt["gpus"]
            hours = "unknown" if attempt["gpu_hours"] is None else f"{attempt['gpu_hours']:.4f}"
            print(
                f"attempt {number}: {attempt['platform']} ({attempt['conn_id']}) {attempt['outcome']}: "
                f"queued {attempt['queued_seconds']:.0f} s, ran {attempt['run_seconds']:.0f} s on {gpus} GPU(s) "
                f"{attempt['gpu_type'] or ''}= {hours} GPU-hours; {attempt['reason']}"
            )
        print(f"trained on {result['platform']} (job {result['job_id']}): {result['gpu_hours']} GPU-hours in all")
        total: float | None = result["gpu_hours"]
        return total

    report(train.output)


tao_failover_train()

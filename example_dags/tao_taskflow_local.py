"""A Python function run as a TAO job with ``@task.tao``, on the ``local`` platform (the worker host, no
connection needed), its return value used by the next task.

``train`` is an ordinary function: ``@task.tao`` ships its source and its arguments with the job (pickled, as
``@task.docker`` does), runs it in the job's Python through the in-job runner -- which first copies the data set to
the path the function reads -- and brings its return value back as the task's XCom. Its ``print`` output streams
into the task log while it runs; an exception would fail the task as ``ERR_PROGRAM`` with its traceback in the log.
``report`` receives the returned metrics like any TaskFlow value. On a cluster, the same function runs with GPUs by
changing the decorator's arguments (see docs/howto/taskflow.md): ``@task.tao(conn_id="tao_slurm_default", gpu_count=8,
image="tao_toolkit.pyt")``.

Every value below can be overridden with an environment variable of the same name.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import dag, task

DATA = os.environ.get("TAO_TASKFLOW_DATA", "/data/datasets/iris.csv")  # a file on the worker host
STAGED = os.environ.get("TAO_TASKFLOW_STAGED", "/tmp/tao-taskflow/train.csv")  # where the job reads it
RESULTS = os.environ.get("TAO_TASKFLOW_RESULTS")  # default: [tao] default_results_uri, else the local root
POLL = float(os.environ.get("TAO_TASKFLOW_POLL", "5"))


@dag(
    dag_id="tao_taskflow_local", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["tao", "example"]
)
def tao_taskflow_local():
    @task.tao(platform="local", gpu_count=0, inputs={STAGED: DATA}, results_uri=RESULTS, poll_interval=POLL)
    def train(epochs: int, data: str) -> dict:
        import json
        import os

        with open(data) as rows:
            samples = sum(1 for _ in rows)
        for epoch in range(1, epochs + 1):
            print(f"epoch {epoch}/{epochs}: {samples} samples", flush=True)
        model = os.path.join(os.environ["TAO_RESULTS_DIR"], "model.json")
        with open(model, "w") as out:
            json.dump({"epochs": epochs, "samples": samples}, out)
        return {"samples": samples, "model": model}

    @task
    def report(metrics: dict) -> None:
        print(f"trained on {metrics['samples']} samples; model at {metrics['model']}")

    report(train(epochs=3, data=STAGED))


tao_taskflow_local()

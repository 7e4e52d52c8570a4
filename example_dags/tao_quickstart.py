"""Quickstart: a weekly retraining pipeline on the ``local`` platform (no GPU, no service, no download).

``prepare_data`` writes a small synthetic data set, ``train`` runs a tiny training program as a TAO job on the
worker host (deferrable: it waits in the triggerer, streaming the job's log into the task log), and ``evaluate``
reads the training task's XCom, loads the trained model from its results folder and scores it on held-out data.
Trigger it with ``{"epochs": 60, "epoch_seconds": 2}`` to watch a longer job in the UI.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, task
from quickstart.tiny_data import TRAIN_SCRIPT, held_out_mse, write_training_set

from airflow_provider_tao.operators.submit import TAOSubmitOperator


@dag(
    dag_id="tao_quickstart",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    params={
        "epochs": Param(8, type="integer", minimum=1, description="Training epochs"),
        "epoch_seconds": Param(0.5, type="number", minimum=0, description="Seconds each epoch lasts"),
    },
    tags=["tao", "example"],
)
def tao_quickstart():
    @task
    def prepare_data(run_id: str | None = None) -> str:
        """Write this run's synthetic training set and return its path."""
        return write_training_set(run_id)

    train = TAOSubmitOperator(
        task_id="train",
        platform="local",
        command=[sys.executable, str(TRAIN_SCRIPT)],
        gpu_count=0,
        env={
            "TRAIN_CSV": "{{ ti.xcom_pull(task_ids='prepare_data') }}",
            "EPOCHS": "{{ params.epochs }}",
            "EPOCH_SECONDS": "{{ params.epoch_seconds }}",
        },
        deferrable=True,
        poll_interval=1,
        execution_timeout=timedelta(minutes=10),
    )

    @task
    def evaluate(result: dict) -> dict:
        """Score the trained model on held-out samples; fail the run if it did not learn."""
        results = Path(result["results_dir"])
        model = json.loads((results / "model.json").read_text())
        checkpoints = sorted((results / "checkpoints").glob("epoch_*.json"))
        mse = held_out_mse(model)
        print(f"job {result['job_id']}: {len(checkpoints)} checkpoints, model {model}, held-out MSE {mse:.5f}")
        if mse > 0.05:
            raise ValueError(f"the model did not learn: held-out MSE {mse:.4f}")
        return {"job_id": result["job_id"], "heldout_mse": mse, "checkpoints": len(checkpoints), **model}

    data = prepare_data()
    data >> train
    evaluate(train.output)


tao_quickstart()

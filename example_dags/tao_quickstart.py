"""Quickstart: a weekly retraining pipeline on the ``local`` platform (no GPU, no service, no download).

``prepare_data`` writes a small synthetic data set, ``train`` runs a tiny training program as a TAO job on the
worker host (deferrable: it waits in the triggerer, streaming the job's log into the task log), and ``evaluate``
reads the training task's XCom, loads the trained model from its results folder and scores it on held-out data.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task

from airflow_provider_tao.operators.submit import TAOSubmitOperator

TRAIN_SCRIPT = Path(__file__).parent / "quickstart" / "train_tiny.py"
TRUE_W, TRUE_B = 3.0, 2.0


def _samples(count: int, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(x, TRUE_W * x + TRUE_B + rng.gauss(0, 0.05)) for x in (rng.uniform(-1, 1) for _ in range(count))]


@dag(
    dag_id="tao_quickstart",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    tags=["tao", "example"],
)
def tao_quickstart():
    @task
    def prepare_data(run_id: str | None = None) -> str:
        """Write this run's synthetic training set and return its path."""
        import os

        folder = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "tao" / "quickstart-data"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"train-{abs(hash(run_id)) % 10**8}.csv"
        path.write_text("".join(f"{x},{y}\n" for x, y in _samples(200, seed=1)))
        return str(path)

    train = TAOSubmitOperator(
        task_id="train",
        platform="local",
        command=[sys.executable, str(TRAIN_SCRIPT)],
        gpu_count=0,
        env={"TRAIN_CSV": "{{ ti.xcom_pull(task_ids='prepare_data') }}", "EPOCHS": "8"},
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
        held_out = _samples(50, seed=2)
        mse = sum(((model["w"] * x + model["b"]) - y) ** 2 for x, y in held_out) / len(held_out)
        print(f"job {result['job_id']}: {len(checkpoints)} checkpoints, model {model}, held-out MSE {mse:.5f}")
        if mse > 0.05:
            raise ValueError(f"the model did not learn: held-out MSE {mse:.4f}")
        return {"job_id": result["job_id"], "heldout_mse": mse, "checkpoints": len(checkpoints), **model}

    data = prepare_data()
    data >> train
    evaluate(train.output)


tao_quickstart()

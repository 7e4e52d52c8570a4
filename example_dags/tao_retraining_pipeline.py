"""A retraining pipeline on the ``local`` platform: a scheduled training DAG publishes each new model as an Airflow
Asset event, and an evaluation DAG runs whenever there is a new model.

``tao_retraining_train`` (daily) trains the quickstart's tiny model as a TAO job; its task has the model Asset in
``outlets``, so when the job completes the Asset gets an event whose ``extra`` says which model it is (job id,
platform, results folder, outputs, and the job's ``metrics.json``). ``tao_retraining_evaluate`` is scheduled on that
Asset: it reads the event, loads that model and scores it on held-out data -- the place for a deploy step.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Asset, dag, task
from quickstart.tiny_data import TRAIN_SCRIPT, held_out_mse, write_training_set

from airflow_provider_tao.operators.submit import TAOSubmitOperator

#: The trained model. Its URI names the model line; each event's extra says where this version is.
TINY_MODEL = Asset(name="tao_tiny_linear_model", uri="file:///tao/models/tiny-linear")


@dag(
    dag_id="tao_retraining_train",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["tao", "example"],
)
def tao_retraining_train():
    @task
    def prepare_data(run_id: str | None = None) -> str:
        return write_training_set(run_id)

    train = TAOSubmitOperator(
        task_id="train",
        platform="local",
        command=[sys.executable, str(TRAIN_SCRIPT)],
        gpu_count=0,
        env={"TRAIN_CSV": "{{ ti.xcom_pull(task_ids='prepare_data') }}", "EPOCHS": "8"},
        deferrable=True,
        poll_interval=1,
        execution_timeout=timedelta(minutes=10),
        outlets=[TINY_MODEL],  # a completed job publishes the model: job id, results, metrics in the event
    )
    prepare_data() >> train


@dag(dag_id="tao_retraining_evaluate", schedule=[TINY_MODEL], start_date=datetime(2026, 1, 1), tags=["tao", "example"])
def tao_retraining_evaluate():
    @task
    def evaluate(triggering_asset_events=None) -> dict:
        """Score every model version that triggered this run; fail if one did not learn."""
        scores = {}
        for event in triggering_asset_events[TINY_MODEL]:
            model_info = event.extra
            model = json.loads((Path(model_info["results_dir"]) / "model.json").read_text())
            mse = held_out_mse(model)
            print(
                f"model of job {model_info['job_id']} on {model_info['platform']} "
                f"(train MSE {model_info.get('metrics', {}).get('train_mse')}): held-out MSE {mse:.5f}"
            )
            if mse > 0.05:
                raise ValueError(f"model of job {model_info['job_id']} did not learn: held-out MSE {mse:.4f}")
            scores[model_info["job_id"]] = mse
        return scores

    evaluate()


tao_retraining_train()
tao_retraining_evaluate()

"""Scheduled retraining that tunes first: a hyperparameter search on the ``local`` platform (CPU only, no service, no
download, under two minutes), whose best model is published as an Asset event for the DAGs that deploy it.

``tune`` runs up to 12 trials of a tiny trainer, 4 at once; Optuna's TPE proposes the parameters and ASHA stops the
trials that fall behind at a rung (their processes are canceled, the trials recorded ``pruned``). Each trial is a job
with its parameters written into its spec (``{config_path}``) and in ``TAO_TRIAL_PARAMS``; its log lines
``Epoch N/M - val_loss: X`` are its live metric. ``report`` reads the search's XCom: the best trial, every trial's
state and value, the GPU-hours. Needs ``pip install 'airflow-provider-tao[automl]'``.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

from airflow.sdk import Asset, dag, task
from quickstart.tiny_data import TRAIN_SCRIPT

from airflow_provider_tao.operators.automl import TAOAutoMLOperator

TUNE_SCRIPT = TRAIN_SCRIPT.with_name("tune_tiny.py")
BEST_MODEL = Asset(name="tao_tiny_tuned_model", uri="file:///tao/models/tiny-tuned")


@dag(
    dag_id="tao_automl",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    tags=["tao", "example", "automl"],
)
def tao_automl():
    tune = TAOAutoMLOperator(
        task_id="tune",
        platform="local",
        gpu_count=0,
        command=f"{sys.executable} {TUNE_SCRIPT} {{config_path}}",
        specs={
            "train": {"lr": 1e-2, "epochs": 9, "epoch_seconds": 0.3},
            "model": {"width": 32, "dropout": 0.2},
        },
        config_format="json",
        search_space={
            "train.lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
            "model.width": {"type": "categorical", "choices": [16, 32, 64, 128]},
            "model.dropout": {"type": "float", "low": 0.0, "high": 0.5},
        },
        metric="val_loss",
        direction="minimize",
        algorithm="tpe",
        pruner="asha",
        max_trials=12,
        max_concurrent_trials=4,
        seed=42,
        deferrable=True,
        poll_interval=1,
        execution_timeout=timedelta(minutes=10),
        outlets=[BEST_MODEL],
    )

    @task
    def report(result: dict) -> dict:
        """Say what the search found; fail the run if it found nothing good."""
        states = [t["state"] for t in result["trials"]]
        best = result["best"]
        print(f"best trial {best['trial']}: val_loss {best['value']:.4f} with {best['params']}")
        print(f"trials: {len(states)}, pruned {states.count('pruned')}, complete {states.count('complete')}")
        if best["value"] > 1.0:
            raise ValueError(f"the search found no good model: {best}")
        return best

    report(tune.output)


tao_automl()

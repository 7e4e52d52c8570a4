"""Two hyperparameter searches on the local platform in one DAG run, driven by tests/e2e/test_tao_automl.py.

Every trial waits for ``<gate_dir>/go`` (the test creates it once it has seen the first trials running at once and
has killed what it kills), then runs 6 epochs of a fraction of a second, printing ``Epoch N/M - val_loss: X`` (worse
for learning rates far from 1e-2, falling with the epochs, and worse by 10 for each later trial), so ASHA has trials to
stop early whatever order its polls see the trials in: trials 4 and 5 start only once an earlier, better trial has
reported its first epoch, and a trial worse than every earlier one at the first rung is stopped (reduction factor 3).
``tune`` waits in the triggerer (its triggerer is restarted, a person cancels one of its trials); ``tune_sync`` waits
on the worker (its worker is SIGKILLed, its retry adopts the trials in flight).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_tao.operators.automl import TAOAutoMLOperator

TRAIN = (
    'while [ ! -e "$GATE_DIR/go" ]; do sleep 0.1; done; '
    'python3 -c "import json, math, os, time\n'
    "p = json.loads(os.environ['TAO_TRIAL_PARAMS'])\n"
    "floor = (math.log10(p['lr']) + 2) ** 2 + 0.1 * p['depth'] + 10 * int(os.environ['TAO_TRIAL_NUMBER'])\n"
    "for e in range(1, 7):\n"
    "    time.sleep(0.7)\n"
    "    print(f'Epoch {e}/6 - val_loss: {floor + 1 / e:.4f}', flush=True)\n"
    '"'
)

SEARCH = {
    "conn_id": "tao_e2e",
    "command": TRAIN,
    "gpu_count": 0,
    "env": {"GATE_DIR": "{{ dag_run.conf['gate_dir'] }}"},
    "search_space": {
        "lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
        "depth": {"type": "int", "low": 1, "high": 4},
    },
    "metric": "val_loss",
    "direction": "minimize",
    "algorithm": "tpe",
    "seed": 3,
    "poll_interval": 1,
}

with DAG(
    dag_id="tao_e2e_automl",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
):
    TAOAutoMLOperator(task_id="tune", pruner="asha", max_trials=6, max_concurrent_trials=3, deferrable=True, **SEARCH)
    TAOAutoMLOperator(
        task_id="tune_sync", pruner=None, max_trials=2, max_concurrent_trials=2, deferrable=False, **SEARCH
    )

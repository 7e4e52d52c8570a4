"""The DAG of tests/integration/lineage/test_openlineage.py: a ``@task.tao`` job that reads a file and completes
(deferred: its end is seen by a resumed task), and one whose function raises."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import dag, task

DATA = os.environ["TAO_LINEAGE_DATA"]
STAGED = os.environ["TAO_LINEAGE_STAGED"]
RESULTS = os.environ["TAO_LINEAGE_RESULTS"]


@dag(dag_id="tao_lineage_local", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def tao_lineage_local():
    common = {"platform": "local", "gpu_count": 0, "results_uri": RESULTS, "poll_interval": 0.5}

    @task.tao(inputs={STAGED: DATA}, deferrable=True, **common)
    def train(data: str) -> int:
        with open(data) as rows:
            return sum(1 for _ in rows)

    @task.tao(retries=0, **common)
    def diverge() -> None:
        raise FloatingPointError("loss is nan")

    train(STAGED)
    diverge()


tao_lineage_local()

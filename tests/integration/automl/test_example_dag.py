"""The AutoML example DAG runs as ``airflow dags test`` runs it (real task runner, its trigger inline), on ``local``."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.integration.example_dag import REPO, run_example_dag


def test_the_automl_example_tunes_prunes_and_publishes_the_best_model(tmp_path: Path) -> None:
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO / "example_dags"), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__TAO__LOCAL_JOBS_DIR": str(tmp_path / "jobs"),
        "AIRFLOW__TAO__LOCAL_RESULTS_ROOT": str(tmp_path / "results"),
    }
    output = run_example_dag("tao_automl", tmp_path, env)
    found = re.search(r"trials: (\d+), pruned (\d+), complete (\d+)", output)
    assert found is not None, output[-3000:]
    trials, pruned, complete = map(int, found.groups())
    assert trials == 12 and pruned >= 1 and pruned + complete == 12, output[-3000:]
    assert "best trial" in output

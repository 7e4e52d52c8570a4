"""``example_dags/tao_slurm_train.py`` run by ``dag.test()`` against the real cluster: check_data -> train (deferred)
-> report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.example_dag import run_example_dag

pytestmark = pytest.mark.integration


def test_example_dag_trains_on_the_cluster(slurm_cluster: Any, tmp_path: Path) -> None:
    env = {
        "AIRFLOW_CONN_TAO_SLURM_CI": slurm_cluster.airflow_conn_json,
        "TAO_SLURM_CONN_ID": "tao_slurm_ci",
        "TAO_SLURM_IMAGE": str(slurm_cluster.oci_bundle_py),
        "TAO_SLURM_GPUS": "0",
        "TAO_SLURM_NODES": "1",
        "TAO_SLURM_DATA": f"lustre://{slurm_cluster.results_root}",
        "TAO_SLURM_POLL": "1",
    }
    output = run_example_dag("tao_slurm_train", tmp_path, env)
    assert "[job] no tao CLI in this image: writing a placeholder model" in output  # streamed from main.out
    assert "wrote ['model.json']" in output  # report read the results folder over SSH

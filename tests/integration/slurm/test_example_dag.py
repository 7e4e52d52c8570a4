"""``example_dags/tao_slurm_train.py`` run by ``dag.test()`` against the real cluster: train (its ``inputs=`` checked
on the cluster, deferred) -> report."""

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
        "TAO_SLURM_DATA": str(slurm_cluster.results_root),
        "TAO_SLURM_POLL": "1",
    }
    output = run_example_dag("tao_slurm_train", tmp_path, env)
    assert "[job] no tao CLI in this image: writing a placeholder model" in output  # streamed from main.out
    assert "'model.json'" in output.split(" wrote ")[-1]  # report read the results folder over SSH

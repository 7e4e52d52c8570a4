"""``example_dags/tao_docker_train.py`` run by ``dag.test()`` against the real engine: train (deferred) -> report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.docker.conftest import DockerEngine, docker_connection
from tests.integration.example_dag import run_example_dag

pytestmark = pytest.mark.integration


def test_example_dag_trains_in_a_container(docker_engine: DockerEngine, results_root: Path, tmp_path: Path) -> None:
    env = {
        "AIRFLOW_CONN_TAO_DOCKER_EXAMPLE": docker_connection(docker_engine, results_root),
        "TAO_DOCKER_CONN_ID": "tao_docker_example",
        "TAO_DOCKER_IMAGE": docker_engine.busybox,
        "TAO_DOCKER_GPUS": "0",
        "TAO_DOCKER_DATA": str(tmp_path),
        "TAO_DOCKER_POLL": "1",
    }
    output = run_example_dag("tao_docker_train", tmp_path, env)
    assert "[job] no tao CLI in this image: writing a placeholder model" in output  # streamed from docker logs
    assert "wrote ['model.json']" in output  # report read the results folder on the daemon's host

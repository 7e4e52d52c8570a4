"""``example_dags/tao_k8s_train.py`` run by ``dag.test()`` against the fake API server: a 2-node train -> report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.docker.conftest import DockerEngine
from tests.integration.example_dag import run_example_dag
from tests.integration.kubernetes.conftest import KubeFake, kubernetes_connection

pytestmark = pytest.mark.integration


def test_example_dag_trains_on_two_nodes_and_reports(
    docker_engine: DockerEngine, kubefake: KubeFake, tmp_path: Path
) -> None:
    env = {
        "AIRFLOW_CONN_TAO_K8S_EXAMPLE": kubernetes_connection(kubefake),
        "TAO_K8S_CONN_ID": "tao_k8s_example",
        "TAO_K8S_IMAGE": docker_engine.busybox,
        "TAO_K8S_GPUS": "0",
        "TAO_K8S_POLL": "1",
    }
    output = run_example_dag("tao_k8s_train", tmp_path, env)
    assert "[job] rank 0 of 2, master " in output  # streamed from the rank-0 pod's log
    assert "[job] model-rank0.json" in output and "[job] model-rank1.json" in output  # report saw both ranks' files

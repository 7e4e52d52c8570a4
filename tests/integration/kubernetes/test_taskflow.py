"""``@task.tao`` on the Kubernetes fake: the function runs in a pod; its results folder is a PVC the worker cannot
read, so the return value comes back through the end of the job's log."""

from __future__ import annotations

from typing import Any

from tests.integration.docker.conftest import DockerEngine
from tests.integration.kubernetes.conftest import CONN_ID, KubeFake
from tests.integration.taskflow_checks import check_taskflow
from tests.integration.taskrun import Triggerer


def test_task_tao_runs_the_function_in_a_pod(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, capfd: Any
) -> None:
    value = check_taskflow(triggerer, capfd, conn_id=CONN_ID, image=docker_engine.python)
    assert value["rank"] == "0"

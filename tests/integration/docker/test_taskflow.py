"""``@task.tao`` on the real Docker engine: the function runs in the image's Python (local/debian-py:ci)."""

from __future__ import annotations

from typing import Any

from tests.integration.docker.conftest import CONN_ID, DockerEngine
from tests.integration.taskflow_checks import check_taskflow
from tests.integration.taskrun import Triggerer


def test_task_tao_runs_the_function_in_the_image(docker_engine: DockerEngine, triggerer: Triggerer, capfd: Any) -> None:
    check_taskflow(triggerer, capfd, conn_id=CONN_ID, image=docker_engine.python)

"""``@task.tao`` on the real SLURM cluster: the function runs in the job's Python on a compute node."""

from __future__ import annotations

from typing import Any

from tests.integration.taskflow_checks import check_taskflow
from tests.integration.taskrun import Triggerer


def test_task_tao_runs_the_function_on_the_cluster(
    slurm_cluster: Any, slurm_conn: str, triggerer: Triggerer, capfd: Any
) -> None:
    check_taskflow(triggerer, capfd, conn_id=slurm_conn, image=str(slurm_cluster.oci_bundle_py))

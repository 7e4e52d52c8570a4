"""One ``airflow standalone`` for every UI, CLI and Asset test: the example DAGs plus ``dags/tao_ui_e2e.py``, a
``tao_docker`` connection on the test Docker engine, a ``tao_brev`` connection on a fake Brev world (the fake ``brev``
CLI, its instances real containers on the same engine), the UI's connection "Test" button on, and providers
discovered eagerly so the TAO plugin is loaded from the provider info (the ``airflow.plugins`` entry point covers the
default setting; ``tests/contract`` checks that route).

Every module here returns the same config, so they share one instance (started once, after the modules of
``tests/e2e`` that use the default config).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brevfake.control import BrevWorld
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, StandaloneConfig
from tests.integration.brev.conftest import brev_connection
from tests.integration.docker.conftest import DockerEngine, docker_engine  # noqa: F401  (the shared engine)

REPO = Path(__file__).resolve().parents[3]
UI_DAGS = Path(__file__).resolve().parent / "dags"
DOCKER_CONN_ID = "tao_ui_docker"
BREV_CONN_ID = "tao_ui_brev"
#: The DAGs every module here needs parsed and unpaused.
DAG_IDS = (
    "tao_quickstart",
    "tao_retraining_train",
    "tao_retraining_evaluate",
    "tao_ui_two_platforms",
    "tao_ui_cancel",
    "tao_ui_orphan",
    "tao_ui_brev",
    "tao_ui_brev_lease",
)


@pytest.fixture(scope="session")
def ui_results_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-docker-results")


@pytest.fixture(scope="session")
def ui_brev_world(
    docker_engine: DockerEngine,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BrevWorld]:
    """The fake Brev world of the standalone's ``tao_ui_brev`` connection (its containers removed at the end)."""
    BrevWorld.sweep_orphans(docker_engine.host)
    world = BrevWorld.create(tmp_path_factory.mktemp("ui-brev") / "world", docker_engine.host)
    try:
        yield world
    finally:
        world.teardown()


@pytest.fixture(scope="module")
def airflow_standalone_config(
    docker_engine: DockerEngine,  # noqa: F811
    ui_results_root: Path,
    ui_brev_world: BrevWorld,
) -> StandaloneConfig:
    docker_conn = {
        "conn_type": "tao_docker",
        "host": docker_engine.host,
        "extra": {"results_root": str(ui_results_root), "network": "tao_ci", "cancel_grace_seconds": 2},
    }
    return StandaloneConfig(
        dags_folder=REPO / "example_dags",
        extra_dag_files=(UI_DAGS / "tao_ui_e2e.py",),
        extra_env={
            f"AIRFLOW_CONN_{DOCKER_CONN_ID.upper()}": json.dumps(docker_conn),
            f"AIRFLOW_CONN_{BREV_CONN_ID.upper()}": brev_connection(ui_brev_world),
            "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
            # the worker's visible GPUs for the local platform (no GPU is used: the jobs just run on the CPU)
            "CUDA_VISIBLE_DEVICES": "0,1",
        },
    )


@pytest.fixture(scope="module")
def ui_dags(airflow_standalone: AirflowStandalone) -> Iterator[AirflowClient]:
    """The client, once the DAGs are parsed and unpaused."""
    client = airflow_standalone.client
    for dag_id in DAG_IDS:
        client.wait_for_dag(dag_id, timeout=120)
        client.unpause_dag(dag_id)
    yield client


def airflow_cli(instance: AirflowStandalone, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``airflow <args>`` with the instance's environment (its database, connections and settings)."""
    return subprocess.run(
        [instance.airflow_bin, *args],
        env=instance.env,
        cwd=instance.home,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli_json(instance: AirflowStandalone, *args: str) -> Any:
    return cli_json_run(instance, *args)[0]


def cli_json_run(instance: AirflowStandalone, *args: str) -> tuple[Any, subprocess.CompletedProcess[str]]:
    """``airflow <args> -o json``: its JSON answer, and the whole run (what it printed besides)."""
    proc = airflow_cli(instance, *args, "-o", "json")
    assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc

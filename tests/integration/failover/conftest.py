"""Fixtures for capacity failover across platforms: the platforms' own backends and fixtures, shared, plus one
connection per platform with short capacity bounds (``tao_fo_*``), so a failover takes seconds, not minutes.

Backends (started by the platform fixtures this module imports, never copied): the Docker engine, the SLURM cluster,
the fake Kubernetes API server and the fake Lepton workspace (whose pods / replicas run on that engine), and a fresh
fake Brev world per test that asks for one. A missing backend is a test FAILURE, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.brev.conftest import brev_world  # noqa: F401  (a world per test)
from tests.integration.docker.conftest import (  # noqa: F401  (the shared engine)
    DockerEngine,
    docker_connection,
    docker_engine,
    results_root,
)
from tests.integration.kubernetes.conftest import KubeFake, kubefake, kubernetes_connection  # noqa: F401
from tests.integration.lepton.conftest import (  # noqa: F401
    LeptonFake,
    lepton_connection,
    lepton_fake,
    lepton_fake_factory,
)
from tests.integration.slurm.conftest import SlurmCluster, slurm_cluster, slurm_conn  # noqa: F401
from tests.integration.taskrun import Triggerer
from tests.statsd_server import StatsdServer

DOCKER = "tao_fo_docker"
KUBERNETES = "tao_fo_k8s"
LEPTON = "tao_fo_lepton"
#: The Lepton connection's own capacity bound (``capacity_timeout_seconds``): the platform gives up after it.
LEPTON_CAPACITY_SECONDS = 4


def _define(conn_id: str, value: str) -> None:
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = value


@pytest.fixture(scope="session")
def chain_connections(
    docker_engine: DockerEngine,  # noqa: F811
    results_root: Path,  # noqa: F811
    kubefake: KubeFake,  # noqa: F811
    lepton_fake: LeptonFake,  # noqa: F811
    slurm_conn: str,  # noqa: F811
) -> dict[str, str]:
    """Connections of every backend for the chains: platform name -> connection id."""
    _define(DOCKER, docker_connection(docker_engine, results_root))
    _define(KUBERNETES, kubernetes_connection(kubefake))
    _define(LEPTON, lepton_connection(lepton_fake, capacity_timeout_seconds=LEPTON_CAPACITY_SECONDS))
    return {"docker": DOCKER, "kubernetes": KUBERNETES, "lepton": LEPTON, "slurm": slurm_conn}


@pytest.fixture(scope="session")
def triggerer(chain_connections: dict[str, str], triggerer: Triggerer) -> Triggerer:
    """The session's triggerer loop, with the chain's connections defined first."""
    return triggerer


@pytest.fixture
def statsd() -> Iterator[StatsdServer]:
    """A StatsD server (a UDP socket) that this process's ``Stats`` sends to, configured as ``[metrics]`` would be."""
    with StatsdServer() as server, server.configure():
        yield server

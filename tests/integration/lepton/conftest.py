"""Fixtures for tests against the fake DGX Cloud Lepton workspace API (``tests/leptonfake``), whose replicas run
as real containers on the test Docker engine (``scripts/docker-up.sh``).

``lepton_fake`` (session scope) starts the server as its own process and defines the Airflow connection
``tao_lepton_ci`` (type ``tao_lepton``: the token in the password; ``workspace_id``, ``workspace_url`` and
``node_group`` = ``ng-lustre`` in the extras). Our code reaches the server only through the real ``leptonai``
client over HTTP. ``lepton_fake_factory`` starts more servers with other options (``--id-mode suffix``, another
world through ``--config``, ``--sim``); ``lepton_sim`` is a simulated one for benchmarks. A server that does not
start is a test FAILURE, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.docker.conftest import DockerEngine, docker_engine  # noqa: F401  (the shared engine)
from tests.integration.taskrun import Triggerer
from tests.leptonfake.control import FakeDidNotStart, LeptonFake, start_server, stop_server

CONN_ID = "tao_lepton_ci"
NODE_GROUP = "ng-lustre"  # the connection's default node group (by name; its id differs)

__all__ = ["CONN_ID", "NODE_GROUP", "LeptonFake", "lepton_connection"]


def lepton_connection(fake: LeptonFake, **extra: Any) -> str:
    """An Airflow connection (JSON) of type tao_lepton on this fake."""
    base = {"workspace_id": fake.workspace_id, "workspace_url": fake.workspace_url, "node_group": NODE_GROUP}
    return json.dumps({"conn_type": "tao_lepton", "password": fake.token, "extra": {**base, **extra}})


@pytest.fixture(scope="session")
def lepton_fake_factory(
    docker_engine: DockerEngine,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., LeptonFake]]:
    """``start(*args)`` -> a new fake server (stopped at the end of the session), e.g. ``start("--id-mode",
    "suffix")``, ``start("--sim")`` or ``start("--config", json.dumps({"settings": {...}, "world": {...}}))``."""
    started: list[tuple[subprocess.Popen[bytes], LeptonFake]] = []

    def start(*args: str) -> LeptonFake:
        try:
            proc, fake = start_server(tmp_path_factory.mktemp("leptonfake"), *args, docker_host=docker_engine.host)
        except FakeDidNotStart as exc:
            pytest.fail(str(exc))
        started.append((proc, fake))
        return fake

    yield start
    for proc, fake in started:
        stop_server(proc, fake)


@pytest.fixture(scope="session")
def lepton_fake(lepton_fake_factory: Callable[..., LeptonFake]) -> LeptonFake:
    """The fake workspace (replicas on the real engine) and the connection ``tao_lepton_ci``."""
    fake = lepton_fake_factory()
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = lepton_connection(fake)
    return fake


@pytest.fixture(scope="session")
def lepton_sim(lepton_fake_factory: Callable[..., LeptonFake]) -> LeptonFake:
    """A fake whose replicas are simulated (each "runs" 30 s and prints a line a second): no containers."""
    return lepton_fake_factory("--sim")


@pytest.fixture(scope="session")
def triggerer(lepton_fake: LeptonFake, triggerer: Triggerer) -> Triggerer:
    """The session's triggerer loop, with the Lepton connection defined first."""
    return triggerer

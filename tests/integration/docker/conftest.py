"""Fixtures for tests against a REAL Docker engine, started by ``scripts/docker-up.sh``.

``docker_engine`` (session scope) runs ``scripts/docker-up.sh`` -- which installs ``docker.io`` when missing, starts a
private dockerd (own socket, data root and pid file, also listening on loopback TCP, live-restore on, a stub
``nvidia-container-runtime-hook`` on its PATH) and builds the test images locally -- then parses its ``env.sh``.
A missing or broken engine is a test FAILURE, never a skip. The containers this provider made are removed at the end
(but for the job containers on fake Brev instances, which their world removes);
the engine itself is stopped by ``scripts/test.sh`` (``scripts/docker-down.sh``, by pid).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.shared import container as ct
from tests.integration.taskrun import Triggerer

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCKER_UP = REPO_ROOT / "scripts" / "docker-up.sh"
DOCKER_CI_ROOT = Path(os.environ.get("DOCKER_CI_ROOT", "/var/tmp/docker-ci"))
UP_TIMEOUT_S = 1800  # a cold machine installs docker.io and debootstraps the python image first
CONN_ID = "tao_docker_ci"


@dataclass(frozen=True)
class DockerEngine:
    """The private engine: its URLs, its images, and what the tests ask it directly."""

    host: str  # unix:///var/tmp/docker-ci/docker.sock
    tcp: str  # tcp://127.0.0.1:2376, the same daemon
    busybox: str  # plain commands (sh, no bash, no python)
    python: str  # Debian + python3 + boto3 + yaml: the in-job runner

    @property
    def client(self) -> Any:
        import docker

        return docker.APIClient(base_url=self.host, version="auto", timeout=60)

    def containers(self, *labels: str) -> list[dict[str, Any]]:
        """This provider's containers (any state) with these labels, asked of the daemon itself."""
        filters = {"label": [f"{ct.LABEL_MANAGED}=true", *labels]}
        return list(self.client.containers(all=True, filters=filters))

    def named(self, job_name: str) -> list[dict[str, Any]]:
        return self.containers(f"{ct.LABEL_NAME}={job_name}")

    def state(self, job_id: str) -> dict[str, Any]:
        return dict(self.client.inspect_container(f"tao-job-{job_id}")["State"])

    def logs(self, job_id: str) -> str:
        return bytes(self.client.logs(f"tao-job-{job_id}")).decode()

    def oom_logged(self, job_id: str) -> bool:
        """Whether the daemon's event log holds an ``oom`` event of the job's container."""
        state = self.state(job_id)
        since = ct.docker_time(state["StartedAt"]) or 0.0
        events = self.client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                                    filters={"container": f"tao-job-{job_id}", "event": "oom"})  # fmt: skip
        try:
            return any(True for _ in events)
        finally:
            events.close()

    def wait_exited(self, job_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (state := self.state(job_id))["Status"] not in ("exited", "dead"):
            assert time.monotonic() < deadline, f"container of {job_id} still {state['Status']} after {timeout} s"
            time.sleep(0.2)
        return state

    def wait_running(self, job_id: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.state(job_id)["Status"] != "running":
            assert time.monotonic() < deadline, f"container of {job_id} not running after {timeout} s"
            time.sleep(0.1)

    def dockerd_pid(self) -> int:
        return int((DOCKER_CI_ROOT / "dockerd.pid").read_text())

    def stop_daemon(self, timeout: float = 30) -> None:
        """Stop dockerd (SIGTERM, as a service manager does); live-restore keeps the containers running."""
        pid = self.dockerd_pid()
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists(), "dockerd did not stop"

    def start_daemon(self) -> None:
        _run_docker_up()


def _run_docker_up() -> None:
    argv = ["bash", str(DOCKER_UP)]
    if os.geteuid() != 0:
        argv = ["sudo", "-n", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=UP_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        pytest.fail(f"scripts/docker-up.sh failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def remove_containers_under(engine: DockerEngine, root: Path) -> None:
    """This provider's job containers whose results folder is under ``root`` -- one test session's, never another
    session's running on the same engine (nor a fake Brev instance's: its world removes those)."""
    for container in engine.containers():
        labels = container.get("Labels") or {}
        if "brevfake.on-instance" not in labels and labels.get(ct.LABEL_RESULTS_DIR, "").startswith(f"{root}/"):
            engine.client.remove_container(container["Id"], force=True)


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    """The private Docker engine, started (and its images built) if it is not up; at the end, this session's job
    containers are removed."""
    _run_docker_up()
    env = _read_env(DOCKER_CI_ROOT / "env.sh")
    engine = DockerEngine(
        host=env["DOCKER_CI_HOST"],
        tcp=env["DOCKER_CI_TCP"],
        busybox=env["DOCKER_CI_BUSYBOX"],
        python=env["DOCKER_CI_PYTHON"],
    )
    version = engine.client.version()
    assert version.get("ApiVersion"), version
    yield engine
    remove_containers_under(engine, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def results_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The connection's results_root: a folder on the daemon's host (this machine) mounted into every job."""
    return tmp_path_factory.mktemp("docker-results")


def docker_connection(engine: DockerEngine, results_root: Path, **extra: Any) -> str:
    """An Airflow connection (JSON) of type tao_docker on the test engine."""
    base = {"results_root": str(results_root), "network": "tao_ci", "cancel_grace_seconds": 5}
    return json.dumps({"conn_type": "tao_docker", "host": engine.host, "extra": {**base, **extra}})


@pytest.fixture(scope="session")
def docker_conn(docker_engine: DockerEngine, results_root: Path) -> str:
    """The connection ``tao_docker_ci`` for the operator, hooks and triggers."""
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = docker_connection(docker_engine, results_root)
    return CONN_ID


@pytest.fixture(scope="session")
def triggerer(docker_conn: str, triggerer: Triggerer) -> Triggerer:
    """The session's triggerer loop, with the Docker connection defined first."""
    return triggerer


@pytest.fixture(autouse=True)
def _docker_connection_defined(docker_conn: str) -> None:
    """Every test here may build an operator on ``tao_docker_ci``."""

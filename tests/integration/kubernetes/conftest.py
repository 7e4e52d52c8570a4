"""Fixtures for tests against the fake Kubernetes API server (``tests/kubefake``), whose kubelet runs every pod
as a real container on the test Docker engine (``scripts/docker-up.sh``).

``kubefake`` (session scope) starts the server as its own process, writes a kubeconfig pointing at it, creates the
results PersistentVolumeClaim through the real ``kubernetes`` client, and defines the connection ``tao_k8s_ci``
(type ``tao_kubernetes``). Our code reaches the server only through the cncf-kubernetes provider's hooks over HTTP.
A server that does not start is a test FAILURE, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.shared import container as ct
from tests.fakeserver import stop_process
from tests.integration.docker.conftest import DockerEngine, docker_engine  # noqa: F401  (the shared engine)
from tests.integration.taskrun import Triggerer

REPO_ROOT = Path(__file__).resolve().parents[3]
CONN_ID = "tao_k8s_ci"
NAMESPACE = "default"
RESULTS_PVC = "tao-results"


@dataclass(frozen=True)
class KubeFake:
    """The running fake: its URL, kubeconfig, and what the tests ask it directly (never through our hook)."""

    url: str
    kubeconfig: Path
    workdir: Path

    def _fake(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}/fake/{path}", data=data, method="POST" if data else "GET")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def objects(self) -> dict[str, list[str]]:
        """Names of every object on the server, by resource (events, nodes and namespaces apart)."""
        return dict(self._fake("objects"))

    def created(self, resource: str = "jobs") -> list[dict[str, Any]]:
        """Every object of ``resource`` ever created on the server, deleted ones too, oldest first."""
        return [entry for entry in self._fake("created") if entry["resource"] == resource]

    def objects_of(self, job_id: str) -> dict[str, list[str]]:
        """The objects that belong to one job (its Job, pods, Secrets, ConfigMaps, Service), by resource."""
        labelled = {
            "jobs": self.api("batch").list_namespaced_job,
            "pods": self.api().list_namespaced_pod,
            "secrets": self.api().list_namespaced_secret,
            "configmaps": self.api().list_namespaced_config_map,
            "services": self.api().list_namespaced_service,
        }
        found = {}
        for resource, call in labelled.items():
            items = call(NAMESPACE, label_selector=f"{ct.LABEL_JOB_ID}={job_id}").items
            if resource == "pods":  # pods carry the job's labels through its template
                items = [p for p in items if p.metadata.labels.get(ct.LABEL_JOB_ID) == job_id]
            if items:
                found[resource] = [i.metadata.name for i in items]
        return found

    def stats(self, reset: bool = False) -> dict[str, Any]:
        return dict(self._fake("stats", {} if reset else None))

    def faults(self, status: int, seconds: float) -> None:
        self._fake("faults", {"status": status, "seconds": seconds})

    def evict(self, pod: str) -> None:
        self._fake("evict", {"namespace": NAMESPACE, "pod": pod})

    def api(self, group: str = "core") -> Any:
        from kubernetes import client, config

        api_client = config.new_client_from_config(str(self.kubeconfig))
        return client.BatchV1Api(api_client) if group == "batch" else client.CoreV1Api(api_client)

    def jobs_named(self, name: str) -> list[Any]:
        return [j for j in self.api("batch").list_namespaced_job(NAMESPACE).items if j.metadata.name == name]

    def pods_of(self, name: str) -> list[Any]:
        return list(self.api().list_namespaced_pod(NAMESPACE, label_selector=f"job-name={name}").items)

    def wait_running(self, name: str, timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [p for p in self.pods_of(name) if p.status.phase == "Running"]
            if running:
                return running[0]
            time.sleep(0.2)
        raise AssertionError(f"no pod of {name} running after {timeout} s")

    def wait_gone(self, job_id: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while (left := self.objects_of(job_id)) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not left, f"objects of job {job_id} left after {timeout} s: {left}"

    @property
    def results_dir(self) -> Path:
        """The results PVC's folder on this machine (the fake's volumes are host folders)."""
        return self.workdir / "pvc" / NAMESPACE / RESULTS_PVC


def start_kubefake(engine_host: str, tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], KubeFake]:
    """Start ``python -m tests.kubefake`` and wait until it answers."""
    ready = tmp / "kubefake.ready"
    log = (tmp / "kubefake.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.kubefake", "--ready-file", str(ready), "--docker-host", engine_host, *extra],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the fake Kubernetes API server did not start:\n{(tmp / 'kubefake.log').read_text()[-3000:]}")
        time.sleep(0.1)
    info = json.loads(ready.read_text())
    url = f"http://127.0.0.1:{info['port']}"
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "ci", "namespace": NAMESPACE}}],
                "users": [{"name": "ci", "user": {"token": "kubefake-token"}}],
            }
        )
    )
    return proc, KubeFake(url, kubeconfig, Path(os.environ.get("TMPDIR", "/tmp")) / f"kubefake-{info['pid']}")


def kubernetes_connection(fake: KubeFake, **extra: Any) -> str:
    base = {
        "kube_config_path": str(fake.kubeconfig),
        "namespace": NAMESPACE,
        "results_pvc": RESULTS_PVC,
        "cancel_grace_seconds": 2,
    }
    return json.dumps({"conn_type": "tao_kubernetes", "extra": {**base, **extra}})


@pytest.fixture(scope="session")
def kubefake(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeFake]:  # noqa: F811
    """The fake API server (pods on the real engine), its results PVC and the connection ``tao_k8s_ci``."""
    tmp = tmp_path_factory.mktemp("kubefake")
    # OpenShift's default admission chain: a hook that sets blockOwnerDeletion cannot submit anything
    proc, fake = start_kubefake(docker_engine.host, tmp, "--owner-references-permission-enforcement")
    try:
        fake.api().create_namespaced_persistent_volume_claim(
            NAMESPACE,
            {
                "metadata": {"name": RESULTS_PVC},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
            },
        )
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = kubernetes_connection(fake)
        yield fake
    finally:
        stop_process(proc, tmp / "kubefake.log", "the fake Kubernetes API server")


@pytest.fixture(scope="session")
def triggerer(kubefake: KubeFake, triggerer: Triggerer) -> Triggerer:
    """The session's triggerer loop, with the Kubernetes connection defined first."""
    return triggerer


@pytest.fixture(autouse=True)
def client_signatures_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every call our code makes goes through the clients' public signatures: a keyword argument a generated API
    method does not declare raises ``ApiTypeError`` before any request (so the fake never sees it), and the log and
    status paths may catch it -- any such error raised during a test, in the worker or the triggerer, fails it."""
    import kubernetes.client.exceptions as sync_errors
    import kubernetes_asyncio.client.exceptions as async_errors

    raised: list[str] = []
    for module in (sync_errors, async_errors):
        original = module.ApiTypeError.__init__

        def recording(self: Any, msg: str, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            raised.append(msg)
            __original(self, msg, *args, **kwargs)

        monkeypatch.setattr(module.ApiTypeError, "__init__", recording)
    yield
    assert not raised, f"a client call outside the client's signature: {raised}"

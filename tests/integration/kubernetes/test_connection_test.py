"""The connection form's Test button (``test_connection``) against the fake API server driven by the real
``kubernetes`` client: success, a refused token (401, as the real server answers), a namespace that does not exist
(404) and no server -- each in words, no secret in the answer. The fake checks bearer tokens here (``--token``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.hooks.ownership import CancelOutcome
from tests.e2e.airflow_harness import free_ports
from tests.fakeserver import stop_process
from tests.integration.kubernetes.conftest import KubeFake, start_kubefake

pytestmark = pytest.mark.integration
TOKEN = "kubefake-token"  # what start_kubefake's kubeconfig presents


@pytest.fixture(scope="module")
def guarded_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeFake]:
    """A fake API server (simulated pods: no container runs) that wants ``Bearer kubefake-token``."""
    tmp = tmp_path_factory.mktemp("kubefake-auth")
    proc, fake = start_kubefake("unix:///nonexistent", tmp, "--runtime", "sim", "--token", TOKEN)
    try:
        yield fake
    finally:
        stop_process(proc, tmp / "kubefake.log", "the fake Kubernetes API server")


def _kubeconfig(fake: KubeFake, tmp_path: Path, *, token: str = TOKEN, server: str | None = None) -> Path:
    config = json.loads(fake.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = token
    config["clusters"][0]["cluster"]["server"] = server or fake.url
    path = tmp_path / f"kubeconfig-{len(list(tmp_path.iterdir()))}"
    path.write_text(json.dumps(config))
    return path


def _test(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path, namespace: str = "default") -> tuple[bool, str]:
    conn = {"conn_type": "tao_kubernetes", "extra": {"kube_config_path": str(kubeconfig), "namespace": namespace}}
    monkeypatch.setenv("AIRFLOW_CONN_TAO_K8S_TEST", json.dumps(conn))
    return TAOKubernetesHook(conn_id="tao_k8s_test").test_connection()


def test_success_names_the_version_and_namespace(
    guarded_fake: KubeFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ok, message = _test(monkeypatch, _kubeconfig(guarded_fake, tmp_path))
    assert ok, message
    assert message == "Kubernetes v1.33.0-kubefake: Jobs in namespace default can be listed"


def test_a_refused_token_is_authentication_refused(
    guarded_fake: KubeFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ok, message = _test(monkeypatch, _kubeconfig(guarded_fake, tmp_path, token="expired-token-xyz"))
    assert not ok
    assert message.startswith("Authentication refused: the API server refused the credentials (401)"), message
    assert "expired-token-xyz" not in message


def test_a_missing_namespace_is_not_found(
    guarded_fake: KubeFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ok, message = _test(monkeypatch, _kubeconfig(guarded_fake, tmp_path), namespace="ml-training")
    assert not ok
    assert message.startswith("Not found: namespace ml-training does not exist (404)"), message


def test_no_server_is_unreachable(guarded_fake: KubeFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_ports(1)[0]}"
    ok, message = _test(monkeypatch, _kubeconfig(guarded_fake, tmp_path, server=closed))
    assert not ok
    assert message.startswith("Unreachable: the Kubernetes API server does not answer"), message


def test_active_jobs_are_listed_until_canceled(
    guarded_fake: KubeFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``list_active_jobs`` -- what ``airflow tao reap`` asks: this provider's Jobs that have not finished."""
    import uuid

    from airflow_provider_tao.jobs import JobSpec

    _test(monkeypatch, _kubeconfig(guarded_fake, tmp_path))  # defines the connection
    hook = TAOKubernetesHook(conn_id="tao_k8s_test")
    jobs = [
        hook.create_job(JobSpec(name=f"reap-{i}-{uuid.uuid4().hex[:6]}", job_id=uuid.uuid4().hex[:12],
                                command="sleep 300", gpu_count=0, image="busybox:1"))
        for i in range(2)
    ]  # fmt: skip
    listed = {h.job_id: h for h in hook.list_active_jobs()}
    assert {h.job_id for h in jobs} <= set(listed)
    assert listed[jobs[0].job_id].name == jobs[0].name
    assert hook.cancel_job(jobs[0], requested_by="reap: test") is CancelOutcome.STOPPED
    assert jobs[0].job_id not in {h.job_id for h in hook.list_active_jobs()}
    hook.cancel_job(jobs[1])

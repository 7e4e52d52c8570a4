"""OwnerReferencesPermissionEnforcement's first check against a role that may create a Job's Secret but not delete it
(issue 32 point 7): kubefake refuses the owned Secret as ``gcPermissionsEnforcement.Admit`` does ("cannot set an
ownerRef on a resource you can't delete"), the task's error and the connection's Test button name the permission.
A simulated fake (no container runs) whose user lacks ``delete`` on secrets (``--deny delete:secrets``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_tao.hooks.base import JobSubmitError
from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.jobs import ErrClass, JobSpec
from tests.fakeserver import stop_process
from tests.integration.kubernetes.conftest import NAMESPACE, KubeFake, kubernetes_connection, start_kubefake

pytestmark = pytest.mark.integration
CONN = "tao_k8s_no_delete"


@pytest.fixture(scope="module")
def no_delete_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeFake]:
    tmp = tmp_path_factory.mktemp("kubefake-rbac")
    proc, fake = start_kubefake("unix:///nonexistent", tmp, "--runtime", "sim",
                                "--owner-references-permission-enforcement", "--deny", "delete:secrets")  # fmt: skip
    try:
        yield fake
    finally:
        stop_process(proc, tmp / "kubefake.log", "the fake Kubernetes API server")


@pytest.fixture
def hook(no_delete_fake: KubeFake, monkeypatch: pytest.MonkeyPatch) -> TAOKubernetesHook:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", kubernetes_connection(no_delete_fake))
    return TAOKubernetesHook(conn_id=CONN)


def test_a_secret_owned_by_the_job_needs_delete_on_secrets_and_the_task_says_so(
    no_delete_fake: KubeFake, hook: TAOKubernetesHook
) -> None:
    # the fake itself: the plain create works, the owned one is refused by admission
    api = no_delete_fake.api()
    name = f"plain-{uuid.uuid4().hex[:6]}"
    api.create_namespaced_secret(NAMESPACE, {"metadata": {"name": name}, "stringData": {"k": "v"}})
    spec = JobSpec(name=f"owned-{uuid.uuid4().hex[:8]}", job_id=uuid.uuid4().hex[:12], command="true",
                   image="busybox:1", gpu_count=0, secret_env={"HF_TOKEN": "hf-secret-value"})  # fmt: skip
    with pytest.raises(JobSubmitError) as refused:
        hook.create_job(spec)
    said = str(refused.value)
    assert "cannot set an ownerRef on a resource you can't delete" in said, said
    assert "needs `delete` on secrets" in said and "hf-secret-value" not in said
    assert refused.value.err_class is ErrClass.ERR_AUTH
    assert spec.name not in no_delete_fake.objects().get("jobs", [])  # the suspended Job went with the refusal


def test_the_test_button_names_the_missing_permission(hook: TAOKubernetesHook) -> None:
    ok, message = hook.test_connection()
    assert not ok and "delete secrets" in message, message
    assert "delete configmaps" not in message  # only what is missing


def test_the_fake_answers_access_reviews_from_its_deny_list(no_delete_fake: KubeFake) -> None:
    from kubernetes import client

    api = client.AuthorizationV1Api(no_delete_fake.api().api_client)
    for verb, allowed in (("delete", False), ("create", True)):
        body = {"spec": {"resourceAttributes": {"namespace": NAMESPACE, "verb": verb, "resource": "secrets"}}}
        answer = json.loads(api.create_self_subject_access_review(body, _preload_content=False).data)
        assert answer["status"]["allowed"] is allowed, answer

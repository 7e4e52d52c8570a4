"""The Role an admin approves (``docs/k8s/rbac.yaml``, issue 36 point 2), applied by the fake API server's RBAC
authorizer (``tests/kubefake/rbac.py``): a whole multi-node job -- the Test button, submission, status, log,
outputs, cleanup -- runs with exactly its rules, and a verb outside them is refused with the permission named in
what the user reads."""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk.exceptions import AirflowException

from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobSpec
from tests.integration.docker.conftest import DockerEngine
from tests.integration.kubernetes.conftest import CONN_ID, NAMESPACE, KubeFake
from tests.integration.taskrun import Triggerer, finish, make_operator, start

pytestmark = pytest.mark.integration

MANIFESTS = Path(__file__).resolve().parents[3] / "docs" / "k8s"


def _role_rules() -> list[dict[str, Any]]:
    (role,) = [doc for doc in yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text()) if doc["kind"] == "Role"]
    return list(role["rules"])


def _apply(fake: KubeFake, rules: list[dict[str, Any]] | None) -> None:
    request = urllib.request.Request(f"{fake.url}/fake/role", data=json.dumps({"rules": rules}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


@pytest.fixture
def role(kubefake: KubeFake) -> Iterator[Any]:
    """Apply rules (the Role's by default) for one test; every request is authorized again afterwards."""
    yield lambda rules=None: _apply(kubefake, _role_rules() if rules is None else rules)
    _apply(kubefake, None)


def _without(rules: list[dict[str, Any]], resource: str, verb: str) -> list[dict[str, Any]]:
    return [
        {**rule, "verbs": [v for v in rule["verbs"] if v != verb]} if resource in rule["resources"] else rule
        for rule in rules
    ]


def test_a_multi_node_job_runs_start_to_cleanup_with_exactly_the_roles_rules(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, role: Any
) -> None:
    role()
    hook = TAOKubernetesHook(CONN_ID)
    ok, message = hook.test_connection()  # the namespace read is refused (no Role grants it): the list answers
    assert ok, message
    op = make_operator(
        CONN_ID,
        image=docker_engine.python,
        command="mkdir -p /work/out && echo rank $NODE_RANK > /work/out/rank-$NODE_RANK.txt && echo trained",
        num_nodes=2,  # an Indexed Job and its headless Service
        outputs=["/work/out"],  # the job's files (ConfigMaps) and the results PVC
    )
    result = finish(start(triggerer, op))
    assert result["state"] == "Complete", result
    written = kubefake.results_dir / result["outputs"]["/work/out"].removeprefix("/results/")
    assert (written / "rank-0.txt").read_text() == "rank 0\n"  # on the results PVC

    # a cancel (suspend: patch) and the cleanup that deletes the canceled Job (delete on jobs)
    hook.load_connection()
    spec = JobSpec(name=f"rbac-{secrets.token_hex(4)}", job_id=secrets.token_hex(6), command="sleep 300",
                   image=docker_engine.python, gpu_count=0)  # fmt: skip
    handle = hook.create_job(spec)
    assert hook.cancel_job(handle, requested_by="cli:admin") is CancelOutcome.STOPPED
    hook.cleanup_job(handle)
    _apply(kubefake, None)  # the test's own look (it lists Secrets) is no part of the Role
    kubefake.wait_gone(spec.job_id)  # the Job, and what it owns through the garbage collector


def test_a_verb_outside_the_role_is_refused_and_the_error_names_the_permission(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, role: Any
) -> None:
    role(_without(_role_rules(), "configmaps", "create"))
    op = make_operator(CONN_ID, image=docker_engine.python, command="echo never", outputs=["/work/out"])
    with pytest.raises(AirflowException) as refused:
        start(triggerer, op)
    assert f'cannot create resource "configmaps" in API group "" in the namespace "{NAMESPACE}"' in str(
        refused.value
    ), str(refused.value)

    role(_without(_role_rules(), "jobs", "list"))
    ok, message = TAOKubernetesHook(CONN_ID).test_connection()
    assert not ok and message.startswith("Permission denied:"), message
    assert f'cannot list resource "jobs" in API group "batch" in the namespace "{NAMESPACE}"' in message

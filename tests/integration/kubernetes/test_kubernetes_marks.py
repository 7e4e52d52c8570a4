"""Ownership marks on the fake API server: a mark meant for one try's Job never lands on another try's Job of the same
name (retries share the deterministic name), and the JSON patches that guard them are answered as kube-apiserver
answers them (tests/FIDELITY.md)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from airflow_provider_tao.hooks.base import MARK_CANCEL, MARK_CANCELED_BY, MARK_OWNER
from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.hooks.kubernetes.marks import JSON_PATCH, mark_annotation
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState, JobStatus
from tests.integration.docker.conftest import DockerEngine
from tests.integration.kubernetes.conftest import CONN_ID, NAMESPACE, KubeFake

pytestmark = pytest.mark.integration

_CANCEL_MARKS = {mark_annotation(MARK_CANCEL), mark_annotation(MARK_CANCELED_BY)}


@pytest.fixture
def hook(kubefake: KubeFake) -> TAOKubernetesHook:
    hook = TAOKubernetesHook(CONN_ID)
    hook.load_connection()
    return hook


def _parked_job(kubefake: KubeFake, name: str, job_id: str, annotations: dict[str, str] | None) -> JobHandle:
    """A suspended Job (no pods) labelled as ``job_id``'s, created straight on the server -- once the job controller
    has written its ``Suspended`` condition (a status write changes the resourceVersion the tests compare)."""
    metadata: dict[str, Any] = {"name": name, "labels": {ct.LABEL_JOB_ID: job_id, ct.LABEL_MANAGED: "true"}}
    if annotations is not None:
        metadata["annotations"] = annotations
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "tao", "image": "busybox"}]}}
    batch = kubefake.api("batch")
    body = {"metadata": metadata, "spec": {"suspend": True, "template": template}}
    job = batch.create_namespaced_job(NAMESPACE, body)
    deadline = time.monotonic() + 180
    while not [c for c in batch.read_namespaced_job(name, NAMESPACE).status.conditions or [] if c.type == "Suspended"]:
        assert time.monotonic() < deadline, f"the job controller never marked Job {name} Suspended"
        time.sleep(0.1)
    return JobHandle(platform="kubernetes", conn_id=CONN_ID, job_id=job_id, name=name,
                     backend_job_id=job.metadata.uid, results_dir="/results", try_number=2)  # fmt: skip


def _annotations(kubefake: KubeFake, name: str) -> dict[str, str]:
    return dict(kubefake.jobs_named(name)[0].metadata.annotations or {})


async def _awrite(hook: TAOKubernetesHook, handle: JobHandle, key: str, value: Any) -> None:
    try:
        await hook.awrite_mark(handle, key, value)
    finally:
        await hook.aclose()


def test_a_persons_cancel_of_a_replaced_job_neither_marks_nor_stops_the_retrys_job_of_its_name(
    docker_engine: DockerEngine, kubefake: KubeFake, hook: TAOKubernetesHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the explorer (the flaky job, cli_cancel at ``execute:create_job#2``): ``airflow tao cancel`` read the
    task's recorded Job as not ended, then the retry replaced it with its own Job of the same name before the cancel
    wrote ``canceled_by`` -- a mark written by name landed on the retry's Job, which then failed ERR_CANCELED. A mark
    now holds only on the Job whose job id the handle names (a JSON patch's ``test``, in the same request)."""
    spec = JobSpec(name=f"remark-{uuid.uuid4().hex[:8]}", job_id=uuid.uuid4().hex[:12], gpu_count=0,
                   command="sleep 300", image=docker_engine.busybox)  # fmt: skip
    first = hook.create_job(spec)
    retry: list[JobHandle] = []
    real_status = TAOKubernetesHook.get_job_status

    def replaced_after_the_read(self: TAOKubernetesHook, handle: JobHandle) -> JobStatus:
        status = real_status(self, handle)
        if not retry:  # the retry deletes the ended Job and creates its own under the name
            hook._delete(spec.name, first.backend_job_id)
            retry.append(hook.create_job(replace(spec, job_id=uuid.uuid4().hex[:12]), try_number=2))
        return status

    monkeypatch.setattr(TAOKubernetesHook, "get_job_status", replaced_after_the_read)
    assert hook.cancel_job(first, requested_by="cli:jdoe").over  # read running; nothing of it left to stop
    monkeypatch.undo()
    second = retry[0]
    assert hook.canceled_by(first) is None  # so the CLI reports "already ended: left as it was"
    assert not _CANCEL_MARKS & set(_annotations(kubefake, spec.name)), "the retry's Job carries the old Job's cancel"
    assert set(hook.read_marks(second)) <= {MARK_OWNER}  # its own claim only
    assert not kubefake.jobs_named(spec.name)[0].spec.suspend
    assert hook.get_job_status(second).state in (JobState.PENDING, JobState.RUNNING)
    assert hook.cancel_job(second) is CancelOutcome.STOPPED and hook.cleanup_job(second) is None
    kubefake.wait_gone(second.job_id)


def test_a_mark_is_written_only_on_the_job_its_handle_names_sync_and_async(
    kubefake: KubeFake, hook: TAOKubernetesHook
) -> None:
    """``write_mark`` / ``awrite_mark`` of a handle whose Job was replaced by another job's of the same name leave
    that Job unmarked; the other job's own handle marks it; a Job of ours with no annotations at all gets the map."""
    name = f"remark-{uuid.uuid4().hex[:8]}"
    newer = _parked_job(kubefake, name, uuid.uuid4().hex[:12], {"keep": "me"})
    older = replace(newer, job_id=uuid.uuid4().hex[:12], try_number=1)
    hook.write_mark(older, MARK_CANCELED_BY, "cli:jdoe")
    asyncio.run(_awrite(hook, older, MARK_CANCEL, 1))
    assert _annotations(kubefake, name) == {"keep": "me"}
    hook.write_mark(newer, MARK_OWNER, 2)
    asyncio.run(_awrite(hook, newer, MARK_CANCELED_BY, "cli:jdoe"))
    assert hook.read_marks(newer) == {MARK_OWNER: 2, MARK_CANCELED_BY: "cli:jdoe"}
    hook._delete(name, newer.backend_job_id)

    bare = _parked_job(kubefake, f"remark-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:12], None)
    hook.write_mark(bare, MARK_OWNER, 2)
    asyncio.run(_awrite(hook, bare, MARK_CANCEL, 2))
    assert hook.read_marks(bare) == {MARK_OWNER: 2, MARK_CANCEL: 2}
    hook._delete(bare.name, bare.backend_job_id)
    gone = replace(bare, job_id=uuid.uuid4().hex[:12])
    hook.write_mark(gone, MARK_OWNER, 3)  # no Job of the name: nothing kept, no error
    asyncio.run(_awrite(hook, gone, MARK_OWNER, 3))


def test_a_json_patch_that_does_not_apply_changes_nothing_and_is_422_invalid_without_the_librarys_words(
    kubefake: KubeFake,
) -> None:
    """kube-apiserver's answer to a JSON patch that does not apply (patch.go ``applyJSPatch``: evanphx/json-patch's
    error into ``NewGenericServerResponse(422, ...)``, which keeps no cause): a failed ``test``, an ``add`` under a
    missing parent, a ``remove`` of an absent key -- all alike, and nothing of the patch applied."""
    batch = kubefake.api("batch")
    handle = _parked_job(kubefake, f"patch-{uuid.uuid4().hex[:8]}", "a1", None)
    version = batch.read_namespaced_job(handle.name, NAMESPACE).metadata.resource_version
    refused = [
        [{"op": "add", "path": "/metadata/labels/x", "value": "1"},
         {"op": "test", "path": f"/metadata/labels/{ct.LABEL_JOB_ID.replace('/', '~1')}", "value": "b2"}],
        [{"op": "add", "path": "/metadata/annotations/x", "value": "1"}],
        [{"op": "remove", "path": "/metadata/labels/absent"}],
        [{"op": "test", "path": "/metadata/nothing/here", "value": None}],
    ]  # fmt: skip
    for ops in refused:
        with pytest.raises(ApiException) as caught:
            batch.patch_namespaced_job(handle.name, NAMESPACE, ops, _content_type=JSON_PATCH)
        assert caught.value.status == 422
        assert json.loads(caught.value.body) == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server rejected our request due to an error in our request", "reason": "Invalid",
            "details": {}, "code": 422,
        }  # fmt: skip
    assert batch.read_namespaced_job(handle.name, NAMESPACE).metadata.resource_version == version
    applied = [
        {"op": "test", "path": f"/metadata/labels/{ct.LABEL_JOB_ID.replace('/', '~1')}", "value": "a1"},
        {"op": "test", "path": "/metadata/annotations", "value": None},  # v4: an absent member tests equal to null
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}},
        {"op": "replace", "path": "/metadata/annotations/c", "value": "2"},  # v4: replace sets an absent member
        {"op": "remove", "path": "/metadata/annotations/a~1b"},
    ]
    job = batch.patch_namespaced_job(handle.name, NAMESPACE, applied, _content_type=JSON_PATCH)
    assert job.metadata.annotations == {"c": "2"}
    batch.delete_namespaced_job(handle.name, NAMESPACE, propagation_policy="Background")
